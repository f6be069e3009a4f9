"""spark-submit entrypoint: the pipeline's warm engine (:mod:`modeswitch.runners.engine`).

    spark-submit jobs/engine.py --pipeline orders --config settings.json --address-file PATH

Starts a session, listens on loopback, writes its address to PATH, warms up, then runs every
batch and stream epoch an epoch task hands it, one at a time, until SIGTERM.
"""

from __future__ import annotations

import sys

from modeswitch.runners.engine_server import main

if __name__ == "__main__":
    sys.exit(main())
