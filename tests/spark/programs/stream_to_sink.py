"""A tiny streaming job for the fault tests: bucketlog -> modeswitch_delta, availableNow.

Run as a separate process so that a test can SIGKILL its driver (and its JVM, by process
group) at a fault point, then run it again and check that the sink holds every record once.
"""

from __future__ import annotations

import argparse
import sys

from modeswitch.offsets import offsets_to_json
from modeswitch.runners.session import create_spark_session


def _parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--pipeline", default="faults")
    parser.add_argument("--epoch", type=int, default=1)
    parser.add_argument("--max-records-per-trigger", default="5000")
    return parser.parse_args(argv)


def run(spark, args: argparse.Namespace) -> None:
    start = offsets_to_json({0: 0, 1: 0, 2: 0})
    query = (
        spark.readStream.format("bucketlog")
        .option("startingOffsets", start)
        .option("maxRecordsPerTrigger", args.max_records_per_trigger)
        .load(args.log)
        .writeStream.format("modeswitch_delta")
        .option("checkpointLocation", args.checkpoint)
        .option("pipeline", args.pipeline)
        .option("epoch", str(args.epoch))
        .option("mode", "stream")
        .option("offsetsStart", start)
        .trigger(availableNow=True)
        .start(args.sink)
    )
    try:
        query.awaitTermination()
    finally:
        query.stop()


def main(argv: list[str] | None = None) -> int:
    args = _parse_arguments(argv)
    spark = create_spark_session("stream-to-sink", master="local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        run(spark, args)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
