"""spark-submit entrypoint: drain one batch epoch's backlog to its boundary, wave by wave.

    spark-submit jobs/backlog_batch.py --pipeline orders --epoch 7 --config settings.json

Exits non-zero with a clear message on any failure; every wave committed so far stays valid
and a rerun continues from the sink's committed offsets.
"""

from __future__ import annotations

import sys

from modeswitch.runners.jobs import main

if __name__ == "__main__":
    sys.exit(main("batch", __doc__))
