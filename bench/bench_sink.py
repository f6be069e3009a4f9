"""Benchmark: the Delta sink's two data paths against Spark's native Parquet writer, same run.

    .venv/bin/python bench/bench_sink.py [--rows 10000000] [--runs 2] [--input generated]

Every writer gets the same DataFrame (bucket, offset, event_time, key, value with a JSON
payload): ``--input generated`` builds it in the JVM with ``spark.range`` (cheap rows: the
writers dominate), ``--input bucketlog`` reads it from an embedded log through the
``bucketlog`` source, as the pipeline does. The writers:

- native Parquet: ``df.write.parquet`` (no Delta table);
- ``modeswitch_delta``: the Python data source writer (pyarrow on executors, one commit);
- native files + commit: :func:`modeswitch.sinks.native.write_batch`, Spark's Parquet writer
  then the sink's commit (with a pipeline, offsets and a quarantine table: the batch job's
  call, quarantine routing included).

Each writer runs ``--runs`` times after one warm-up write, the writers interleaved run by run
(so a burst of load elsewhere hits them alike); the best run counts. Prints rows/s for each
and the ratios to native Parquet, by wall time and by the CPU time this process and its
children (JVM, Python workers) used: on a shared machine other jobs inflate wall time far
more than CPU time. Target: the sink at no less than 0.9 x native Parquet.

``--consume`` adds a third writer that only iterates the Arrow batches Spark hands to a Python
data source writer: the cost of the JVM -> Python hand-off alone, a floor no Python writer
can go under.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from pathlib import Path

from deltalake import DeltaTable

from modeswitch.runners.session import create_spark_session


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
    from modeswitch.devtools.produce import EventGenerator, produce_backlog
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


def cpu_seconds() -> float:
    """CPU time used so far by this process and its children (the JVM, Python workers):
    the work a write costs, which other jobs on the machine inflate far less than wall time."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def timed(writers: dict[str, tuple], runs: int) -> tuple[dict[str, float], dict[str, float]]:
    """Best wall time and least CPU time per writer; run 0 of each is a warm-up (JIT, Python
    workers)."""
    best = dict.fromkeys(writers, float("inf"))
    cpu = dict.fromkeys(writers, float("inf"))
    for attempt in range(runs + 1):
        for label, (write, target) in writers.items():
            shutil.rmtree(target, ignore_errors=True)
            used = cpu_seconds()
            started = time.perf_counter()
            write(str(target))
            seconds = time.perf_counter() - started
            used = cpu_seconds() - used
            if attempt > 0:
                best[label] = min(best[label], seconds)
                cpu[label] = min(cpu[label], used)
            warm = " (warm-up)" if attempt == 0 else ""
            print(f"  {label} run {attempt}: {seconds:.2f} s, CPU {used:.1f} s{warm}", flush=True)
    return best, cpu


def native_files(df, scratch: Path):
    """The batch job's call: write_batch with a pipeline, offsets and a quarantine table (the
    rows carry a null ``_quarantine_reason``, so the routing runs; none is quarantined)."""
    from pyspark.sql import functions as F

    from modeswitch.sinks.native import write_batch
    from modeswitch.transforms import QUARANTINE_REASON

    if QUARANTINE_REASON not in df.columns:
        df = df.withColumn(QUARANTINE_REASON, F.lit(None).cast("string"))

    def write(path: str) -> None:
        shutil.rmtree(scratch / "quarantine", ignore_errors=True)
        write_batch(
            df,
            path,
            pipeline="bench",
            epoch="1",
            sequence="0",
            offsetsEnd='{"0": 1}',
            quarantinePath=str(scratch / "quarantine"),
        )

    return write


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
    writers = {
        "native parquet": (
            lambda p: df.write.mode("overwrite").parquet(p),
            scratch / "native",
        ),
        "modeswitch_delta": (
            lambda p: df.write.format("modeswitch_delta").mode("append").save(p),
            scratch / "sink",
        ),
        "native files + commit": (native_files(df, scratch), scratch / "files"),
    }
    if args.consume:
        _Consume.register(spark)
        writers["hand-off only"] = (
            lambda p: df.write.format("bench_consume").mode("append").save(p),
            scratch / "consume",
        )
    try:
        best, cpu = timed(writers, args.runs)
        for label in ("modeswitch_delta", "native files + commit"):
            written = DeltaTable(str(writers[label][1])).count()
            assert written == args.rows, f"{label} holds {written} rows, expected {args.rows}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    native, native_cpu = best["native parquet"], cpu["native parquet"]
    print()
    print("| writer | best wall | rows/s | native / writer | least CPU | native / writer (CPU) |")
    print("|---|---|---|---|---|---|")
    for label, seconds in best.items():
        print(
            f"| {label} | {seconds:.2f} s | {args.rows / seconds:,.0f} | {native / seconds:.2f} "
            f"| {cpu[label]:.1f} s | {native_cpu / cpu[label]:.2f} |"
        )
    for label in ("modeswitch_delta", "native files + commit"):
        print(
            f"{label} / native: {native / best[label]:.2f} wall, "
            f"{native_cpu / cpu[label]:.2f} CPU (target >= 0.90)"
        )


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
