"""Benchmark: a backlog of 100 M records in 1 000 buckets against one of 10 M (issue 36's scale).

    .venv/bin/python bench/bench_scale.py [--records 100000000] [--base 10000000]
        [--buckets 1000] [--skew zipf:1.1] [--wave-records 10000000] [--calls 20]
        [--workdir DIR] [--json FILE]

Two embedded logs of ``--buckets`` buckets with the demo's events and skew (Zipf 1.1: bucket
0 holds ~18 % of the records, bucket 999 ~0.009 %), one of ``--base`` records and one of
``--records``; on each, what a user's first epoch does:

1. ``decide`` opens a batch epoch over the whole backlog (timed: the boundary of every bucket);
2. the batch job (``jobs/backlog_batch.py``, a ``spark-submit`` as ``bench_modes.py``'s (a), the
   same settings: splits of 1 M records, parallelism 2, the Arrow parse) drains it: wall time
   from the process's start to its exit, the peak of the process tree's summed PSS, its CPU,
   and the job's own log line for its plan (planned and recorded in the split ledger);
3. ``close_epoch``, then ``decide`` again as the DAG's next run would (``dry_run``: timed
   ``--calls`` times, nothing opened), with the batch's history in the control tables;
4. the operator's view of the pipeline: ``pipeline_status`` in this process, and the operator
   app's ``/api/status`` (FastAPI's test client, Airflow's auth replaced by a no-op) whole
   (every bucket) and as the page asks for it (``bucket_order=lag&bucket_limit=50``: the 50
   worst-lagging buckets and the summary of all), ``--calls`` each; with the answer's size.

Targets (issue 36): (a) at 100 M >= 0.9 x its rate at 10 M, peak memory <= 1.2 x, planning
< 1 s, ``decide`` <= 2 s, the status API p95 <= 300 ms. Producing the logs is timed and their
size on disk reported (what such a backlog costs here). ``--workdir`` keeps the logs (and
reuses a log that already holds its records: a second run skips producing); the sinks are
made anew on every run. Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bench_modes
from bench_modes import PeakMemory, finish, settings_for, start
from bench_status import operator_app, timed

from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import job_command
from modeswitch.sources.segments import SegmentLog

PLANNED = re.compile(
    r"records to read in (\d+) waves.*?(\d+) splits of (\d+) buckets .*? in ([\d.]+) s"
)
CHUNK = 4_194_304
"""Records generated and appended at a time: with 1 000 buckets a smaller chunk rewrites every
bucket's open segment more often (the tail buckets get a few hundred records a chunk)."""


def folder_size(root: Path) -> tuple[int, int]:
    """(bytes, files) under ``root``."""
    files = [p for p in root.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def the_log(root: Path, records: int, buckets: int, skew: str) -> tuple[SegmentLog, dict]:
    """A log of ``records`` events in ``buckets`` buckets: reused when ``root`` holds one
    already, else made anew (timed)."""
    if root.exists():
        log = SegmentLog(str(root))
        latest = log.latest_offsets()
        if len(latest) == buckets and sum(latest.values()) == records:
            size, files = folder_size(root)
            return log, {"produced_seconds": None, "bytes": size, "files": files}
        shutil.rmtree(root)
    log = SegmentLog.create(str(root), buckets=buckets)
    generator = EventGenerator(seed=36, buckets=buckets, skew=skew)
    report = produce_backlog(log, generator, records=records, chunk=CHUNK)
    size, files = folder_size(root)
    return log, {"produced_seconds": report.seconds, "bytes": size, "files": files}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def views(settings, calls: int) -> dict:
    """The operator's view: ``pipeline_status`` and the app's status route, ``calls`` each."""
    from fastapi.testclient import TestClient

    from modeswitch.ops.status import pipeline_status

    app = operator_app(settings)
    every = len(SegmentLog(settings.source).latest_offsets())
    found = {"pipeline_status()": timed(lambda: pipeline_status(settings), calls)}
    sizes = {}
    with TestClient(app) as http:
        for name, query in (
            ("GET /api/status (every bucket)", ""),
            ("GET /api/status (the page: 50 worst)", "?bucket_order=lag&bucket_limit=50"),
        ):

            def get(query=query, name=name) -> None:
                answer = http.get(f"/api/status{query}")
                assert answer.status_code == 200, answer.text
                sizes[name] = len(answer.content)
                shown = answer.json()["bucket_summary"]["shown"]
                assert shown == (50 if query else every), shown

            found[name] = timed(get, calls)
    return {
        name: {
            "p50_ms": statistics.median(ms),
            "p95_ms": percentile(ms, 0.95),
            "max_ms": max(ms),
            "bytes": sizes.get(name),
        }
        for name, ms in found.items()
    }


def run(workdir: Path, log: SegmentLog, name: str, calls: int) -> dict:
    warehouse = workdir / name
    shutil.rmtree(warehouse, ignore_errors=True)
    settings = settings_for(workdir, name, log.root)
    began = time.perf_counter()
    plan = decide(settings, force_mode="batch", decided_by="bench")
    decide_first = time.perf_counter() - began
    records = sum(plan.boundary.values())
    logs = workdir / "job-logs"
    bench_modes.LOGS = logs
    before = set(logs.glob("*.log")) if logs.exists() else set()
    began = time.perf_counter()
    process = start(job_command("batch", settings, plan.epoch))
    memory = PeakMemory(process.pid)
    code = finish(process)
    seconds = time.perf_counter() - began
    job = memory.result(name, records, seconds)
    (job_log,) = set(logs.glob("*.log")) - before
    assert code == 0, f"batch job exited {code}: see {job_log}"
    planned = PLANNED.search(job_log.read_text())
    assert planned, f"no plan line in {job_log}"
    close_epoch(settings, plan.epoch)
    decide_next = [
        ms / 1000
        for ms in timed(
            lambda: decide(settings, dry_run=True, decided_by="bench"), max(3, calls // 4)
        )
    ]
    sink_bytes, sink_files = folder_size(Path(settings.sink))
    return {
        "records": records,
        "buckets": len(plan.boundary),
        "seconds": seconds,
        "records_per_second": job.rate,
        "cpu_seconds": job.cpu_seconds,
        "peak_mb": job.peak_mb,
        "peak_by_kind": job.peak_by_kind,
        "waves": int(planned.group(1)),
        "splits": int(planned.group(2)),
        "plan_seconds": float(planned.group(4)),
        "decide_first_seconds": decide_first,
        "decide_next_seconds": {"median": statistics.median(decide_next), "max": max(decide_next)},
        "sink_bytes": sink_bytes,
        "sink_files": sink_files,
        "views": views(settings, calls),
        "job_log": str(job_log),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=100_000_000)
    parser.add_argument("--base", type=int, default=10_000_000)
    parser.add_argument("--buckets", type=int, default=1000)
    parser.add_argument("--skew", default="zipf:1.1")
    parser.add_argument("--wave-records", default="10000000", help="the setting's default")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--workdir", help="keep the logs here (and reuse them)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    bench_modes.WAVE_RECORDS = args.wave_records
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict = {"buckets": args.buckets, "skew": args.skew, "wave_records": args.wave_records}
    try:
        for records in (args.base, args.records):
            label = f"{records // 1_000_000} M" if records >= 1_000_000 else str(records)
            log, made = the_log(workdir / f"log-{records}", records, args.buckets, args.skew)
            print(
                f"log of {label} records: {made['bytes'] / 2**30:.2f} GiB in {made['files']} files"
                + (
                    f", produced in {made['produced_seconds']:.0f} s"
                    if made["produced_seconds"] is not None
                    else " (reused)"
                ),
                flush=True,
            )
            result = {"log": made, **run(workdir, log, f"scale_{records}", args.calls)}
            results[str(records)] = result
            print(json.dumps(result, indent=1), flush=True)
        base, big = results[str(args.base)], results[str(args.records)]
        ratios = {
            "rate": big["records_per_second"] / base["records_per_second"],
            "peak": big["peak_mb"] / base["peak_mb"],
        }
        results["ratios"] = ratios
        print(
            f"\n(a) at {args.records:,} against {args.base:,} records, {args.buckets} buckets: "
            f"rate x{ratios['rate']:.2f} (target >= 0.9), peak memory x{ratios['peak']:.2f} "
            f"(target <= 1.2); plan {big['plan_seconds']:.2f} s (< 1 s); decide "
            f"{big['decide_first_seconds']:.2f} s first, {big['decide_next_seconds']['max']:.2f} s"
            " at most after the batch (<= 2 s)",
            flush=True,
        )
        for name, view in big["views"].items():
            print(
                f"  {name}: p50 {view['p50_ms']:.0f} ms, p95 {view['p95_ms']:.0f} ms "
                f"(<= 300), {view['bytes'] or 0:,} bytes",
                flush=True,
            )
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
