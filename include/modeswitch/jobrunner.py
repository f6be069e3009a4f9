"""What both spark-submit entrypoints do: parse ``--pipeline --epoch --config``, build the
session, run the epoch, stop the session. ``jobs/backlog_batch.py`` and ``jobs/stream.py``
are one line on top of this."""

from __future__ import annotations

import argparse
import logging
from typing import Literal

from modeswitch.config import PipelineSettings, load_job_settings
from modeswitch.errors import ModeswitchError
from modeswitch.session import create_spark_session

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JobKind = Literal["batch", "stream"]
log = logging.getLogger("modeswitch.jobs")


def _parse_arguments(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--pipeline", required=True, help="the pipeline id")
    parser.add_argument("--epoch", required=True, type=int, help="the epoch to run")
    parser.add_argument(
        "--config", required=True, help="resolved settings: a JSON/TOML file, or inline JSON"
    )
    return parser.parse_args(argv)


def job_spark_conf(kind: JobKind, settings: PipelineSettings) -> dict[str, str]:
    """The Spark conf a job's settings ask for, to be set before its driver JVM starts (by
    :func:`create_spark_session` when the job starts it, by spark-submit under Airflow)."""
    conf: dict[str, str] = {}
    if kind == "batch" and settings.batch_driver_memory:
        conf["spark.driver.memory"] = settings.batch_driver_memory
        # A fixed-size heap: taken at the start and never grown, whatever the backlog.
        conf["spark.driver.extraJavaOptions"] = f"-Xms{settings.batch_driver_memory}"
    return conf


def _create_spark_session(kind: JobKind, args: argparse.Namespace, settings: PipelineSettings):
    return create_spark_session(
        f"modeswitch-{args.pipeline}-{kind}-epoch-{args.epoch}",
        conf=job_spark_conf(kind, settings),
    )


def run(kind: JobKind, spark, args: argparse.Namespace, settings: PipelineSettings) -> None:
    if kind == "batch":
        from modeswitch.backlog import run_batch_epoch

        report = run_batch_epoch(spark, settings, args.epoch)
        log.info(
            "batch epoch %d: %d waves, %d records; committed %s",
            report.epoch,
            report.waves,
            report.records,
            report.committed,
        )
    else:
        from modeswitch.streaming import run_stream_epoch

        report = run_stream_epoch(spark, settings, args.epoch)
        log.info(
            "stream epoch %d stopped (%s) after %d micro-batches, %d records; end %s; next %s",
            report.epoch,
            report.reason,
            report.micro_batches,
            report.records,
            report.end,
            report.next_mode,
        )


def main(kind: JobKind, description: str, argv: list[str] | None = None) -> int:
    """Run one epoch; exit status 0 on success, 1 with a clear message on a modeswitch error
    (anything else propagates with its traceback). The session is stopped in every case."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    args = _parse_arguments(description, argv)
    spark = None
    try:
        # Read (and check) the settings first: some of them size the JVM the session starts.
        settings = load_job_settings(args.config, pipeline=args.pipeline)
        spark = _create_spark_session(kind, args, settings)
        run(kind, spark, args, settings)
        return 0
    except ModeswitchError as exc:
        log.error("%s epoch %d failed: %s", kind, args.epoch, exc)
        return 1
    finally:
        if spark is not None:
            spark.stop()
