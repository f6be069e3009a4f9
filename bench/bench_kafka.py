"""Benchmark: reading Kafka, from Python alone, through Spark, batch and stream; live latency.

    .venv/bin/python bench/bench_kafka.py [--records 1600000] [--only k1,reader,read,k2,k3,latency]

A topic of 8 partitions in a broker on loopback (librdkafka's mock cluster, started and
stopped here; it keeps about 5 MB of zstd batches, ~200 000 of these records, per partition,
so the default is 1.6 M records, not 2 M: more and the oldest are dropped as by retention).
Each Spark figure is a real job process (driver + JVM + Python workers); CPU is the CPU time
of the whole process tree (bench_modes.PeakMemory).

(k1) a plain confluent-kafka consumer reading every partition into Arrow arrays, one process:
     the floor for reading Kafka from Python here;
(reader) ``KafkaLog.read`` of every partition in this process: what each Spark task runs;
(read) Spark reading the topic through ``bucketlog`` to the ``noop`` sink: the Spark read
     alone; also less the same job on an empty topic (Spark's start and stop); target:
     records per CPU-second >= 0.8 x (k1)'s;
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
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import bench_modes as modes
import numpy as np
import psutil
import pyarrow as pa

from modeswitch.local_runner import LocalRunner
from modeswitch.orchestration import close_epoch, decide
from modeswitch.produce import EventGenerator, produce_backlog, produce_live
from modeswitch.sinks.commits import sink_commits
from modeswitch.sources import open_log
from modeswitch.sources.kafka import SCHEME, kafka_environment
from modeswitch.sources.kafka_mock import MockKafkaCluster
from modeswitch.state import StateStore

PARTITIONS = 8


def plain_consumer(bootstrap: str, topic: str, latest: dict[int, int]) -> modes.Run:
    """(k1): one confluent-kafka consumer, every partition, messages into Arrow arrays."""
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


def log_reader(log, latest: dict[int, int]) -> modes.Run:
    """What each Spark task runs, without Spark: ``KafkaLog.read`` of every partition."""
    me = psutil.Process()
    cpu_before = sum(me.cpu_times()[:2])
    began = time.perf_counter()
    records = sum(batch.num_rows for p in latest for batch in log.read(p, 0, latest[p]))
    seconds = time.perf_counter() - began
    cpu = sum(me.cpu_times()[:2]) - cpu_before
    return modes.Run("KafkaLog.read of every partition, one process", records, seconds, 0, cpu)


READ_ONLY = """
import sys
from modeswitch.session import create_spark_session
from modeswitch.sources.spark import register
spark = create_spark_session("bench-kafka-read")
register(spark)
spark.read.format("bucketlog").load(sys.argv[1]).write.format("noop").mode("overwrite").save()
spark.stop()
"""


def spark_read(source: str, records: int) -> modes.Run:
    began = time.perf_counter()
    process = modes.start([sys.executable, "-c", READ_ONLY, source])
    memory = modes.PeakMemory(process.pid)
    code = modes.finish(process)
    seconds = time.perf_counter() - began
    run = memory.result("Spark read alone (bucketlog -> noop)", records, seconds)
    assert code == 0, f"read job exited {code}"
    return run


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
        runner("batch", settings, batch.epoch)
        close_epoch(settings, batch.epoch)
        stream = decide(settings, force_mode="stream", decided_by="bench")
        job = threading.Thread(target=runner, args=("stream", settings, stream.epoch))
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
    parser.add_argument("--records", type=int, default=1_600_000)
    parser.add_argument("--only", default="k1,reader,read,k2,k3,latency")
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
            log = open_log(source)
            generator = EventGenerator(seed=1, buckets=PARTITIONS, skew="uniform")
            report = produce_backlog(log, generator, records=args.records)
            latest = log.latest_offsets()
            assert log.earliest_offsets() == dict.fromkeys(latest, 0), "the broker dropped records"
            print(f"produced {report.records:,} records in {report.seconds:.1f} s", flush=True)
            if "k1" in only:
                runs.append(plain_consumer(cluster.bootstrap, "bench", latest))
            if "reader" in only:
                runs.append(log_reader(log, latest))
            if "read" in only:
                # The same job on an empty topic: Spark's start and stop, paid once per job.
                cluster.create_topic("empty", PARTITIONS)
                fixed = spark_read(f"{SCHEME}empty", 0)
                read = spark_read(source, report.records)
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
                    f"| {run.cpu_seconds:.0f} s CPU ({cores:.2f} cores) | "
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
