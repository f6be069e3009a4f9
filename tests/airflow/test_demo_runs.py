"""``make demo``'s DAG runs: one child process runs them one after the other (``DagRuns``).

Real parts: a local Airflow (SQLite) migrated under the test's folder, this repository's DAGs,
``dag.test()`` in the child. The runs here are of the example consumer, which reads nothing
on a pipeline that never ran (the demo's pipeline runs: ``make demo`` itself)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil

from modeswitch.devtools.airflow_demo import CONSUMER_DAG_ID, DagRuns
from modeswitch.devtools.airflow_local import airflow_environment, migrate


def test_one_child_runs_each_dag_run_in_turn_each_with_its_own_log(tmp_path: Path) -> None:
    env = airflow_environment(
        tmp_path / "airflow",
        variables={"source": str(tmp_path / "log"), "warehouse": str(tmp_path / "warehouse")},
    )
    migrate(env)
    with DagRuns(env, tmp_path / "between.log") as runs:
        child = runs._process.pid
        codes = [
            runs.run(CONSUMER_DAG_ID, tmp_path / f"run-{n}.log", result=str(tmp_path / f"{n}.json"))
            for n in (1, 2)
        ]
        assert runs._process.pid == child  # the same process, Airflow imported once
        group = [p.pid for p in psutil.process_iter() if _group(p) == child]
    assert codes == [0, 0]
    for n in (1, 2):
        assert "read_landed_rows" in (tmp_path / f"run-{n}.log").read_text()
        assert json.loads((tmp_path / f"{n}.json").read_text())["rows"] == 0
    # Each run's output went to its own log, none to the other's.
    for n in (1, 2):
        assert (tmp_path / f"run-{n}.log").read_text().count("DagRun Finished") == 1
    # Leaving stops the child's whole process group.
    assert group and not [pid for pid in group if psutil.pid_exists(pid)]


def _group(process: psutil.Process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except (ProcessLookupError, psutil.Error):
        return None
