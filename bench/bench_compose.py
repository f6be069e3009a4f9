"""Benchmark: the batch job inside the compose stack, on its two-worker Spark cluster against
``local[*]``, on the same two cores.

    .venv/bin/python bench/bench_compose.py [--records 10000000] [--rounds 2]

Starts the stack if it is not up (the images as ``make compose-images`` built them), pauses
its pipeline DAG so that nothing else runs an epoch, and runs the rest in one ``tools``
container, with this folder mounted read-only at ``/bench``: a backlog of ``--records``
records in 16 buckets under ``/data/bench`` (the bind-mounted data folder, which the workers
see at the same path), then ``--rounds`` rounds of bench_modes.py's (a), alternating: a
batch epoch's job with ``MODESWITCH_SPARK_MASTER`` = the stack's master (its driver in the
tools container, its executors on the two workers, one core on each: the idle served engine
holds the other core of each, ``MODESWITCH_ENGINE_CORES``) and with ``local[*]``
(driver and executors in the tools container). Prints each run (records/s, wall seconds; the
CPU and memory columns count the job's own processes, which on the cluster leave out the
executors) and the cluster's rate over local's, run by run. The stack is stopped after if
this started it; the scratch folder is removed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLUSTER = "spark://spark-master:7077"
LOCAL = "local[*]"
SCRATCH = "bench"
"""The scratch folder, under the stack's data folder (``/data`` inside)."""


def inside(records: int, rounds: int) -> int:
    """In the tools container: the backlog, then the alternating runs."""
    sys.path.insert(0, str(HERE))
    import bench_modes

    from modeswitch.devtools.produce import EventGenerator, produce_backlog
    from modeswitch.sources.segments import SegmentLog

    scratch = Path("/data") / SCRATCH
    log = SegmentLog.create(str(scratch / "log"), buckets=bench_modes.BUCKETS)
    began = time.perf_counter()
    produce_backlog(
        log,
        EventGenerator(seed=1, buckets=bench_modes.BUCKETS, skew="zipf:1.1"),
        records=records,
        span=timedelta(hours=1),
    )
    print(f"backlog: {records:,} records in {time.perf_counter() - began:.0f} s", flush=True)
    rates: dict[str, list[float]] = {CLUSTER: [], LOCAL: []}
    for round_ in range(1, rounds + 1):
        order = (CLUSTER, LOCAL) if round_ % 2 else (LOCAL, CLUSTER)
        for master in order:
            os.environ["MODESWITCH_SPARK_MASTER"] = master
            name = f"{'cluster' if master == CLUSTER else 'local'}{round_}"
            run = bench_modes.run_batch(scratch, name, log.root)
            rates[master].append(run.rate)
            print(
                f"round {round_} {master}: {run.records:,} records in {run.seconds:.1f} s, "
                f"{run.rate:,.0f} records/s (driver side: {run.cpu_seconds:.0f} CPU-s, "
                f"peak {run.peak_mb:,.0f} MB)",
                flush=True,
            )
    ratios = [c / lo for c, lo in zip(rates[CLUSTER], rates[LOCAL], strict=True)]
    print("cluster / local[*], round by round: " + ", ".join(f"{r:.2f}x" for r in ratios))
    return 0


def outside(records: int, rounds: int) -> int:
    """On this host: the stack up (if it is not), the run in a tools container, cleanup."""
    from rich.console import Console

    from modeswitch.devtools.compose import FOLDER, Stack

    stack = Stack(console=Console())
    started_here = not stack.containers()
    if started_here:
        stack.up()
    # A stack left running may have its pipeline DAG unpaused: its decide tasks would run
    # beside the benchmark (a DAG not parsed yet is paused already: the error is ignored).
    stack.run("exec", "-T", "airflow-scheduler", "airflow", "dags", "pause",
              "modeswitch_pipeline", capture=True, check=False)  # fmt: skip
    scratch = FOLDER / "data" / SCRATCH
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        command = stack.command(
            "--profile", "tools", "run", "--rm", "-T", "--volume", f"{HERE}:/bench:ro",
            "tools", "python", "/bench/bench_compose.py", "--inside",
            "--records", str(records), "--rounds", str(rounds),
        )  # fmt: skip
        return subprocess.run(command, check=False).returncode
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if started_here:
            stack.down()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return (inside if args.inside else outside)(args.records, args.rounds)


if __name__ == "__main__":
    sys.exit(main())
