"""spark-submit entrypoint: run one backfill (an event-time window of the log, replaced in
the sink in one commit per table), recorded as a running ``backfill`` command.

    spark-submit jobs/backfill.py --pipeline orders --command 12 --config settings.json

Exits non-zero with a clear message on any failure; nothing is committed then, and a rerun
of the same command starts over (its commit replaces the window whatever is there).
"""

from __future__ import annotations

import sys

from modeswitch.runners.jobs import main

if __name__ == "__main__":
    sys.exit(main("backfill", __doc__))
