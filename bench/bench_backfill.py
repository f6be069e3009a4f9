"""Benchmark: a backfill beside a live stream, against the batch path alone.

    .venv/bin/python bench/bench_backfill.py [--records 2000000] [--rate 2000] [--quiet 60]

On the embedded log (8 buckets), ``--records`` records of yesterday's event time:

1. **batch alone**: a batch epoch drains them (``jobs/backlog_batch.py``), nothing else running;
2. the stream job goes live (100 ms trigger) while a producer appends ``--rate`` records/s;
3. **backfill beside the stream**: after ``--quiet`` seconds, ``jobs/backfill.py`` reprocesses
   the whole day (every record of step 1, one window);
4. **two backfills at once** (what ``max_active_runs = 2`` allows): the day's two halves,
   reprocessed by two jobs started together;
5. ``--quiet`` seconds more of the stream alone; then it is paused, and
6. **backfill alone**: the whole day reprocessed again with nothing else running.

Throughput is records / wall time of the job process, start-up included (as in
bench_modes.py); CPU is the process tree's. Each live record's latency is the time its sink
commit landed minus the time its append was published, grouped by what ran when it was
published: the stream alone, one backfill, two backfills. Every phase is checked: the audit
must find every record once at the end.
"""

from __future__ import annotations

import argparse
import bisect
import json
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import pendulum
import psutil
from bench_modes import POLICY_OFF, latency_summary

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog, produce_live
from modeswitch.modes.backfill import Window, plan_backfill
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import LocalRunner, job_command
from modeswitch.runners.processes import start_group, wait_group
from modeswitch.sinks.commits import sink_commits
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore
from modeswitch.transforms.payload import EVENT_VALUE_SCHEMA

BUCKETS = 8
WARM_UP_SECONDS = 40
TODAY = pendulum.now("UTC").start_of("day")
DAY = Window(TODAY.subtract(days=1), TODAY)


def run_job(kind: str, settings: PipelineSettings, target: int, logs: Path) -> dict:
    """Run one job process to its end; its wall time and its process tree's CPU time."""
    began = time.perf_counter()
    with open(logs / f"{kind}-{target}-{time.strftime('%H%M%S')}.log", "wb") as out:
        process = start_group(job_command(kind, settings, target), output=out)
        root = psutil.Process(process.pid)
        cpu = 0.0
        while process.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
                cpu = max(cpu, sum(sum(p.cpu_times()[:2]) for p in tree))
            except psutil.Error:
                pass
            time.sleep(0.2)
        code = wait_group(process, 3600)
    assert code == 0, f"{kind} job {target} exited {code}; see {logs}"
    return {"seconds": time.perf_counter() - began, "cpu": cpu}


def backfill(settings: PipelineSettings, window: Window, run_id: str, logs: Path) -> dict:
    plan = plan_backfill(settings, window, "reprocess", run_id=run_id, issuer="bench")
    return {
        "command": plan.command,
        "window": str(window),
        **run_job("backfill", settings, plan.command, logs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--rate", type=float, default=2_000)
    parser.add_argument("--quiet", type=float, default=60, help="seconds of stream alone")
    parser.add_argument("--dir", default=None)
    args = parser.parse_args(argv)
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="modeswitch-bench-backfill-"))
    logs = scratch / "job-logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = SegmentLog.create(str(scratch / "log"), buckets=BUCKETS)
    produce_backlog(
        log,
        EventGenerator(seed=1, buckets=BUCKETS, late_fraction=0.02, malformed_fraction=0.001),
        records=args.records,
        span=timedelta(days=1) - timedelta(minutes=1),
        now=TODAY.subtract(minutes=1),
    )
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "bench_backfill",
            "value_schema": EVENT_VALUE_SCHEMA,
            "source": log.root,
            "warehouse": str(scratch / "warehouse"),
            "wave_records": "2000000",
            "max_split_records": "1000000",
            "parallelism": "2",
            "trigger_interval": "100ms",
            "max_records_per_trigger": "100000",
            "max_stream_runtime": "2h",
            **POLICY_OFF,
        }
    )
    results: dict[str, dict] = {}
    epoch = decide(settings, force_mode="batch", decided_by="bench").epoch
    results["batch alone"] = run_job("batch", settings, epoch, logs)
    close_epoch(settings, epoch)

    stop = threading.Event()
    appended: list[tuple[int, int, int, float]] = []
    producer = threading.Thread(
        target=produce_live,
        args=(log, EventGenerator(seed=3, buckets=BUCKETS)),
        kwargs={
            "rate": args.rate,
            "duration": timedelta(hours=2),
            "first": 100_000_000,
            "flush_every": timedelta(milliseconds=50),
            "should_stop": stop.is_set,
            "on_append": lambda b, s, e: appended.append((b, s, e, time.time())),
        },
        daemon=True,
    )
    stream = decide(settings, force_mode="stream", decided_by="bench").epoch
    runner = LocalRunner(log_dir=logs, timeout=7200)
    store = StateStore.from_settings(settings)
    phases: list[tuple[str, float, float]] = []
    job = threading.Thread(target=runner, args=("stream", settings, stream))
    producer.start()
    job.start()
    try:
        time.sleep(WARM_UP_SECONDS)
        mark = time.time()
        time.sleep(args.quiet)
        phases.append(("stream alone", mark, time.time()))
        mark = time.time()
        results["backfill beside the stream"] = backfill(settings, DAY, "beside", logs)
        phases.append(("one backfill", mark, time.time()))
        time.sleep(10)
        halves = [
            Window(DAY.start, DAY.start.add(hours=12)),
            Window(DAY.start.add(hours=12), DAY.end),
        ]
        mark = time.time()
        pair: list[dict] = []
        threads = [
            threading.Thread(
                target=lambda w=w, i=i: pair.append(backfill(settings, w, f"half-{i}", logs))
            )
            for i, w in enumerate(halves)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        phases.append(("two backfills", mark, time.time()))
        results["two backfills at once"] = {
            "seconds": time.time() - mark,
            "cpu": sum(p["cpu"] for p in pair),
        }
        mark = time.time()
        time.sleep(args.quiet)
        phases.append(("stream alone", mark, time.time()))
    finally:
        stop.set()
        producer.join()
        # Paused once it has written what was produced.
        store.commands.submit("pause", {"note": "benchmark done"}, issuer="bench")
        job.join(timeout=300)
        runner.close()
    close_epoch(settings, stream)
    results["backfill alone"] = backfill(settings, DAY, "alone", logs)

    published: dict[int, tuple[list[int], list[float]]] = {}
    for bucket, first, _, at in sorted(appended):
        bases, times = published.setdefault(bucket, ([], []))
        bases.append(first)
        times.append(at)
    by_phase: dict[str, list[float]] = {}
    for commit in sink_commits(settings.sink, settings.pipeline):
        if commit.epoch != stream:
            continue
        visible = commit.committed_at_ms / 1000
        for bucket, end in commit.end.items():
            bases, times = published.get(bucket, ([], []))
            for offset in range(commit.start.get(bucket, end), end):
                index = bisect.bisect_right(bases, offset) - 1
                if index < 0:
                    continue
                at = times[index]
                for name, lo, hi in phases:
                    if lo <= at < hi:
                        by_phase.setdefault(name, []).append(visible - at)
    report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
    totals = report.totals
    assert (totals.missing, totals.duplicated, totals.out_of_range) == (0, 0, 0), totals

    print(f"records: {args.records:,} of one day; live rate {args.rate:,.0f}/s")
    print("| run | wall (s) | records/s | CPU (s) |")
    print("|---|---|---|---|")
    for name, run in results.items():
        rate = args.records / run["seconds"]
        print(f"| {name} | {run['seconds']:.1f} | {rate:,.0f} | {run['cpu']:.1f} |")
    print()
    print("| live records published while | records | p50 (ms) | p99 (ms) | max (ms) |")
    print("|---|---|---|---|---|")
    for name in ("stream alone", "one backfill", "two backfills"):
        latencies = sorted(by_phase.get(name, []))
        if not latencies:
            print(f"| {name} | 0 | | | |")
            continue
        s = latency_summary(latencies)
        print(
            f"| {name} | {s['records']:,} | {s['p50'] * 1000:.0f} | {s['p99'] * 1000:.0f} "
            f"| {s['max'] * 1000:.0f} |"
        )
    print(json.dumps({"audit": totals.__dict__, "results": results}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
