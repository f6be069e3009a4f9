"""Benchmark: the modeswitch_delta sink against Spark's native Parquet writer, same rows, same run.

    .venv/bin/python bench/bench_sink.py [--rows 10000000] [--runs 2]

Both writers get the same DataFrame (bucket, offset, event_time, key, value with a JSON
payload): ``--input generated`` builds it in the JVM with ``spark.range`` (cheap rows: the
writers dominate), ``--input bucketlog`` reads it from an embedded log through the
``bucketlog`` source, as the pipeline does. Each writer runs ``--runs`` times after one
warm-up write; the best run counts. Prints rows/s for each and the ratio sink / native.
Target: the sink at no less than 0.9 x native Parquet.

``--consume`` adds a third writer that only iterates the Arrow batches Spark hands to a Python
data source writer: the cost of the JVM -> Python hand-off alone, a floor no Python writer
can go under.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from deltalake import DeltaTable

from modeswitch.session import create_spark_session


def _parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--dir", default=None, help="scratch folder (default: a temp folder)")
    parser.add_argument("--conf", action="append", default=[], help="extra Spark conf k=v")
    parser.add_argument("--input", choices=("generated", "bucketlog"), default="generated")
    parser.add_argument("--consume", action="store_true", help="also time the hand-off alone")
    return parser.parse_args(argv)


def rows(spark, count: int, partitions: int):
    from pyspark.sql import functions as F

    return spark.range(0, count, numPartitions=partitions).select(
        (F.col("id") % 16).cast("int").alias("bucket"),
        F.col("id").alias("offset"),
        F.timestamp_micros(F.lit(1_790_000_000_000_000) + F.col("id") * 1000).alias("event_time"),
        F.concat(F.lit("user-"), (F.col("id") % 100_000).cast("string")).alias("key"),
        F.concat(
            F.lit('{"event_id": '),
            F.col("id").cast("string"),
            F.lit(', "user_id": '),
            (F.col("id") % 100_000).cast("string"),
            F.lit(', "action": "click", "amount": '),
            ((F.col("id") % 10_000) / 100).cast("string"),
            F.lit(', "country": "DE"}'),
        ).alias("value"),
    )


def log_rows(spark, count: int, scratch: Path):
    from modeswitch.produce import EventGenerator, produce_backlog
    from modeswitch.sources.segments import SegmentLog

    log = SegmentLog.create(str(scratch / "log"), buckets=16)
    produce_backlog(log, EventGenerator(seed=1, buckets=16, skew="zipf:1.1"), records=count)
    return spark.read.format("bucketlog").load(log.root)


class _Consume:
    """A Python data source writer that only reads the batches: the hand-off's cost."""

    @staticmethod
    def register(spark) -> None:
        from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

        class Writer(DataSourceArrowWriter):
            def write(self, iterator):
                for _ in iterator:
                    pass
                return WriterCommitMessage()

            def commit(self, messages) -> None:
                pass

        class Source(DataSource):
            @classmethod
            def name(cls) -> str:
                return "bench_consume"

            def writer(self, schema, overwrite):
                return Writer()

        spark.dataSource.register(Source)


def timed(label: str, write, target: Path, runs: int) -> float:
    best = float("inf")
    for attempt in range(runs + 1):
        shutil.rmtree(target, ignore_errors=True)
        started = time.perf_counter()
        write(str(target))
        seconds = time.perf_counter() - started
        if attempt > 0:  # the first is a warm-up (JIT, Python workers)
            best = min(best, seconds)
        print(f"  {label} run {attempt}: {seconds:.2f} s{' (warm-up)' if attempt == 0 else ''}")
    return best


def run(spark, args: argparse.Namespace) -> None:
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="modeswitch-bench-"))
    if args.input == "generated":
        df = rows(spark, args.rows, args.partitions)
    else:
        df = log_rows(spark, args.rows, scratch)
    print(
        f"{args.rows:,} rows ({args.input}), {df.rdd.getNumPartitions()} partitions, "
        f"master {spark.sparkContext.master}"
    )
    consume = None
    try:
        if args.consume:
            _Consume.register(spark)
            consume = timed(
                "hand-off only",
                lambda p: df.write.format("bench_consume").mode("append").save(p),
                scratch / "consume",
                args.runs,
            )
        native = timed(
            "native parquet",
            lambda p: df.write.mode("overwrite").parquet(p),
            scratch / "native",
            args.runs,
        )
        sink = timed(
            "modeswitch_delta",
            lambda p: df.write.format("modeswitch_delta").mode("append").save(p),
            scratch / "sink",
            args.runs,
        )
        written = DeltaTable(str(scratch / "sink")).count()
        assert written == args.rows, f"sink holds {written} rows, expected {args.rows}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    print("| writer | best of runs | rows/s |")
    print("|---|---|---|")
    print(f"| Spark native parquet | {native:.2f} s | {args.rows / native:,.0f} |")
    print(f"| modeswitch_delta sink | {sink:.2f} s | {args.rows / sink:,.0f} |")
    if consume is not None:
        print(f"| JVM -> Python hand-off only | {consume:.2f} s | {args.rows / consume:,.0f} |")
    print(f"ratio sink / native: {native / sink:.2f} (target >= 0.90)")


def main(argv: list[str] | None = None) -> int:
    args = _parse_arguments(argv)
    conf = {"spark.ui.enabled": "false", "spark.driver.memory": "4g"}
    conf.update(item.split("=", 1) for item in args.conf)
    spark = create_spark_session("bench-sink", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        run(spark, args)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
