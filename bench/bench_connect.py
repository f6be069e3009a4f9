"""Benchmark: the stream epoch driven through Spark Connect against a classic session (issue 20:
"measure before choosing", Connect's per-micro-batch overhead with the listener and the sink).

    .venv/bin/python bench/bench_connect.py [--rounds 5] [--seconds 60] [--json FILE]

Each round runs the same stream epoch twice, in alternating order, each in a child process of
its own (one JVM each, nothing shared): once on a classic session
(:func:`modeswitch.runners.session.create_spark_session`, ``local[2]``), once on a Spark Connect
session (``SparkSession.builder.remote("local[2]")``: pyspark starts a local Connect server in a JVM
and drives it over gRPC, as a long-lived Connect server per pipeline would be driven). Both
sessions get the same Spark settings and register the same Python data sources; the stream
job's own code (:func:`modeswitch.modes.stream.run_stream_epoch`) runs unchanged on either: its
query, its ``StreamingQueryListener`` (client-side on Connect) and the sink.

A live producer appends 5 000 records/s (as ``bench_modes.py --only latency``), the trigger is
100 ms; after ``WARM_UP_SECONDS`` of catch-up the benchmark measures for ``--seconds``, then a
``pause`` command ends the epoch. Reported per run: the session's start, the query's start to
its first sink commit, the median and p90 gap between sink commits (a micro-batch's time
when micro-batches run back to back), each record's latency (its append's publication to its
sink commit: p50 / p99), and whether the client-side listener survived (Connect runs it in a
listener-bus thread of the client, fed over gRPC; when that thread dies it warns and the job
falls back to polling the sink every 200 ms).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import bench_modes as modes
from rich.console import Console
from rich.table import Table

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.modes.job import resolve_job
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.processes import run_process_group
from modeswitch.sinks.commits import sink_commits
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore
from modeswitch.transforms.payload import EVENT_VALUE_SCHEMA

BUCKETS = 16
WARM_UP_SECONDS = 20.0
VARIANTS = ("classic", "connect")


def session(variant: str):
    """A session of ``variant`` on ``local[2]``, with the jobs' Spark settings and data
    sources."""
    from modeswitch.runners.session import BASE_CONF, LOCAL_CONF, create_spark_session

    if variant == "classic":
        return create_spark_session("bench-connect", master="local[2]")
    from pyspark.sql import SparkSession

    from modeswitch.sinks.delta import register as register_sink
    from modeswitch.sources.spark import register

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.remote("local[2]").appName("bench-connect")
    for key, value in {**BASE_CONF, **LOCAL_CONF}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    register_sink(spark)
    return spark


def run_one(variant: str, scratch: Path, seconds: float) -> dict:
    """One stream epoch on ``variant``'s session, live at 5 000 records/s."""
    from modeswitch.modes.stream import run_stream_epoch

    log = SegmentLog.create(str(scratch / "log"), buckets=BUCKETS)
    produce_backlog(log, EventGenerator(seed=2, buckets=BUCKETS, skew="zipf:1.1"), records=20_000)
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "connect",
            "value_schema": EVENT_VALUE_SCHEMA,
            "source": log.root,
            "warehouse": str(scratch / "warehouse"),
            "trigger_interval": "100ms",
            "max_records_per_trigger": "100000",
            "max_stream_runtime": "1h",
            "stream_standby": "off",
            "min_time_in_stream": "0s",
            "exit_threshold": "none",
            "idle_timeout": "none",
        }
    )
    listener_died: list[str] = []
    shown = warnings.showwarning

    def record_warning(message, category, filename, lineno, file=None, line=None):
        if "StreamingQueryListenerBus" in str(message):
            listener_died.append(str(message)[:300])
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = record_warning
    began = time.perf_counter()
    spark = session(variant)
    session_s = time.perf_counter() - began
    stop = threading.Event()
    appended: list[tuple[int, int, int, float]] = []
    producer = modes.live_producer(log, appended, stop)
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    plan = decide(settings, force_mode="stream", decided_by="bench")
    measure_from = time.time() + WARM_UP_SECONDS
    timer = threading.Timer(
        WARM_UP_SECONDS + seconds,
        lambda: store.commands.submit("pause", {"note": "benchmark done"}, issuer="bench"),
    )
    producer.start()
    timer.start()
    query_began = time.time()
    try:
        report = run_stream_epoch(
            spark, resolve_job(settings, "stream"), plan.epoch
        )  # the main thread, as the jobs
        close_epoch(settings, plan.epoch)
    finally:
        timer.cancel()
        stop.set()
        producer.join()
        spark.stop()
    commits = sorted(
        (c for c in sink_commits(settings.sink, settings.pipeline) if c.epoch == plan.epoch),
        key=lambda c: c.table_version,
    )
    latencies = modes.record_latencies(commits, appended, measure_from)
    measured = [
        c.committed_at_ms / 1000 for c in commits if c.committed_at_ms / 1000 >= measure_from
    ]
    if len(measured) < 2 or not latencies:
        raise RuntimeError(f"{variant}: {len(measured)} commits after the warm-up: run longer")
    gaps = sorted(b - a for a, b in itertools.pairwise(measured))
    return {
        "variant": variant,
        "session_s": round(session_s, 2),
        "first_commit_s": round(commits[0].committed_at_ms / 1000 - query_began, 2),
        "micro_batches": report.micro_batches,
        "gap_p50_ms": round(statistics.median(gaps) * 1000),
        "gap_p90_ms": round(gaps[int(len(gaps) * 0.9)] * 1000),
        **{
            key: round(value * 1000) if key != "records" else value
            for key, value in modes.latency_summary(latencies).items()
            if key in ("records", "p50", "p99")
        },
        "listener_died": listener_died[:1],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--json", help="write every run's figures to this file")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # a child run
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.variant:
        scratch = Path(tempfile.mkdtemp(prefix=f"bench-connect-{args.variant}-"))
        Path(args.out).write_text(json.dumps(run_one(args.variant, scratch, args.seconds)))
        return 0
    console = Console(width=200)
    runs: list[dict] = []
    for round_no in range(args.rounds):
        order = VARIANTS if round_no % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            out = Path(tempfile.mkstemp(suffix=".json")[1])
            command = [sys.executable, __file__, "--variant", variant, "--out", str(out)]
            command += ["--seconds", str(args.seconds)]
            logged = out.with_suffix(".log")
            if run_process_group(command, timeout=900, log_file=logged) != 0:
                raise RuntimeError(f"{variant} run failed: see {logged}")
            runs.append({"round": round_no + 1, **json.loads(out.read_text())})
            out.unlink()
            console.print(runs[-1])
            if args.json:
                Path(args.json).write_text(json.dumps(runs, indent=2))
    table = Table(title=f"stream epoch: classic vs Spark Connect, medians of {args.rounds}")
    keys = [k for k in runs[0] if k not in ("variant", "round", "listener_died")]
    table.add_column("session")
    for key in keys:
        table.add_column(key.replace("_", " "), justify="right")
    table.add_column("listener died", justify="right")
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        cells = []
        for key in keys:
            values = sorted(r[key] for r in mine)
            cells.append(f"{statistics.median(values)} ({values[0]}-{values[-1]})")
        died = sum(1 for r in mine if r["listener_died"])
        table.add_row(variant, *cells, f"{died} of {len(mine)}")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
