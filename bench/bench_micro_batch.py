"""Benchmark: where a live micro-batch spends its time, by Spark's own progress reports.

    .venv/bin/python bench/bench_micro_batch.py [--seconds 45] [--malformed 0.0]

One session (the stream job's: local, the checkpoint through the FileSystem API), a 16-bucket
embedded log fed by the latency run's producer at 5 000 records/s (``--malformed``: the fraction
of values that are not JSON, which the sink quarantines), and the stream epoch's query as the
defaults build it: the ``bucketlog`` source running the Arrow parse in its reader, the
``modeswitch_delta`` sink, a 100 ms trigger. After ``--seconds``, the last 60 micro-batches'
``durationMs`` (``addBatch``: read, transform, write and the sink's commit; ``walCommit`` and
``commitOffsets``: the checkpoint's two files; ``triggerExecution``: the whole micro-batch)
as p50 / p90, and the rows a micro-batch held.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time

from bench_modes import BUCKETS, live_producer  # bench/ is on the path

from modeswitch.devtools.produce import EventGenerator
from modeswitch.modes.stream_query import LOCAL_CHECKPOINT_CONF
from modeswitch.runners.session import create_spark_session
from modeswitch.sources.segments import SegmentLog
from modeswitch.transforms import load_transform


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=45)
    parser.add_argument("--malformed", type=float, default=0.0)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="modeswitch-bench-micro-batch-")
    log = SegmentLog.create(f"{work}/log", buckets=BUCKETS)
    spark = create_spark_session("modeswitch-bench-micro-batch", conf=LOCAL_CHECKPOINT_CONF)
    stop = threading.Event()
    generator = EventGenerator(
        seed=3, buckets=BUCKETS, skew="zipf:1.1", malformed_fraction=args.malformed
    )
    producer = live_producer(log, [], stop, generator)
    try:
        producer.start()
        transform = load_transform("modeswitch.transforms.arrow:parse_events_arrow")
        start = json.dumps({str(b): 0 for b in range(BUCKETS)})
        options = {
            "pipeline": "bench",
            "mode": "stream",
            "epoch": "1",
            "offsetsStart": start,
            "quarantinePath": f"{work}/quarantine",
        }
        stream = spark.readStream.format("bucketlog").option("startingOffsets", start)
        query = (
            transform(stream.load(log.root))
            .withWatermark("event_time", "10 seconds")
            .writeStream.format("modeswitch_delta")
            .options(**options)
            .option("checkpointLocation", f"{work}/checkpoint")
            .trigger(processingTime="100 milliseconds")
            .start(f"{work}/sink")
        )
        time.sleep(args.seconds)
        reports = query.recentProgress[-60:]
        query.stop()
    finally:
        stop.set()
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{len(reports)} micro-batches, 5 000 records/s, malformed {args.malformed:g}")
    print("| durationMs | p50 | p90 |\n|---|---|---|")
    for name in sorted({k for r in reports for k in r["durationMs"]}):
        values = sorted(r["durationMs"].get(name, 0) for r in reports)
        print(f"| {name} | {statistics.median(values):.0f} | {values[int(len(values) * 0.9)]} |")
    rows = statistics.median(r["numInputRows"] for r in reports)
    print(f"rows per micro-batch, p50: {rows:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
