"""spark-submit entrypoint: run one stream epoch from its handoff offsets until it must stop.

    spark-submit jobs/stream.py --pipeline orders --epoch 8 --config settings.json

Stops cleanly between micro-batches when the policy says batch, a command asks for it, or
``max_stream_runtime`` is reached; exits non-zero with a clear message on failure.
"""

from __future__ import annotations

import argparse
import logging
import sys

from modeswitch.config import load_job_settings
from modeswitch.errors import ModeswitchError
from modeswitch.session import create_spark_session
from modeswitch.streaming import run_stream_epoch

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
log = logging.getLogger("modeswitch.jobs.stream")


def _parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pipeline", required=True, help="the pipeline id")
    parser.add_argument("--epoch", required=True, type=int, help="the stream epoch to run")
    parser.add_argument(
        "--config", required=True, help="resolved settings: a JSON/TOML file, or inline JSON"
    )
    return parser.parse_args(argv)


def _create_spark_session(args: argparse.Namespace):
    return create_spark_session(f"modeswitch-{args.pipeline}-stream-epoch-{args.epoch}")


def run(spark, args: argparse.Namespace) -> int:
    report = run_stream_epoch(
        spark, load_job_settings(args.config, pipeline=args.pipeline), args.epoch
    )
    log.info(
        "stream epoch %d stopped (%s) after %d micro-batches, %d records; end %s; next %s",
        report.epoch,
        report.reason,
        report.micro_batches,
        report.records,
        report.end,
        report.next_mode,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = _parse_arguments(argv)
    spark = _create_spark_session(args)
    try:
        return run(spark, args)
    except ModeswitchError as exc:
        log.error("stream epoch %d failed: %s", args.epoch, exc)
        return 1
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
