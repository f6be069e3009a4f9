"""Benchmark: reading Kafka, from Python alone, through Spark, batch and stream; live latency.

    .venv/bin/python bench/bench_kafka.py [--records 2000000]
        [--only k1,reader,read,warm,handover,k2,k3,latency]

A topic of 8 partitions in a broker on loopback (librdkafka's mock cluster, started and
stopped here). The broker keeps 5 MB of record batches per partition and drops older ones as
retention would: the backlog is produced at zstd level 9 (the producer's default level keeps
~230 000 of these records per partition, level 9 ~255 000), and the benchmark checks that
nothing was dropped. Each Spark figure is a real job process (driver + JVM + Python workers);
CPU is the CPU time of the whole process tree (bench_modes.PeakMemory). The broker's own CPU
is in this process and counts in no figure (it is small: 0.02 s while (k1) read 1.6 M).

(k1) a plain confluent-kafka consumer reading every partition into Arrow arrays, in a process
     of its own: the floor for reading Kafka from Python here;
(reader) ``KafkaLog.read`` of every partition, in a process of its own: what each Spark
     task runs;
(read) a Spark job reading the topic through ``bucketlog`` to the ``noop`` sink: the Spark
     read alone, cold; also less the same job on an empty topic (Spark's start and stop);
(warm) the same read three more times in the job's session, after the first: the read's
     steady cost, without the start, the JIT's warm-up or the workers' imports; target:
     records per CPU-second >= 0.8 x (k1)'s;
(handover) the same, from a data source that yields the same batches from memory: what
     Spark's hand-over of the batches costs without Kafka;
(k2) the batch path, Kafka to the Delta sink (jobs/backlog_batch.py on a batch epoch);
(k3) the stream job catching up at the live trigger (100 ms, maxRecordsPerTrigger 100 000);
     target (k2) >= 2.5 x (k3);
``latency``: a live producer at 5 000 records/s, the stream job live (100 ms trigger); a
record's latency is its sink commit's time minus its message timestamp (stamped when
produced), after a 60 s warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import bench_modes as modes
import numpy as np
import psutil
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from modeswitch.devtools.kafka_mock import MockKafkaCluster
from modeswitch.devtools.produce import EventGenerator, produce_backlog, produce_live
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import LocalRunner
from modeswitch.sinks.commits import sink_commits
from modeswitch.sources import open_log
from modeswitch.sources.base import SPARK_RECORD_DDL
from modeswitch.sources.kafka import SCHEME, KafkaLog, kafka_environment
from modeswitch.state import StateStore

PARTITIONS = 8


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
    """What each Spark task runs, without Spark: ``KafkaLog.read`` of every partition."""
    me = psutil.Process()
    cpu_before = sum(me.cpu_times()[:2])
    began = time.perf_counter()
    records = sum(batch.num_rows for p in latest for batch in log.read(p, 0, latest[p]))
    seconds = time.perf_counter() - began
    cpu = sum(me.cpu_times()[:2]) - cpu_before
    return modes.Run("KafkaLog.read of every partition, one process", records, seconds, 0, cpu)


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
    """(k1) or (reader) in a process of its own: like a Spark job's, its CPU leaves the
    broker's out."""
    done = subprocess.run(
        [sys.executable, "-c", IN_OWN_PROCESS, str(Path(__file__).parent), what, source],
        check=True,
        capture_output=True,
        text=True,
    )
    name, records, seconds, cpu = json.loads(done.stdout.strip().splitlines()[-1])
    return modes.Run(name, records, seconds, 0, cpu)


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
if kind == "memory":
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
    source: str, records: int, reads: int = 1, kind: str = "bucketlog"
) -> tuple[modes.Run, list[modes.Run]]:
    """A job reading ``source`` (``kind`` ``memory``: :class:`MemorySource` made from it)
    ``reads`` times in one session: the whole job, and each read after the first (wall and CPU
    of the job's process tree from the read's start to its end)."""
    began = time.perf_counter()
    here = str(Path(__file__).parent)
    command = [sys.executable, "-c", READ_ONLY, source, str(reads), kind]
    # The Python workers import MemorySource from here.
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    process = modes.start_piped(command, env={"PYTHONPATH": path})
    memory = modes.PeakMemory(process.pid)
    output = process.communicate()[0].decode()
    seconds = time.perf_counter() - began
    run = memory.result("Spark read alone (bucketlog -> noop)", records, seconds)
    assert process.returncode == 0, f"read job exited {process.returncode}: {output[-3000:]}"
    measured = [json.loads(line[5:]) for line in output.splitlines() if line.startswith("READ ")]
    label = {
        "bucketlog": "the same read, warm: each read after the first",
        "memory": "the same batches from memory, no Kafka (Spark's hand-over alone), warm",
    }[kind]
    warm = [modes.Run(label, records, wall, 0, cpu) for wall, cpu in measured[1:]]
    return run, warm


def run_latency(scratch: Path, source: str, seconds: float) -> dict:
    """The stream job live on the topic at 5 000 records/s after a short batch epoch."""
    log = open_log(source)
    produce_backlog(log, EventGenerator(seed=2, buckets=PARTITIONS), records=200_000)
    settings = modes.settings_for(
        scratch,
        "kafka_live",
        source,
        trigger_interval="100ms",
        max_records_per_trigger="100000",
        max_stream_runtime="1h",
        wave_records="100000",
        max_split_records="50000",
    )
    stop = threading.Event()
    producer = threading.Thread(
        target=produce_live,
        args=(log, EventGenerator(seed=3, buckets=PARTITIONS)),
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
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    runner = LocalRunner(log_dir=modes.LOGS or scratch / "job-logs", timeout=3600)
    try:
        batch = decide(settings, force_mode="batch", decided_by="bench")
        runner.run("batch", settings, batch.epoch)
        close_epoch(settings, batch.epoch)
        stream = decide(settings, force_mode="stream", decided_by="bench")
        job = threading.Thread(target=runner.run, args=("stream", settings, stream.epoch))
        job.start()
        measure_from = time.time() + modes.WARM_UP_SECONDS
        time.sleep(modes.WARM_UP_SECONDS + seconds)
        store.submit_command("pause", {"note": "benchmark done"}, issuer="bench")
        job.join(timeout=180)
        close_epoch(settings, stream.epoch)
    finally:
        runner.close()
        stop.set()
        producer.join()
    commits = sorted(sink_commits(settings.sink, settings.pipeline), key=lambda c: c.table_version)
    last_batch = max(c.committed_at_ms for c in commits if c.epoch == batch.epoch)
    first_stream = min(c.committed_at_ms for c in commits if c.epoch == stream.epoch)
    latencies: list[float] = []
    for commit in commits:
        if commit.epoch != stream.epoch:
            continue
        visible = commit.committed_at_ms / 1000
        for bucket, end in commit.end.items():
            start = commit.start.get(bucket, end)
            for part in log.read(bucket, start, end) if end > start else ():
                produced = part.column("event_time").cast(pa.int64()).to_numpy() / 1e6
                kept = produced[produced >= measure_from]
                latencies.extend((visible - kept).tolist())
    latencies.sort()
    if not latencies:
        raise RuntimeError("no stream commit after the warm-up")

    return {**modes.latency_summary(latencies), "handoff": (first_stream - last_batch) / 1000}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--only", default="k1,reader,read,warm,handover,k2,k3,latency")
    parser.add_argument("--latency-seconds", type=float, default=60.0)
    parser.add_argument("--logs", help="keep the job processes' output in this folder")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    modes.LOGS = Path(args.logs) if args.logs else None
    scratch = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    runs: list[modes.Run] = []
    with MockKafkaCluster() as cluster:
        os.environ.update(kafka_environment(cluster.config))  # the jobs inherit it
        try:
            cluster.create_topic("bench", PARTITIONS)
            source = f"{SCHEME}bench"
            # Level 9 so that the whole backlog fits the broker's retention (module docstring).
            log = KafkaLog(source, {**cluster.config, "compression.level": 9})
            generator = EventGenerator(seed=1, buckets=PARTITIONS, skew="uniform")
            report = produce_backlog(log, generator, records=args.records)
            latest = log.latest_offsets()
            assert log.earliest_offsets() == dict.fromkeys(latest, 0), "the broker dropped records"
            print(f"produced {report.records:,} records in {report.seconds:.1f} s", flush=True)
            if "k1" in only:
                runs.append(in_own_process("k1", source))
            if "reader" in only:
                runs.append(in_own_process("reader", source))
            if "warm" in only:
                runs.extend(spark_read(source, report.records, 1 + WARM_READS)[1])
            if "handover" in only:
                runs.extend(spark_read(source, report.records, 1 + WARM_READS, "memory")[1])
            if "read" in only:
                # The same job on an empty topic: Spark's start and stop, paid once per job.
                cluster.create_topic("empty", PARTITIONS)
                fixed, _ = spark_read(f"{SCHEME}empty", 0)
                read, _ = spark_read(source, report.records)
                runs.append(read)
                net = modes.Run(
                    "Spark read alone, less the same job on an empty topic",
                    report.records,
                    read.seconds - fixed.seconds,
                    read.peak_mb,
                    read.cpu_seconds - fixed.cpu_seconds,
                )
                runs.append(net)
            if "k2" in only:
                k2 = modes.run_batch(scratch, "kafka_batch", source)
                k2.name = "(k2) batch path, Kafka -> Delta sink"
                runs.append(k2)
            if "k3" in only:
                runs.append(
                    modes.run_stream(
                        scratch,
                        "kafka_stream",
                        source,
                        "(k3) stream catching up, 100 ms trigger, 100 000 per micro-batch",
                        trigger_interval="100ms",
                        max_records_per_trigger="100000",
                    )
                )
            for run in runs:
                cores = run.cpu_seconds / run.seconds if run.seconds else 0
                print(
                    f"| {run.name} | {run.records:,} | {run.seconds:.1f} s | {run.rate:,.0f}/s "
                    f"| {run.cpu_seconds:.1f} s CPU ({cores:.2f} cores) | "
                    f"{run.records / max(run.cpu_seconds, 1e-9):,.0f} per CPU-s | "
                    f"{run.peak_mb:.0f} MB |",
                    flush=True,
                )
            if "latency" in only:
                cluster.create_topic("live", PARTITIONS)
                result = run_latency(scratch, f"{SCHEME}live", args.latency_seconds)
                print(json.dumps(result, indent=1), flush=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
