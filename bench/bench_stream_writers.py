"""Benchmark: the two stream writers on the live-latency run of ``bench_modes.py``.

    .venv/bin/python bench/bench_stream_writers.py [--runs 5] [--latency-seconds 30]

Each run is ``bench_modes.py``'s ``latency`` case (a batch epoch over 500 000 records, then
the stream job live at 5 000 records/s, 100 ms trigger, the standby on), with
``stream_writer`` = ``python`` (the ``modeswitch_delta`` data source: pyarrow files, one
delta-rs commit) or ``delta_spark`` (delta-spark's writer in ``foreachBatch`` with
``txnAppId``/``txnVersion``). Runs alternate between the two, so that the machine's drift
falls on both alike; the table gives each run and the medians per writer: record latency
(commit landed - append published) p50 / p99, and the handoff (the batch's last commit to the
stream's first).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from bench_modes import run_latency  # bench/ is on the path: run as a script

WRITERS = ("python", "delta_spark")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="runs per writer")
    parser.add_argument("--latency-seconds", type=float, default=30)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args(argv)
    root = Path(args.dir or tempfile.mkdtemp(prefix="modeswitch-bench-writers-"))
    results: dict[str, list[dict]] = {w: [] for w in WRITERS}
    print("| run | stream_writer | p50 ms | p99 ms | handoff s | records |")
    print("|---|---|---|---|---|---|")
    for number in range(args.runs):
        order = WRITERS if number % 2 == 0 else WRITERS[::-1]
        for writer in order:
            os.environ["BENCH_STREAM_WRITER"] = writer
            scratch = root / f"{number}-{writer}"
            scratch.mkdir(parents=True)
            result = run_latency(scratch, args.latency_seconds)
            results[writer].append(result)
            print(
                f"| {number + 1} | {writer} | {result['p50'] * 1000:.0f} | "
                f"{result['p99'] * 1000:.0f} | {result['handoff']:.1f} | {result['records']:,} |",
                flush=True,
            )
    print()
    print("| stream_writer | runs | p50 ms (median) | p99 ms (median) | handoff s (median) |")
    print("|---|---|---|---|---|")
    for writer, runs in results.items():
        print(
            f"| {writer} | {len(runs)} | {statistics.median(r['p50'] for r in runs) * 1000:.0f} "
            f"| {statistics.median(r['p99'] for r in runs) * 1000:.0f} "
            f"| {statistics.median(r['handoff'] for r in runs):.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
