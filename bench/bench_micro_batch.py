"""Benchmark: where a live micro-batch spends its time, by Spark's own progress reports.

    .venv/bin/python bench/bench_micro_batch.py [--seconds 45] [--malformed 0.0]
        [--stream-writer auto]

One session (the stream job's: local, the checkpoint through the FileSystem API), a 16-bucket
embedded log fed by the latency run's producer at 5 000 records/s (``--malformed``: the fraction
of values that are not JSON, which the sink quarantines), and the stream epoch's query as a
stream epoch builds it (``sink_stream``) with the default settings (``--stream-writer``: another
writer), a 100 ms trigger. After ``--seconds``, the last 60 micro-batches' ``durationMs``
(``addBatch``: read, transform, write and the sink's commit; ``walCommit`` and
``commitOffsets``: the checkpoint's two files; ``triggerExecution``: the whole micro-batch) as
p50 / p90, and the records a micro-batch held (by its sink commit).
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

from modeswitch.control.settings import STREAM_WRITERS, PipelineSettings
from modeswitch.devtools.produce import EventGenerator
from modeswitch.modes.job import resolve_job
from modeswitch.modes.stream_query import LOCAL_CHECKPOINT_CONF, sink_stream
from modeswitch.runners.session import create_spark_session
from modeswitch.sinks.commits import sink_commits
from modeswitch.sinks.options import sink_options
from modeswitch.sources.segments import SegmentLog


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=45)
    parser.add_argument("--malformed", type=float, default=0.0)
    parser.add_argument("--stream-writer", default="auto", choices=STREAM_WRITERS)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="modeswitch-bench-micro-batch-")
    log = SegmentLog.create(f"{work}/log", buckets=BUCKETS)
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "bench",
            "source": log.root,
            "warehouse": f"{work}/wh",
            "stream_writer": args.stream_writer,
        }
    )
    job = resolve_job(settings, "stream")
    spark = create_spark_session("modeswitch-bench-micro-batch", conf=LOCAL_CHECKPOINT_CONF)
    stop = threading.Event()
    generator = EventGenerator(
        seed=3, buckets=BUCKETS, skew="zipf:1.1", malformed_fraction=args.malformed
    )
    producer = live_producer(log, [], stop, generator)
    try:
        producer.start()
        options = sink_options(settings, 1, "stream", columns_from=job.transform.columns_from)
        query = (
            sink_stream(
                spark,
                job,
                job.stream,
                source=settings.source,
                start_json=json.dumps({str(b): 0 for b in range(BUCKETS)}),
                sink=settings.sink,
                options=options,
                checkpoint=f"{work}/checkpoint",
            )
            .trigger(processingTime="100 milliseconds")
            .start()
        )
        time.sleep(args.seconds)
        reports = query.recentProgress[-60:]
        query.stop()
        commits = {c.sequence: c for c in sink_commits(settings.sink, settings.pipeline)}
    finally:
        stop.set()
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{len(reports)} micro-batches, 5 000 records/s, malformed {args.malformed:g}")
    print(f"path: {job.stream.reason}")
    print("| durationMs | p50 | p90 |\n|---|---|---|")
    for name in sorted({k for r in reports for k in r["durationMs"]}):
        values = sorted(r["durationMs"].get(name, 0) for r in reports)
        print(f"| {name} | {statistics.median(values):.0f} | {values[int(len(values) * 0.9)]} |")
    # The sink's commits count the records (the arrow writer's query reads none itself).
    held = [commits[r["batchId"]] for r in reports if r["batchId"] in commits]
    rows = statistics.median(c.records + c.quarantined for c in held) if held else 0
    print(f"records per micro-batch, p50: {rows:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
