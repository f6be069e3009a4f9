"""``make demo-fleet``: three pipelines of one deployment at the same time, under one Airflow.

1. A local Airflow (SQLite) under ``<dir>/airflow`` whose DAG factory reads the pipelines
   folder ``<dir>/pipelines``: one settings file per pipeline (:data:`FLEET`: different
   buckets, skews, live rates, backlogs and thresholds), so the deployment has each one's
   five DAGs beside ``modeswitch``'s. Each pipeline's log and tables are its own:
   ``<dir>/<pipeline>/log`` and ``<dir>/<pipeline>/warehouse``.
2. Each pipeline's backlog and live producer, and its burst at its own moment (or none).
3. Each pipeline's ``<pipeline>_pipeline`` DAG, one ``dag.test()`` run per epoch, the three
   pipelines' runs at the same time (a child process each, :class:`DagRuns`), their epochs in
   one warm engine that serves them all (``MODESWITCH_ENGINE_SHARING=deployment``: a lane and
   a Spark scheduler pool each): while one drains its burst in batch, the others stream.
4. Each pipeline's summary and audit, as ``make demo``'s
   (:func:`~modeswitch.devtools.demo.print_summary`); 0 when every pipeline's audit found
   every record exactly once.

Every process started here is stopped here (the producers joined, the children's process
groups stopped, the shared engine stopped by its process group).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from modeswitch.control.pipelines import list_fleet
from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.airflow_demo import AIRFLOW_DEMO_SETTINGS, DagRuns
from modeswitch.devtools.airflow_local import airflow_environment, migrate, reserialize
from modeswitch.devtools.demo import burst_later, demo_sources, print_summary
from modeswitch.environment import ENGINE_DIR, ENGINE_SHARING, PIPELINES_DIR
from modeswitch.runners.engine import stop_engine
from modeswitch.state import StateStore


@dataclass(frozen=True)
class FleetPipeline:
    """One pipeline of the demo: its source's shape and its own settings."""

    name: str
    buckets: int
    records: int
    skew: str
    rate: float
    runs: int
    burst_after: float | None = None
    burst: int = 0
    settings: dict[str, str] = field(default_factory=dict)


FLEET = (
    # A big skewed backlog (its batch ~25 s here), a burst 10 s into its first stream: batch
    # again while the others stream.
    FleetPipeline(
        "orders",
        buckets=8,
        records=600_000,
        skew="zipf:1.1",
        rate=400,
        runs=4,
        burst_after=35.0,
        burst=300_000,
        settings={"offset_lag_threshold": "100000", "max_stream_runtime": "40s"},
    ),
    # A small even backlog, a later burst, a lower threshold.
    FleetPipeline(
        "clicks",
        buckets=4,
        records=150_000,
        skew="uniform",
        rate=200,
        runs=4,
        burst_after=45.0,
        burst=120_000,
        settings={"offset_lag_threshold": "50000", "max_stream_runtime": "60s"},
    ),
    # A trickle: one batch, then it streams the whole time.
    FleetPipeline(
        "payments",
        buckets=2,
        records=20_000,
        skew="zipf:1.5",
        rate=50,
        runs=2,
        settings={"offset_lag_threshold": "20000", "max_stream_runtime": "90s"},
    ),
)


def write_pipelines(root: Path, fleet: tuple[FleetPipeline, ...]) -> Path:
    """The pipelines folder: one TOML file per pipeline, its log and warehouse its own."""
    folder = root / "pipelines"
    folder.mkdir(parents=True)
    for p in fleet:
        values = {
            **AIRFLOW_DEMO_SETTINGS,
            **p.settings,
            "source": str(root / p.name / "log"),
            "warehouse": str(root / p.name / "warehouse"),
        }
        values.pop("pipeline", None)  # the file's name is the pipeline's
        lines = [f"{key} = {_toml(value)}" for key, value in sorted(values.items())]
        (folder / f"{p.name}.toml").write_text("\n".join(lines) + "\n")
    return folder


def _toml(value: object) -> str:
    import json

    return json.dumps(str(value))  # a TOML basic string is a JSON string


def run_fleet_demo(directory: str, *, console: Console, fleet=FLEET) -> int:
    root = Path(directory).resolve()
    shutil.rmtree(root, ignore_errors=True)
    (root / "logs").mkdir(parents=True)
    folder = write_pipelines(root, fleet)
    declared = {p.name: p for p in list_fleet(folder).pipelines if p.declared}
    settings = {p.name: declared[p.name].own_settings() for p in fleet}
    shared = {
        PIPELINES_DIR.name: str(folder),
        ENGINE_SHARING.name: "deployment",
        ENGINE_DIR.name: str(root / "engines"),
    }
    os.environ.update(shared)  # the engine's address, for this process's stop too
    env = {**airflow_environment(root / "airflow"), **shared}
    console.rule("1. a local Airflow whose pipelines folder declares three pipelines")
    started = time.monotonic()
    migrate(env)
    reserialize(env)  # before three processes run the DAGs at once
    console.print(
        f"Airflow (SQLite) under {env['AIRFLOW_HOME']}, pipelines from {folder}: "
        + ", ".join(f"{name} ({declared[name].file})" for name in settings)
        + f" ({time.monotonic() - started:.1f} s)"
    )
    failures: list[str] = []
    with contextlib.ExitStack() as stack:
        console.rule("2. each pipeline's backlog, live producer and burst")
        logs = {
            p.name: stack.enter_context(
                demo_sources(
                    settings[p.name],
                    records=p.records,
                    buckets=p.buckets,
                    console=console,
                    skew=p.skew,
                    rate=p.rate,
                )
            )
            for p in fleet
        }
        for p in fleet:
            if p.burst_after is not None:
                stack.enter_context(
                    burst_later(
                        logs[p.name], p.buckets, console, after=p.burst_after, records=p.burst
                    )
                )
        console.rule("3. the three pipelines' DAGs at once, their epochs in one shared engine")
        try:
            threads = [
                threading.Thread(
                    target=_pipeline_runs,
                    args=(p, settings[p.name], env, root, console, failures),
                    name=f"runs-{p.name}",
                )
                for p in fleet
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            if stop_engine(next(iter(settings.values()))):
                console.print(f"stopped the shared warm engine (log: {root}/engines)")
    console.rule("4. what each pipeline did")
    codes = [_summary(settings[p.name], console, root, failures) for p in fleet]
    _overlaps(settings, console)
    for failure in failures:
        console.print(f"[red]{failure}[/red]")
    return 0 if not failures and not any(codes) else 1


def _pipeline_runs(
    p: FleetPipeline,
    settings: PipelineSettings,
    env: dict[str, str],
    root: Path,
    console: Console,
    failures: list[str],
) -> None:
    """One pipeline's DAG runs, one after the other, in a child of its own."""
    dag_id = f"{p.name}_pipeline"
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    try:
        with DagRuns(env, root / "logs" / f"airflow-{p.name}.log") as runs:
            for number in range(1, p.runs + 1):
                run_log = root / "logs" / f"{p.name}-run-{number}.log"
                started = time.monotonic()
                code = runs.run(dag_id, run_log, {})
                epochs = store.epochs.list()
                last = epochs[-1] if epochs else None
                console.print(
                    f"[bold]{p.name}[/bold] run {number}: exit {code} in "
                    f"{time.monotonic() - started:.0f} s; newest epoch "
                    f"{last.id if last else '-'} ({last.mode if last else '-'}, "
                    f"{last.status if last else '-'})"
                )
                if code != 0:
                    failures.append(f"{dag_id} run {number} failed (exit {code}): {run_log}")
                    return
    except BaseException as exc:  # one pipeline's trouble: the others go on
        failures.append(f"{dag_id}: {exc}")


def _summary(settings: PipelineSettings, console: Console, root: Path, failures: list) -> int:
    console.rule(f"pipeline {settings.pipeline}")
    try:
        return print_summary(
            settings, console, where=f"(its log and tables: {root}/{settings.pipeline}/)"
        )
    except Exception as exc:  # a pipeline that never landed anything: said, the others shown
        failures.append(f"pipeline {settings.pipeline}: no summary: {exc}")
        return 1


def _overlaps(settings: dict[str, PipelineSettings], console: Console) -> None:
    """When the pipelines' epochs ran side by side: each epoch's mode and time span."""
    table = Table(title="epochs of all three, by start (one in batch while another streams)")
    for name in ("pipeline", "epoch", "mode", "started", "ended"):
        table.add_column(name)
    rows = []
    for name, s in settings.items():
        for epoch in StateStore(s.state_root, s.sink, s.pipeline).epochs.list():
            rows.append((epoch.started_at, name, epoch))
    for started, name, epoch in sorted(rows, key=lambda row: row[0]):
        ended = epoch.ended_at.strftime("%H:%M:%S") if epoch.ended_at else "running"
        table.add_row(name, str(epoch.id), epoch.mode, started.strftime("%H:%M:%S"), ended)
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", default=".demo-fleet")
    args = parser.parse_args(argv)
    return run_fleet_demo(args.directory, console=Console())


if __name__ == "__main__":
    sys.exit(main())
