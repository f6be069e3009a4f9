"""A fresh session that warms its Python workers (modeswitch.warmup), then runs a small
bucketlog -> modeswitch_delta stream (availableNow) and prints, as JSON, the command lines of
the Python processes that appeared while the stream ran.

A separate process, so that no earlier test has warmed the session's worker pools already.
"""

from __future__ import annotations

import argparse
import json
import sys

import psutil

from modeswitch.offsets import offsets_to_json
from modeswitch.session import create_spark_session
from modeswitch.warmup import start_worker_warmup


def python_processes() -> dict[int, str]:
    """Spark's Python processes under this driver: pid -> command line."""
    found = {}
    for child in psutil.Process().children(recursive=True):
        try:
            command = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "python" in command and "pyspark" in command:
            found[child.pid] = command
    return found


def run(spark, args: argparse.Namespace) -> list[str]:
    warmup = start_worker_warmup(spark, args.scratch, tasks=2)
    if warmup is not None and not (warmup.wait(300) and warmup.error is None):
        raise RuntimeError(f"the warm-up failed: {warmup.error}")
    before = python_processes()
    query = (
        spark.readStream.format("bucketlog")
        .option("startingOffsets", offsets_to_json({0: 0, 1: 0}))
        .option("numPartitions", "2")
        .load(args.log)
        .writeStream.format("modeswitch_delta")
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start(args.sink)
    )
    try:
        query.awaitTermination()
    finally:
        query.stop()
    return [cmd for pid, cmd in python_processes().items() if pid not in before]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    for name in ("--log", "--sink", "--checkpoint", "--scratch"):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)
    spark = create_spark_session("warm-then-stream", master="local[2]")
    try:
        print(json.dumps(run(spark, args)))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
