"""Benchmark: the handoff under ``make airflow`` with the default settings, the README's path
into Airflow (the real scheduler, triggerer and API server of ``airflow standalone``).

    .venv/bin/python bench/bench_airflow_handoff.py [--rounds 3] [--records 1000000]
        [--json FILE] [--workdir DIR]

Each round starts ``python -m modeswitch.devtools.airflow_local HOME`` (what ``make airflow``
runs) in a process group of its own, with only ``source`` and ``warehouse`` set (Variables, as
a user points the pipeline at their data): every other setting is its default, the engine too
(``auto``). The source is the demo's skewed backlog of ``--records`` in 16 buckets with its
live producer. The round unpauses ``modeswitch_pipeline`` (as a user does in the UI) and
waits for its first batch → stream handoff; then it appends a burst of ``--records`` / 4 and
queues ``switch_to_batch`` (the page's button), and waits for the second handoff. Then it
stops ``make airflow`` as Ctrl-C does (SIGTERM to its leader) and checks that no process of
the round is left, the engine included.

A handoff is a batch's last sink commit to the next stream's first (commitInfo timestamps in
the sink's Delta log). Reported with the runner the tasks chose (their logs say it), the
time from the unpause to the first commit, the first batch epoch (its opening to its last
commit), whether the stream task was seen deferred in the metadata DB, and medians with the
spread, for docs/BENCHMARKS.md. Target (issue 36): every handoff <= 3 s, the first included.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

from modeswitch.airflow.tasks import submit_control_command
from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.airflow_local import airflow_environment
from modeswitch.devtools.demo import demo_sources
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.ops.handoffs import handoffs
from modeswitch.runners.processes import start_group, stop_group
from modeswitch.sinks.commits import sink_commits
from modeswitch.state import StateStore

AIRFLOW = Path(sys.executable).parent / "airflow"


def _handoffs(settings: PipelineSettings) -> list[tuple[float, str]]:
    """Each batch → stream handoff in the sink's log: seconds, and when (the stream's commit)."""
    return [(seconds, str(at)) for seconds, at in handoffs(settings.sink, settings.pipeline)]


def _wait(what: str, check, timeout: float, leader: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if leader.poll() is not None:
            raise SystemExit(f"make airflow exited ({leader.returncode}) while waiting for {what}")
        found = check()
        if found:
            return found
        time.sleep(1)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def _paused(database: Path) -> bool | None:
    """Whether the pipeline DAG is paused (None: not parsed yet), from the metadata DB."""
    if not database.exists():
        return None
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        try:
            rows = db.execute(
                "SELECT is_paused FROM dag WHERE dag_id = 'modeswitch_pipeline'"
            ).fetchall()
        except sqlite3.OperationalError:  # the tables are not there yet
            return None
    return bool(rows[0][0]) if rows else None


def _stream_deferred(database: Path) -> bool:
    """Whether a stream task is deferred now (waiting in the triggerer on the engine)."""
    query = (
        "SELECT count(*) FROM task_instance WHERE dag_id = 'modeswitch_pipeline' "
        "AND task_id = 'stream' AND state = 'deferred'"
    )
    with (
        contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db,
        contextlib.suppress(sqlite3.OperationalError),  # locked: not seen this time
    ):
        return bool(db.execute(query).fetchone()[0])
    return False


def _first_batch_seconds(settings: PipelineSettings) -> float:
    """The first batch epoch: from its opening (the epochs table) to its last sink commit."""
    first = StateStore.from_settings(settings).epochs.list()[0]
    commits = sink_commits(settings.sink, settings.pipeline)
    last = max(c.committed_at_ms for c in commits if c.epoch == first.id)
    return round(last / 1000 - first.started_at.timestamp(), 1)


def _runner_choices(home: Path) -> list[str]:
    """What the epoch tasks' logs say about the runner they chose."""
    said = set()
    for log in (home / "logs").rglob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "engine = " in line:
                start = line.index("engine = ")
                said.add(line[start : line.index('"', start) if '"' in line[start:] else None])
    return sorted(said)


def one_round(root: Path, records: int, console: Console) -> dict:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    home = root / "airflow"
    variables = {"source": str(root / "log"), "warehouse": str(root / "warehouse")}
    settings = PipelineSettings.from_mapping(variables)
    env = {
        **os.environ,
        **airflow_environment(home, variables=variables),
    }
    port = os.environ.get("BENCH_AIRFLOW_PORT")  # make airflow's own: 8080
    if port:
        env["AIRFLOW__API__PORT"] = port
        env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = f"http://localhost:{port}/execution/"
    with demo_sources(settings, records=records, buckets=16, console=console) as log:
        with open(root / "make-airflow.log", "wb") as out:
            leader = start_group(
                [sys.executable, "-m", "modeswitch.devtools.airflow_local", str(home)], env, out
            )
        try:
            database = home / "airflow.db"
            _wait(
                "the pipeline DAG to be parsed", lambda: _paused(database) is not None, 300, leader
            )
            subprocess.run(
                [str(AIRFLOW), "dags", "unpause", "modeswitch_pipeline"],
                env=env,
                capture_output=True,
                check=True,
            )
            assert _paused(database) is False
            unpaused = time.time()
            console.print("modeswitch_pipeline unpaused")
            first = _wait("the first handoff", lambda: _handoffs(settings), 600, leader)
            first_commit_s = (
                min(c.committed_at_ms for c in sink_commits(settings.sink, settings.pipeline))
                / 1000
                - unpaused
            )
            console.print(f"handoff 1: {first[0][0]:.1f} s")
            burst = EventGenerator(seed=11, buckets=16, skew="zipf:1.1")
            produce_backlog(log, burst, records=records // 4, first=50_000_000)
            submit_control_command(
                {"command": "switch_to_batch", "note": "bench"}, settings=settings
            )
            deferred = []

            def second_handoff():
                deferred.append(_stream_deferred(database))
                return _handoffs(settings)[1:]

            second = _wait("the second handoff", second_handoff, 900, leader)
            console.print(f"handoff 2: {second[0][0]:.1f} s")
        finally:
            leader.send_signal(15)  # Ctrl-C's way: standalone stops Airflow, then the engines
            try:
                leader.wait(120)
            finally:
                stop_group(leader, grace=5)
    left = _left(home)
    return {
        "runner": "; ".join(_runner_choices(home)),
        "first_commit_after_unpause_s": round(first_commit_s, 1),
        "handoff_1_s": first[0][0],
        "handoff_2_s": second[0][0],
        "first_batch_s": _first_batch_seconds(settings),
        "stream_task_seen_deferred": any(deferred),
        "processes_left": left,
    }


def _left(home: Path, wait: float = 30.0) -> list[str]:
    """The processes of the round still there ``wait`` seconds after ``make airflow`` exited
    (zombies aside): their command lines."""
    deadline = time.monotonic() + wait
    while True:
        left = []
        for process in psutil.process_iter(["environ", "cmdline", "status"]):
            environ = process.info["environ"] or {}
            if environ.get("AIRFLOW_HOME") != str(home.resolve()):
                continue
            if process.info["status"] != psutil.STATUS_ZOMBIE:
                left.append(" ".join(process.info["cmdline"] or [])[:160])
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--json", help="write every round's figures here")
    parser.add_argument("--workdir", help="keep the rounds (logs, tables) here")
    args = parser.parse_args(argv)
    console = Console()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-airflow-handoff-"))
    results = []
    try:
        for number in range(args.rounds):
            result = one_round(work / f"round-{number}", args.records, console)
            console.print(result)
            results.append(result)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    table = Table(title=f"make airflow, default settings (s), medians of {args.rounds} (spread)")
    columns = {
        "first commit after unpause": "first_commit_after_unpause_s",
        "first batch epoch": "first_batch_s",
        "handoff 1": "handoff_1_s",
        "handoff 2": "handoff_2_s",
    }
    for column in columns:
        table.add_column(column)
    table.add_row(*(spread([r[k] for r in results]) for k in columns.values()))
    console.print(table)
    deferred = sum(r["stream_task_seen_deferred"] for r in results)
    console.print(f"stream task seen deferred in {deferred} of {len(results)} rounds")
    console.print("runners chosen:", sorted({r["runner"] for r in results}))
    leaks = [r["processes_left"] for r in results if r["processes_left"]]
    if leaks:
        console.print(f"[red]processes left after make airflow stopped: {leaks}[/red]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
