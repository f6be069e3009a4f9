"""spark-submit entrypoint: drain one batch epoch's backlog to its boundary, wave by wave.

    spark-submit jobs/backlog_batch.py --pipeline orders --epoch 7 --config settings.json

Exits non-zero with a clear message on any failure; every wave committed so far stays valid
and a rerun continues from the sink's committed offsets.
"""

from __future__ import annotations

import argparse
import logging
import sys

from modeswitch.backlog import run_batch_epoch
from modeswitch.config import load_job_settings
from modeswitch.errors import ModeswitchError
from modeswitch.session import create_spark_session

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
log = logging.getLogger("modeswitch.jobs.backlog_batch")


def _parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pipeline", required=True, help="the pipeline id")
    parser.add_argument("--epoch", required=True, type=int, help="the batch epoch to run")
    parser.add_argument(
        "--config", required=True, help="resolved settings: a JSON/TOML file, or inline JSON"
    )
    return parser.parse_args(argv)


def _create_spark_session(args: argparse.Namespace):
    return create_spark_session(f"modeswitch-{args.pipeline}-batch-epoch-{args.epoch}")


def run(spark, args: argparse.Namespace) -> int:
    report = run_batch_epoch(
        spark, load_job_settings(args.config, pipeline=args.pipeline), args.epoch
    )
    log.info(
        "batch epoch %d: %d waves, %d records; committed %s",
        report.epoch,
        report.waves,
        report.records,
        report.committed,
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
        log.error("batch epoch %d failed: %s", args.epoch, exc)
        return 1
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
