"""Benchmark: plan a batch epoch over 10 000 buckets holding 100 M backlog records.

Run: /work/main/.venv/bin/python bench/bench_planning.py [--repeat N] [--max-split-records N]
     [--wave-records N] [--parallelism N]

The log is skewed: bucket 0 holds half the backlog, the rest is spread unevenly over the
other buckets; 1 in 10 buckets is already drained. Prints the best and median wall time of
plan_batch, then of a re-plan after a failure halfway (plan_batch from there), and the plan's
shape and balance.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from modeswitch.control.planning import BatchPlan, plan_batch

BUCKETS = 10_000
BACKLOG = 100_000_000
SIZES = {"max_split_records": 1_000_000, "wave_records": 10_000_000, "parallelism": 16}


def skewed_log(seed: int = 7) -> tuple[dict[int, int], dict[int, int]]:
    """``(committed, latest)``: bucket 0 has half the backlog; every 10th bucket is empty."""
    rng = random.Random(seed)
    committed = {b: rng.randrange(0, 1_000_000) for b in range(BUCKETS)}
    weights = [0.0] + [0.0 if b % 10 == 0 else rng.random() for b in range(1, BUCKETS)]
    scale = (BACKLOG // 2) / sum(weights)
    backlog = [int(w * scale) for w in weights]
    backlog[0] = BACKLOG - sum(backlog)
    latest = {b: committed[b] + backlog[b] for b in range(BUCKETS)}
    return committed, latest


def timed(action: Callable[[], BatchPlan], repeat: int) -> tuple[list[float], BatchPlan]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = action()
        times.append(time.perf_counter() - started)
    assert result is not None
    return times, result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    for name, default in SIZES.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    args = parser.parse_args(argv)
    sizes = {name: getattr(args, name) for name in SIZES}

    committed, latest = skewed_log()
    times, plan = timed(lambda: plan_batch(committed, latest, **sizes), args.repeat)
    total = plan.total_records
    splits = len(plan.splits)
    print(
        f"plan_batch: {BUCKETS} buckets, {total:,} records, {sizes}\n"
        f"  best {min(times):.3f} s, median {statistics.median(times):.3f} s "
        f"over {args.repeat} runs\n"
        f"  {len(plan.waves)} waves, {splits:,} splits, "
        f"{len(plan.finished_buckets)} buckets already finished\n"
        f"  makespan {plan.makespan:,} records vs ideal {plan.ideal_makespan:,.0f} "
        f"({plan.makespan / plan.ideal_makespan:.4f} x)"
    )

    halfway = plan.committed_after(plan.waves[len(plan.waves) // 2].index)
    after = plan.waves[-1].index + 1
    times, replan = timed(
        lambda: plan_batch(halfway, latest, **sizes, first_wave_index=after), args.repeat
    )
    print(
        f"re-plan after a failure halfway ({replan.total_records:,} records left):\n"
        f"  best {min(times):.3f} s, median {statistics.median(times):.3f} s"
    )


if __name__ == "__main__":
    main()
