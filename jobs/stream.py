"""spark-submit entrypoint: run one stream epoch from its handoff offsets until it must stop.

    spark-submit jobs/stream.py --pipeline orders --epoch 8 --config settings.json

Stops cleanly between micro-batches when the policy says batch, a command asks for it, or
``max_stream_runtime`` is reached; exits non-zero with a clear message on failure.
"""

from __future__ import annotations

import sys

from modeswitch.runners.jobs import main

if __name__ == "__main__":
    sys.exit(main("stream", __doc__))
