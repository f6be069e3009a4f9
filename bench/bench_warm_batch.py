"""Benchmark: the batch path on the warm engine, an epoch of 10 M records on an engine already up.

    .venv/bin/python bench/bench_warm_batch.py [--records 10000000] [--rounds 3]
        [--first 1000000] [--wave-records 2000000] [--json FILE] [--workdir DIR]

Issue 36's target (a) on the warm engine: drain >= 1 000 000 records/s on two cores once the
engine is up. One engine (``engine = warm``, ``modeswitch.runners.pipeline_run.open_runner``: the
engine ``modeswitch run`` starts, on the local master) runs every epoch of one pipeline:

1. a first batch epoch over ``--first`` records starts the engine (its JVM, its Python
   workers, the first compilations) and is reported apart;
2. then ``--rounds`` times: ``--records`` more records are appended to the log (16 buckets,
   the demo's Zipf 1.1 skew, as ``bench_modes.py``'s (a)), and a batch epoch drains them.

After each batch the engine hands over to a stream epoch itself, as it does for the DAG; the
stream runs 2 s (``max_stream_runtime``) and is closed before the next records are appended.

Each epoch's wall time is the runner's ``run`` (the epoch handed to the engine, to its end:
plan, every wave's read, parse, write and commit), its CPU the engine's whole process tree
over it (driver, JVM, Python workers). The settings are ``bench_modes.py``'s (a): waves of
2 M records, splits of 1 M, parallelism 2, the Arrow parse of the demo's events.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import psutil
from bench_modes import BUCKETS, settings_for

from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.runners.engine import live_engine
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.pipeline_run import open_runner
from modeswitch.sources.segments import SegmentLog


def tree_cpu(pid: int) -> float:
    """CPU seconds used so far by ``pid`` and every process under it that still runs."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        for process in [root, *root.children(recursive=True)]:
            try:
                times = process.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return total


def batch_epoch(runner, settings, label: str) -> dict:
    plan = decide(settings, force_mode="batch", decided_by="bench")
    records = sum(plan.boundary.values()) - sum(plan.start.values())
    address = live_engine(settings)
    cpu = tree_cpu(address.pid) if address else 0.0
    began = time.perf_counter()
    runner.start("batch", settings, plan.epoch).wait()
    seconds = time.perf_counter() - began
    address = live_engine(settings)
    cpu = tree_cpu(address.pid) - cpu if address else float("nan")
    status, _ = close_epoch(settings, plan.epoch)
    assert status == "completed", status
    # The engine hands a drained batch over to a stream epoch itself: let it end (its
    # max_stream_runtime is short here) before more records are appended.
    after = decide(settings, decided_by="bench")
    if after.mode == "stream" and after.epoch is not None:
        runner.start("stream", settings, after.epoch).wait()
        close_epoch(settings, after.epoch)
    result = {
        "epoch": label,
        "records": records,
        "seconds": round(seconds, 2),
        "records_per_s": round(records / seconds),
        "cpu_s": round(cpu, 1),
    }
    print(json.dumps(result), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--first", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--wave-records", default=None, help="default: the setting's (before session 45: 2 M)"
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--workdir", help="default: a temporary folder, removed at the end")
    args = parser.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-warm-"))
    results = []
    try:
        log = SegmentLog.create(str(work / "log"), buckets=BUCKETS)
        generator = EventGenerator(seed=1, buckets=BUCKETS, skew="zipf:1.1")
        produce_backlog(log, generator, records=args.first, span=timedelta(hours=1))
        settings = settings_for(
            work,
            "warm",
            log.root,
            engine="warm",
            max_stream_runtime="2s",
            **({} if args.wave_records is None else {"wave_records": args.wave_records}),
        )
        with open_runner(settings, log_dir=work / "logs") as runner:
            results.append(batch_epoch(runner, settings, "first (starts the engine)"))
            for number in range(1, args.rounds + 1):
                began = time.perf_counter()
                produce_backlog(
                    log,
                    EventGenerator(seed=1 + number, buckets=BUCKETS, skew="zipf:1.1"),
                    records=args.records,
                    span=timedelta(hours=1),
                    first=args.first + (number - 1) * args.records,
                )
                print(f"appended {args.records:,} records in {time.perf_counter() - began:.0f} s")
                results.append(batch_epoch(runner, settings, f"warm {number}"))
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    warm = [r for r in results if r["epoch"].startswith("warm")]
    summary = {
        "records": args.records,
        "wave_records": settings.planner.wave_records,
        "warm_median_s": statistics.median(r["seconds"] for r in warm),
        "warm_median_records_per_s": round(statistics.median(r["records_per_s"] for r in warm)),
        "warm_median_cpu_s": statistics.median(r["cpu_s"] for r in warm),
        "runs": results,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
