"""Benchmark: 1, 2, 4 and 8 pipelines live at once, on one shared engine and on an engine each.

    .venv/bin/python bench/bench_fleet.py [--counts 1,2,4,8] [--sharing deployment,pipeline]
        [--rate 1000] [--live 60] [--idle 20] [--trigger 100ms] [--stream-writer auto]

For each count and each way of running engines (``MODESWITCH_ENGINE_SHARING``: ``deployment``,
one warm engine serving every pipeline, a lane and a FAIR scheduler pool each; ``pipeline``, an
engine each), the pipelines run as ``modeswitch run --pipelines`` runs them
(:func:`~modeswitch.runners.pipeline_run.run_pipelines`, the demo's event payload, a 100 ms
trigger unless ``--trigger`` says otherwise): each pipeline its own embedded log (2 buckets,
a 5 000-record backlog) and a live producer at ``--rate`` records/s. Each drains its backlog
in a batch epoch, the engine hands it to its stream, and after a 15 s settling time the
measure runs for ``--live`` seconds:

- every pipeline's latency, from each record's append (the producer notes it) to its sink
  commit (the commit's timestamp), p50 and p99 (``bench_modes``' measure);
- the memory of every process of the engines (drivers, JVMs, Python workers: the sum of their
  PSS, sampled every second; the median of the samples), and what each pipeline beyond the
  first adds to it;
- then the producers stop and, the streams still live with nothing to read, the engines' CPU
  for ``--idle`` seconds (CPU-seconds per second: cores), and what each pipeline beyond the
  first adds.

Targets (issue 56): 4 pipelines on a shared engine each at p99 <= 1 s; each added live
pipeline <= 150 MB and <= 0.05 of a core while idle; 8 pipelines run at all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import psutil
from bench_modes import latency_summary, record_latencies

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.demo import DEMO_SETTINGS
from modeswitch.devtools.produce import EventGenerator, produce_backlog, produce_live
from modeswitch.environment import ENGINE_DIR, ENGINE_SHARING
from modeswitch.runners.pipeline_run import run_pipelines
from modeswitch.sinks.commits import sink_commits
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore

BUCKETS = 2
BACKLOG = 5_000
SETTLE = 15.0


def engine_processes() -> list[psutil.Process]:
    """This process's engines and everything under them (drivers, JVMs, Python workers)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if any("jobs/engine.py" in part for part in child.cmdline()):
                found.append(child)
                found.extend(child.children(recursive=True))
        except psutil.Error:
            continue
    return found


def pss_mb() -> float:
    """The engines' memory: the sum of their processes' PSS (a page shared by N processes
    counts 1/N in each: forked Python workers are not counted twice)."""
    total = 0
    for process in engine_processes():
        try:
            total += process.memory_full_info().pss
        except psutil.Error:
            continue
    return total / 2**20


def cpu_seconds() -> float:
    total = 0.0
    for process in engine_processes():
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def run_once(
    root: Path,
    count: int,
    sharing: str,
    rate: float,
    live: float,
    idle: float,
    trigger: str = "100ms",
    stream_writer: str = "auto",
) -> dict:
    os.environ[ENGINE_SHARING.name] = sharing
    os.environ[ENGINE_DIR.name] = str(root / "engines")
    pipelines = []
    appended: dict[str, list] = {}
    stop = threading.Event()
    producers = []
    for n in range(count):
        name = f"p{n}"
        log = SegmentLog.create(str(root / name / "log"), buckets=BUCKETS)
        produce_backlog(log, EventGenerator(seed=n, buckets=BUCKETS), records=BACKLOG)
        settings = {
            **DEMO_SETTINGS,
            "pipeline": name,
            "source": str(root / name / "log"),
            "warehouse": str(root / name / "warehouse"),
            "engine": "warm",
            "trigger_interval": trigger,
            "stream_writer": stream_writer,
            "max_records_per_trigger": "100000",
            "max_stream_runtime": "1h",
            "watermark_lag_threshold": "1h",
            "enter_threshold": "1h",
            "exit_threshold": "30m",
        }
        pipelines.append(PipelineSettings.from_mapping(settings))
        notes = appended[name] = []
        producers.append(
            threading.Thread(
                target=produce_live,
                args=(log, EventGenerator(seed=100 + n, buckets=BUCKETS)),
                kwargs={
                    "rate": rate,
                    "duration": timedelta(hours=1),
                    "first": 10_000_000,
                    "flush_every": timedelta(milliseconds=50),
                    "should_stop": stop.is_set,
                    "on_append": lambda b, s, e, notes=notes: notes.append((b, s, e, time.time())),
                },
                daemon=True,
            )
        )
    for producer in producers:
        producer.start()
    samples: list[float] = []
    window: dict[str, float] = {}
    finished = threading.Event()

    def measure() -> None:
        # Wait until every pipeline streams, then settle, then measure.
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not finished.is_set():
            streaming = 0
            for s in pipelines:
                with contextlib.suppress(Exception):  # no sink yet
                    streaming += any(c.epoch >= 2 for c in sink_commits(s.sink, s.pipeline))
            if streaming == count:
                break
            time.sleep(1)
        window["streaming_at"] = time.time()
        time.sleep(SETTLE)
        window["live_from"] = time.time()
        end = time.monotonic() + live
        while time.monotonic() < end:
            samples.append(pss_mb())
            time.sleep(1)
        window["live_to"] = time.time()
        stop.set()  # the producers stop; the streams stay live with nothing to read
        time.sleep(5)
        before, at = cpu_seconds(), time.monotonic()
        time.sleep(idle)
        window["idle_cores"] = (cpu_seconds() - before) / (time.monotonic() - at)
        window["idle_pss_mb"] = pss_mb()
        finished.set()
        for s in pipelines:  # each stream ends at its next commit boundary, and its loop
            StateStore.from_settings(s).commands.submit("pause", {}, issuer="bench_fleet")

    measurer = threading.Thread(target=measure, daemon=True)
    measurer.start()
    started = time.monotonic()
    run_pipelines(pipelines, should_stop=finished.is_set, idle_wait=1.0)
    measurer.join()
    stop.set()
    results = {"count": count, "sharing": sharing, "seconds": time.monotonic() - started}
    per_pipeline = {}
    for s in pipelines:
        commits = [
            c
            for c in sink_commits(s.sink, s.pipeline)
            if c.committed_at_ms / 1000 <= window["live_to"]
        ]
        latencies = record_latencies(commits, appended[s.pipeline], window["live_from"])
        per_pipeline[s.pipeline] = latency_summary(latencies) if latencies else {}
    results["latency"] = per_pipeline
    results["pss_mb"] = statistics.median(samples) if samples else None
    results["idle_cores"] = window.get("idle_cores")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,2,4,8")
    parser.add_argument("--sharing", default="deployment,pipeline")
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--live", type=float, default=60.0)
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--trigger", default="100ms", help="the streams' trigger_interval")
    parser.add_argument("--stream-writer", default="auto", help="the streams' stream_writer")
    parser.add_argument("--json", help="write every result here too")
    args = parser.parse_args()
    results = []
    for count in (int(c) for c in args.counts.split(",")):
        for sharing in args.sharing.split(","):
            with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
                result = run_once(
                    Path(tmp),
                    count,
                    sharing,
                    args.rate,
                    args.live,
                    args.idle,
                    args.trigger,
                    args.stream_writer,
                )
            results.append(result)
            lat = result["latency"]
            p50s = [v["p50"] for v in lat.values() if v]
            p99s = [v["p99"] for v in lat.values() if v]
            print(
                f"{count} pipelines, engines {sharing}: p50 "
                f"{min(p50s) * 1000:.0f}-{max(p50s) * 1000:.0f} ms, p99 "
                f"{min(p99s) * 1000:.0f}-{max(p99s) * 1000:.0f} ms (each pipeline: "
                + ", ".join(
                    f"{name} {v['p50'] * 1000:.0f}/{v['p99'] * 1000:.0f}" if v else f"{name} -"
                    for name, v in lat.items()
                )
                + f"); memory {result['pss_mb']:.0f} MB; idle {result['idle_cores']:.3f} cores; "
                f"{result['seconds']:.0f} s in all",
                flush=True,
            )
    for sharing in args.sharing.split(","):
        mine = {r["count"]: r for r in results if r["sharing"] == sharing}
        if 1 in mine:
            for count, r in sorted(mine.items()):
                if count > 1:
                    added = (r["pss_mb"] - mine[1]["pss_mb"]) / (count - 1)
                    cores = (r["idle_cores"] - mine[1]["idle_cores"]) / (count - 1)
                    print(
                        f"engines {sharing}: each pipeline beyond the first, at {count}: "
                        f"{added:.0f} MB, {cores:.3f} cores idle"
                    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
