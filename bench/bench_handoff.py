"""Benchmark: the handoff on the Airflow path, spark-submit per epoch against the warm engine.

    .venv/bin/python bench/bench_handoff.py [--rounds 5] [--records 1000000] [--json FILE]
        [--engines submit,warm] [--workdir DIR]

Each round is a fresh pipeline run the way ``make demo`` runs it: a local Airflow (SQLite),
the demo's skewed backlog of ``--records`` in 16 buckets with its live producer, and four runs
of the ``modeswitch_pipeline`` DAG, each ``dag.test()`` in a child process: batch (the
backlog), stream (20 s), batch (a burst of ``--records`` / 4 appended after the stream), stream
(20 s). Rounds alternate ``engine = submit`` and ``engine = warm`` (``--rounds`` of each); with
``warm`` the round starts with no engine, so the first batch task starts it, as the first epoch
of a deployment would, and the second handoff is the engine's steady state.

Per round, from the sink's Delta log and the control tables: each **handoff** (a batch's last
commit to the next stream's first, commitInfo timestamps), each **batch epoch** (its epoch's
start to end) and the DAG runs' wall time. Reported as medians with the spread, for
docs/BENCHMARKS.md. Targets (issue 20): handoff <= 3 s on the Airflow path; batch epoch no
more than 5 % slower with the warm engine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.airflow_demo import AIRFLOW_DEMO_SETTINGS
from modeswitch.devtools.airflow_local import airflow_environment, migrate
from modeswitch.devtools.demo import demo_sources
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.runners.engine import ENGINE_DIR_ENV, stop_engine
from modeswitch.runners.processes import run_process_group
from modeswitch.sinks.commits import sink_commits
from modeswitch.state import StateStore

FIGURES = ("handoff_1_s", "handoff_2_s", "batch_1_s", "batch_2_s", "runs_s")


def one_round(root: Path, engine: str, records: int, console: Console) -> dict:
    shutil.rmtree(root, ignore_errors=True)
    (root / "logs").mkdir(parents=True)
    variables = {
        **AIRFLOW_DEMO_SETTINGS,
        "source": str(root / "log"),
        "warehouse": str(root / "warehouse"),
        "max_stream_runtime": "20s",
        "engine": engine,
    }
    settings = PipelineSettings.from_mapping(variables)
    os.environ[ENGINE_DIR_ENV] = str(root / "engines")  # this round's engine, and its children's
    env = airflow_environment(root / "airflow", variables=variables)
    migrate(env)
    walls = []
    try:
        with demo_sources(settings, records=records, buckets=16, console=console) as log:
            for number, mode in enumerate(["batch", "stream", "batch", "stream"], start=1):
                if number == 3:
                    burst = EventGenerator(seed=11, buckets=16, skew="zipf:1.1")
                    produce_backlog(log, burst, records=records // 4, first=50_000_000)
                began = time.monotonic()
                child = [sys.executable, "-m", "modeswitch.devtools.airflow_demo", "--run-dag"]
                code = run_process_group(
                    [*child, json.dumps({"force_mode": mode})],
                    env=env,
                    timeout=900,
                    log_file=root / "logs" / f"run-{number}.log",
                )
                walls.append(time.monotonic() - began)
                if code != 0:
                    raise SystemExit(f"{engine} round: DAG run {number} failed; see {root}/logs")
    finally:
        stop_engine(settings)  # the first batch task started it; it outlives the DAG runs
    commits = sorted(sink_commits(settings.sink, settings.pipeline), key=lambda c: c.table_version)
    handoffs = [
        (after.committed_at_ms - before.committed_at_ms) / 1000
        for before, after in itertools.pairwise(commits)
        if (before.mode, after.mode) == ("batch", "stream")
    ]
    epochs = StateStore.from_settings(settings).epochs.list()
    batches = [e for e in epochs if e.mode == "batch"]
    assert len(handoffs) == 2 and len(batches) == 2, (handoffs, [e.mode for e in epochs])
    return {
        "engine": engine,
        "handoff_1_s": handoffs[0],
        "handoff_2_s": handoffs[1],
        "batch_1_s": (batches[0].ended_at - batches[0].started_at).total_seconds(),
        "batch_2_s": (batches[1].ended_at - batches[1].started_at).total_seconds(),
        "runs_s": round(sum(walls), 1),
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--json", help="write every round's figures here")
    parser.add_argument("--engines", default="submit,warm", help="which, in this order")
    parser.add_argument("--workdir", help="keep the rounds (logs, tables) here")
    args = parser.parse_args(argv)
    console = Console()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-handoff-"))
    results = []
    try:
        for number in range(args.rounds):
            for engine in args.engines.split(","):
                result = one_round(work / f"{engine}-{number}", engine, args.records, console)
                console.print(result)
                results.append(result)
                if args.json:
                    Path(args.json).write_text(json.dumps(results, indent=1))
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    title = f"the Airflow path (s), medians of {args.rounds} alternating rounds (spread)"
    table = Table(title=title)
    for column in ("engine", "handoff 1", "handoff 2", "batch 1", "batch 2", "4 DAG runs"):
        table.add_column(column)
    for engine in args.engines.split(","):
        mine = [r for r in results if r["engine"] == engine]
        table.add_row(
            engine,
            *(spread([r[k] for r in mine]) for k in FIGURES),
        )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
