"""Benchmark: reading Kafka, from Python alone, through Spark, batch and stream; live latency.

    .venv/bin/python bench/bench_kafka.py [--records 10000000]
        [--only k1,k4,k2,k3,latency] [--latency-seconds 60] [--logs FOLDER]

A topic of 16 partitions (the demo's skew, Zipf 1.1; the demo's JSON events, an hour of event
time) on an Apache Kafka broker on loopback (one KRaft node,
:class:`~modeswitch.devtools.kafka_broker.KafkaBroker`, started and stopped here). The topic
keeps everything (``retention.ms`` and ``retention.bytes`` -1), the backlog is produced with
the producer's normal settings (zstd, 20 ms linger), and the benchmark checks that every
partition still starts at offset 0 and that the offsets add up to the records produced. Each
Spark figure is a real job process (driver + JVM + Python workers); CPU is the CPU time of
its whole process tree (bench_modes.PeakMemory). The broker is a process of its own: its CPU
counts in no figure and is shown beside each (the whole case's, for a job of several reads).

(k1) a plain confluent-kafka consumer reading every partition into Arrow arrays, in a process
     of its own (its CPU from its first call on): the floor for reading Kafka from Python;
(k4) Spark's own Kafka source (``format("kafka")``, ``kafka.isolation.level=read_committed``,
     ``startingOffsets`` earliest, ``endingOffsets`` latest) reading the whole topic to the
     ``noop`` sink, in a job of its own: the job, and the read inside it (its start and stop
     left out, as (k1)'s imports are); target: records per CPU-second >= 1.0 x (k1)'s;
(k2) the batch path, Kafka to the Delta sink (jobs/backlog_batch.py on a batch epoch, waves of
     2 M), with ``batch_reader = arrow`` (the default: ``KafkaLog.read`` in the Python
     workers) and with ``batch_reader = native`` (Spark's Kafka source);
(k3) the stream job catching up with ``stream_trigger = available_now`` and no read limit;
     target (k2) >= 2.5 x (k3), by records per second of wall time (Spark's start in both);
``latency``: after a batch epoch over 200 000 records, a live producer at 5 000 records/s and
the stream job live (100 ms trigger); a record's latency is its sink commit's time minus its
message timestamp (stamped when produced), after a 60 s warm-up; targets p50 <= 400 ms,
p99 <= 800 ms.

Also, with ``--only``: ``reader``, ``KafkaLog.read`` of every partition in a process of its
own (what each task of an Arrow wave reads); ``read``, a Spark job reading the topic through
``bucketlog`` to ``noop``, cold, and less the same job on an empty topic; ``warm``, that read
three more times in its session; ``handover``, the same from a data source that yields the
same batches from memory (Spark's hand-over without Kafka); ``k3live``, the stream catching up
at the live trigger (100 ms, 100 000 records per micro-batch).

Figures and what they say: docs/BENCHMARKS.md, "Kafka".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import bench_modes as modes
import numpy as np
import psutil
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.devtools.produce import EventGenerator, produce_backlog, produce_live
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import job_command
from modeswitch.sinks.commits import sink_commits
from modeswitch.sources import open_log
from modeswitch.sources.base import SPARK_RECORD_DDL
from modeswitch.sources.kafka import SCHEME, KafkaLog, kafka_environment

PARTITIONS = modes.BUCKETS
SKEW = "zipf:1.1"
KEEP_EVERYTHING = {"retention.ms": "-1", "retention.bytes": "-1"}
"""Topic settings: no record is deleted, by age or by size, while the benchmark runs."""


def plain_consumer(bootstrap: str, topic: str, latest: dict[int, int]) -> modes.Run:
    """(k1): one confluent-kafka consumer, every partition, messages into Arrow arrays. Its
    CPU is this process's from the first call on (imports not counted)."""
    from confluent_kafka import Consumer, TopicPartition

    me = psutil.Process()
    cpu_before = sum(me.cpu_times()[:2])
    began = time.perf_counter()
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in latest])
    left = {p: end for p, end in latest.items() if end > 0}
    tables, records = [], 0
    while left:
        messages = consumer.consume(10_000, timeout=0.5)
        offsets, stamps, values = [], [], []
        for m in messages:
            if m.error():
                continue
            offsets.append(m.offset())
            stamps.append(m.timestamp()[1])
            values.append(m.value())
            if m.offset() + 1 >= left.get(m.partition(), 0):
                left.pop(m.partition(), None)
        tables.append(
            pa.table(
                {
                    "offset": pa.array(offsets, pa.int64()),
                    "timestamp": pa.array(stamps, pa.int64()),
                    "value": pa.array(values, pa.binary()).cast(pa.string()),
                }
            )
        )
        records += len(offsets)
    consumer.close()
    seconds = time.perf_counter() - began
    cpu = sum(me.cpu_times()[:2]) - cpu_before
    return modes.Run("(k1) plain confluent-kafka consumer into Arrow", records, seconds, 0, cpu)


def log_reader(log: Any, latest: dict[int, int]) -> modes.Run:
    """What each task of an Arrow wave reads, without Spark: ``KafkaLog.read`` of every
    partition."""
    me = psutil.Process()
    cpu_before = sum(me.cpu_times()[:2])
    began = time.perf_counter()
    records = sum(batch.num_rows for p in latest for batch in log.read(p, 0, latest[p]))
    seconds = time.perf_counter() - began
    cpu = sum(me.cpu_times()[:2]) - cpu_before
    return modes.Run("KafkaLog.read of every partition", records, seconds, 0, cpu)


IN_OWN_PROCESS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import bench_kafka
from modeswitch.sources import open_log
what, source = sys.argv[2], sys.argv[3]
log = open_log(source)
latest = log.latest_offsets()
if what == "k1":
    run = bench_kafka.plain_consumer(log.servers, log.topic, latest)
else:
    run = bench_kafka.log_reader(log, latest)
print(json.dumps([run.name, run.records, run.seconds, run.cpu_seconds]))
"""


def in_own_process(what: str, source: str) -> modes.Run:
    """(k1) or (reader) in a process of its own, like a Spark job's."""
    done = subprocess.run(
        [sys.executable, "-c", IN_OWN_PROCESS, str(Path(__file__).parent), what, source],
        check=True,
        capture_output=True,
        text=True,
    )
    name, records, seconds, cpu = json.loads(done.stdout.strip().splitlines()[-1])
    return modes.Run(f"{name}, own process", records, seconds, 0, cpu)


READ_ONLY = """
import json, sys, time
import psutil
from modeswitch.runners.session import create_spark_session
from modeswitch.sources.spark import register
spark = create_spark_session("bench-kafka-read")
register(spark)
me = psutil.Process()


def tree_cpu():
    # Python workers that ended count in their parent's children_* times.
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


source, reads, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if kind == "kafka":
    # Spark's own Kafka source, its raw rows; java_options() holds the broker's address and
    # kafka.isolation.level=read_committed, and the product's reads poll as many records.
    from modeswitch.sources.kafka import KafkaLocation
    from modeswitch.sources.spark_kafka import READ_MAX_POLL_RECORDS, java_options
    # BENCH_KAFKA_OPTIONS: more kafka.* options as JSON (the Java consumer's settings).
    import os
    frame = (
        spark.read.format("kafka")
        .option("kafka.max.poll.records", str(READ_MAX_POLL_RECORDS))
        .options(**java_options())
        .options(**json.loads(os.environ.get("BENCH_KAFKA_OPTIONS") or "{}"))
        .option("subscribe", KafkaLocation.parse(source).topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load
    )
elif kind == "memory":
    from bench_kafka import MemorySource
    spark.dataSource.register(MemorySource)
    frame = lambda: spark.read.format("memory").load(source)
else:
    frame = lambda: spark.read.format("bucketlog").load(source)
for i in range(reads):
    cpu, began = tree_cpu(), time.perf_counter()
    frame().write.format("noop").mode("overwrite").save()
    print("READ " + json.dumps([time.perf_counter() - began, tree_cpu() - cpu]), flush=True)
spark.stop()
"""
WARM_READS = 3


class MemorySource(DataSource):
    """``memory``: the same records as the topic's (load path), in the same Arrow batches,
    made from a sample held in memory: no Kafka while Spark reads. A read of it costs what
    Spark's hand-over of the batches (Python worker to JVM, rows to ``noop``) costs alone.
    The sample (the first batch of partition 0) and the topic's record count per partition
    travel with the pickled reader."""

    @classmethod
    def name(cls) -> str:
        return "memory"

    def schema(self) -> str:
        return SPARK_RECORD_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        log = open_log(self.options["path"])
        counts = log.latest_offsets()
        return MemoryReader(next(iter(log.read(0, 0, counts[0]))), counts)


class MemoryReader(DataSourceReader):
    def __init__(self, sample: pa.RecordBatch, counts: dict[int, int]) -> None:
        self.sample, self.counts = sample, counts

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(count) for count in self.counts.values()]

    def read(self, partition: InputPartition) -> Any:
        left = partition.value
        while left > 0:
            batch = self.sample.slice(0, left)
            left -= batch.num_rows
            yield batch


def spark_read(
    source: str, records: int, name: str, *, reads: int = 1, kind: str = "bucketlog"
) -> tuple[modes.Run, list[tuple[float, float]]]:
    """A job reading ``source`` to ``noop`` ``reads`` times in one session (``kind``:
    ``kafka``, Spark's Kafka source; ``bucketlog``; ``memory``, :class:`MemorySource` made
    from it): the whole job as ``name``, and each read's wall and CPU seconds (the job's
    process tree from the read's start to its end)."""
    began = time.perf_counter()
    here = str(Path(__file__).parent)
    command = [sys.executable, "-c", READ_ONLY, source, str(reads), kind]
    # The Python workers import MemorySource from here.
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    process = modes.start_piped(command, env={"PYTHONPATH": path})
    memory = modes.PeakMemory(process.pid)
    output = process.communicate()[0].decode()
    run = memory.result(name, records, time.perf_counter() - began)
    if process.returncode != 0:
        raise RuntimeError(f"read job ({kind}) exited {process.returncode}: {output[-3000:]}")
    measured = [json.loads(line[5:]) for line in output.splitlines() if line.startswith("READ ")]
    return run, [(wall, cpu) for wall, cpu in measured]


def spark_kafka_read(source: str, records: int) -> list[modes.Run]:
    """(k4): the job, and the read inside it."""
    job, [(wall, cpu)] = spark_read(
        source, records, "(k4) Spark's Kafka source -> noop, a job of its own", kind="kafka"
    )
    alone = "(k4) the same read inside the job (Spark's start and stop left out)"
    return [job, modes.Run(alone, records, wall, 0, cpu)]


def bucketlog_read(broker: KafkaBroker, source: str, records: int) -> list[modes.Run]:
    """``read``: the ``bucketlog`` read, a job of its own, and less the same job on an empty
    topic (Spark's start and stop, paid once per job)."""
    broker.create_topic("empty", PARTITIONS)
    fixed, _ = spark_read(f"{SCHEME}empty", 0, "the same job on an empty topic")
    read, _ = spark_read(source, records, "Spark read (bucketlog -> noop), a job of its own")
    net = modes.Run(
        "Spark read (bucketlog), less the same job on an empty topic",
        records,
        read.seconds - fixed.seconds,
        read.peak_mb,
        read.cpu_seconds - fixed.cpu_seconds,
    )
    return [read, net]


def warm_reads(source: str, records: int, kind: str) -> list[modes.Run]:
    """``warm`` (``bucketlog``) or ``handover`` (``memory``): each read of a job after its
    first, without the start, the JIT's warm-up or the workers' imports."""
    label = {
        "bucketlog": "the same bucketlog read, warm: each read after the first",
        "memory": "the same batches from memory, no Kafka (Spark's hand-over alone), warm",
    }[kind]
    _, reads = spark_read(source, records, label, reads=1 + WARM_READS, kind=kind)
    return [modes.Run(label, records, wall, 0, cpu) for wall, cpu in reads[1:]]


def run_batch(
    scratch: Path, source: str, batch_reader: str, name: str = "", **extra: str
) -> modes.Run:
    """(k2): :func:`bench_modes.run_batch` with ``batch_reader`` (and ``extra``) set."""
    settings = modes.settings_for(
        scratch,
        f"kafka_batch_{batch_reader}{name.strip().lower()}",
        source,
        batch_reader=batch_reader,
        **extra,
    )
    plan = decide(settings, force_mode="batch", decided_by="bench")
    began = time.perf_counter()
    process = modes.start(job_command("batch", settings, plan.epoch))
    memory = modes.PeakMemory(process.pid)
    code = modes.finish(process)
    label = {
        "arrow": "KafkaLog.read in the workers",
        "native": "Spark's Kafka source",
        "bucketlog": "KafkaLog.read in Spark's Python data source",
    }
    run = memory.result(
        f"(k2) batch path{name and ' ' + name.strip()}, batch_reader = {batch_reader} "
        f"({label[batch_reader]})",
        sum(plan.boundary.values()),
        time.perf_counter() - began,
    )
    if code != 0:
        raise RuntimeError(f"batch job (batch_reader = {batch_reader}) exited {code}")
    close_epoch(settings, plan.epoch)
    return run


def catch_up(scratch: Path, source: str, live_trigger: bool = False) -> modes.Run:
    """(k3): the stream job from the topic's start until it has committed everything, with
    availableNow and no read limit, or (``live_trigger``) at the live trigger."""
    if live_trigger:
        return modes.run_stream(
            scratch,
            "kafka_stream_live",
            source,
            "stream catching up, 100 ms trigger, 100 000 per micro-batch",
            trigger_interval="100ms",
            max_records_per_trigger="100000",
        )
    return modes.run_stream(
        scratch,
        "kafka_stream",
        source,
        "(k3) stream catching up, availableNow, no read limit",
        stream_trigger="available_now",
        max_records_per_trigger="none",
    )


def run_latency(
    broker: KafkaBroker,
    scratch: Path,
    seconds: float,
    topic: str = "live",
    wrap: Callable[[KafkaLog], Any] = lambda log: log,
    **extra: str,
) -> dict:
    """The stream job live on a topic of its own at 5 000 records/s after a short batch
    epoch; ``wrap`` gives what the events are written through (the log itself by default),
    ``extra`` more settings."""
    broker.create_topic(topic, PARTITIONS, **KEEP_EVERYTHING)
    source = f"{SCHEME}{topic}"
    with contextlib.closing(KafkaLog(source)) as log:
        generator = EventGenerator(seed=2, buckets=PARTITIONS, skew=SKEW)
        produce_backlog(wrap(log), generator, records=200_000)
        settings = modes.settings_for(
            scratch,
            "kafka_live",
            source,
            trigger_interval="100ms",
            max_records_per_trigger="100000",
            max_stream_runtime="1h",
            wave_records="100000",
            max_split_records="50000",
            **extra,
        )
        measure_from, batch, stream = live_epochs(settings, seconds, wrap)
        commits = sorted(
            sink_commits(settings.sink, settings.pipeline), key=lambda c: c.table_version
        )
        latencies = record_latencies(log, [c for c in commits if c.epoch == stream], measure_from)
    if not latencies:
        raise RuntimeError("no stream commit after the warm-up")
    last_batch = max(c.committed_at_ms for c in commits if c.epoch == batch)
    first_stream = min(c.committed_at_ms for c in commits if c.epoch == stream)
    return {**modes.latency_summary(latencies), "handoff": (first_stream - last_batch) / 1000}


def record_latencies(log: KafkaLog, commits: list, measure_from: float) -> list[float]:
    """Sorted latencies of the records produced from ``measure_from`` on: from a record's
    message timestamp (stamped when produced) to the time the sink commit that wrote it
    landed. Each partition is read once, over the span of the commits' ranges."""
    latencies: list[float] = []
    for bucket in sorted({bucket for commit in commits for bucket in commit.end}):
        ranges = [
            (c.start.get(bucket, c.end[bucket]), c.end[bucket], c.committed_at_ms / 1000)
            for c in commits
            if bucket in c.end
        ]
        parts = list(log.read(bucket, min(r[0] for r in ranges), max(r[1] for r in ranges)))
        if not parts:
            continue
        offsets = np.concatenate([part.column("offset").to_numpy() for part in parts])
        produced = np.concatenate(
            [part.column("event_time").cast(pa.int64()).to_numpy() / 1e6 for part in parts]
        )
        for start, end, visible in ranges:
            first, last = np.searchsorted(offsets, [start, end])
            kept = produced[first:last]
            latencies.extend((visible - kept[kept >= measure_from]).tolist())
    return sorted(latencies)


def live_epochs(
    settings: PipelineSettings, seconds: float, wrap: Callable[[KafkaLog], Any] = lambda log: log
) -> tuple[float, int, int]:
    """A batch epoch, then the stream epoch live for the warm-up and ``seconds``, beside a
    producer of 5 000 records/s: when the measure starts (epoch seconds), the two epochs."""
    stop = threading.Event()
    live = KafkaLog(settings.source)
    producer = threading.Thread(
        target=produce_live,
        args=(wrap(live), EventGenerator(seed=3, buckets=PARTITIONS, skew=SKEW)),
        kwargs={
            "rate": 5000.0,
            "duration": timedelta(hours=1),
            "first": 10_000_000,
            "flush_every": timedelta(milliseconds=50),
            "should_stop": stop.is_set,
        },
        daemon=True,
    )
    producer.start()
    try:
        run = modes.batch_then_live(
            settings, seconds, log_dir=modes.LOGS or Path(settings.warehouse) / "job-logs"
        )
    finally:
        stop.set()
        producer.join()
        live.close()
    return run.measure_from, run.batch, run.stream


def produce_topic(
    broker: KafkaBroker,
    topic: str,
    records: int,
    wrap: Callable[[KafkaLog], Any] = lambda log: log,
) -> str:
    """The topic, created to keep everything, with ``records`` of the demo's events (an hour
    of event time) from one producer with its normal settings, written through ``wrap`` of
    its log; raises if any record is missing. Returns its source setting."""
    broker.create_topic(topic, PARTITIONS, **KEEP_EVERYTHING)
    source = f"{SCHEME}{topic}"
    generator = EventGenerator(seed=1, buckets=PARTITIONS, skew=SKEW)
    with contextlib.closing(KafkaLog(source)) as log:
        report = produce_backlog(wrap(log), generator, records=records, span=timedelta(hours=1))
        earliest, latest = log.earliest_offsets(), log.latest_offsets()
    if any(earliest.values()) or sum(latest.values()) != records:
        raise RuntimeError(
            f"topic {topic!r} does not hold the {records:,} records produced: earliest "
            f"{earliest}, latest {latest}"
        )
    print(
        f"produced {records:,} records in {report.seconds:.1f} s "
        f"({records / report.seconds:,.0f}/s; partition 0 holds {latest[0]:,})",
        flush=True,
    )
    return source


def broker_cpu(broker: KafkaBroker) -> float:
    """The CPU seconds the broker's JVM has used so far."""
    assert broker.process is not None
    times = psutil.Process(broker.process.pid).cpu_times()
    return times.user + times.system


def print_table(rows: list[tuple[modes.Run, float]]) -> None:
    """The runs as a Markdown table for docs/BENCHMARKS.md."""
    print()
    print(
        "| run | records | wall | rate | CPU | records per CPU-second | peak PSS "
        "| broker CPU during the case |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for run, broker in rows:
        cores = run.cpu_seconds / run.seconds if run.seconds else 0
        peak = f"{run.peak_mb:,.0f} MB" if run.peak_mb else "-"
        print(
            f"| {run.name} | {run.records:,} | {run.seconds:.1f} s | {run.rate:,.0f}/s "
            f"| {run.cpu_seconds:.1f} s ({cores:.2f} cores) "
            f"| {run.records / max(run.cpu_seconds, 1e-9):,.0f} | {peak} | {broker:.1f} s |",
            flush=True,
        )


def print_ratios(runs: dict[str, modes.Run]) -> None:
    """The issue's ratios among what ran."""

    def per_cpu(run: modes.Run) -> float:
        return run.records / max(run.cpu_seconds, 1e-9)

    if "k1" in runs and "k4" in runs:
        print(
            "(k4) / (k1), records per CPU-second: "
            f"{per_cpu(runs['k4 read']) / per_cpu(runs['k1']):.2f} the read inside the job, "
            f"{per_cpu(runs['k4']) / per_cpu(runs['k1']):.2f} the whole job (target >= 1.0)"
        )
    for reader in ("arrow", "native"):
        if f"k2 {reader}" in runs and "k3" in runs:
            ratio = runs[f"k2 {reader}"].rate / runs["k3"].rate
            print(f"(k2, {reader}) / (k3), records per second: {ratio:.2f} (target >= 2.5)")


def cases(
    broker: KafkaBroker, scratch: Path, source: str, records: int
) -> list[tuple[str, tuple[str, ...], Callable[[], list[modes.Run]]]]:
    """Each case of ``--only``, in the order they run: its name, the keys of its runs for
    :func:`print_ratios`, and what measures it."""
    return [
        ("k1", ("k1",), lambda: [in_own_process("k1", source)]),
        ("reader", ("reader",), lambda: [in_own_process("reader", source)]),
        ("k4", ("k4", "k4 read"), lambda: spark_kafka_read(source, records)),
        ("read", ("read", "read net"), lambda: bucketlog_read(broker, source, records)),
        ("warm", (), lambda: warm_reads(source, records, "bucketlog")),
        ("handover", (), lambda: warm_reads(source, records, "memory")),
        ("k2", ("k2 arrow",), lambda: [run_batch(scratch, source, "arrow")]),
        ("k2", ("k2 native",), lambda: [run_batch(scratch, source, "native")]),
        ("k3", ("k3",), lambda: [catch_up(scratch, source)]),
        ("k3live", ("k3 live",), lambda: [catch_up(scratch, source, live_trigger=True)]),
    ]


CASES = ("k1", "reader", "k4", "read", "warm", "handover", "k2", "k3", "k3live", "latency")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--only", default="k1,k4,k2,k3,latency", help="among: " + ",".join(CASES))
    parser.add_argument("--latency-seconds", type=float, default=60.0)
    parser.add_argument("--logs", help="keep the job processes' output in this folder")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    if only - set(CASES):
        parser.error(f"--only: {','.join(sorted(only - set(CASES)))} is not among {CASES}")
    modes.LOGS = Path(args.logs) if args.logs else None
    scratch = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    try:
        with KafkaBroker(scratch / "broker") as broker:
            os.environ.update(kafka_environment(broker.config))  # the jobs inherit it
            print(f"Apache Kafka broker at {broker.bootstrap}", flush=True)
            source = produce_topic(broker, "bench", args.records)
            rows: list[tuple[modes.Run, float]] = []
            named: dict[str, modes.Run] = {}
            for case, keys, measure in cases(broker, scratch, source, args.records):
                if case not in only:
                    continue
                before = broker_cpu(broker)
                runs = measure()
                spent = broker_cpu(broker) - before
                rows.extend((run, spent) for run in runs)
                named.update(zip(keys, runs, strict=False))
                print(f"{case}: {runs[0].name}: {runs[0].rate:,.0f} records/s", flush=True)
            print_table(rows)
            print_ratios(named)
            if "latency" in only:
                result = run_latency(broker, scratch, args.latency_seconds)
                print(
                    f"live at 5 000 records/s, 100 ms trigger, {result['records']:,} records: "
                    f"p50 {result['p50'] * 1000:.0f} ms, p95 {result['p95'] * 1000:.0f} ms, "
                    f"p99 {result['p99'] * 1000:.0f} ms, max {result['max'] * 1000:.0f} ms "
                    "(targets: p50 <= 400 ms, p99 <= 800 ms); handoff, the batch's last "
                    f"commit -> the stream's first: {result['handoff']:.1f} s",
                    flush=True,
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
