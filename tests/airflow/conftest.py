"""Airflow tests: a migrated SQLite Airflow under a temp dir, configured before airflow is
imported (this module is loaded before any test module of this folder)."""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="modeswitch-airflow-"))
atexit.register(shutil.rmtree, AIRFLOW_HOME, ignore_errors=True)
OPENLINEAGE_FILE = AIRFLOW_HOME / "openlineage.jsonl"

os.environ.update(
    {
        "AIRFLOW_HOME": str(AIRFLOW_HOME),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        # The API server app (tests/airflow/test_web_api.py) signs its users' tokens with it.
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(48),
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME}/airflow.db",
        "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[*]"}',
        # Airflow's OpenLineage provider writes every task's events here (tests read them).
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "modeswitch-tests",
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(OPENLINEAGE_FILE), "append": True}
        ),
        # A task's events from a thread, not from a fork of this process and its open SQLite
        # database (which SQLite says a forked child must not use).
        "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": "True",
    }
)


@pytest.fixture(scope="session", autouse=True)
def openlineage_pool_shut_down() -> Iterator[None]:
    """At the session's end, the pool of processes in which Airflow's OpenLineage listener
    emits DAG-run events (``dag.test()`` forks it) is shut down, as the listener does when
    an Airflow component stops (``before_stopping``). An xdist worker exits without shutting
    it, and its process then waited on its queue for ever, orphaned (seen after a CI run)."""
    yield
    listener = sys.modules.get("airflow.providers.openlineage.plugins.listener")
    if listener is not None:
        listener.get_openlineage_listener().before_stopping(None)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """``airflow db migrate`` once per session (a few seconds)."""
    airflow = Path(sys.executable).parent / "airflow"
    subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True, env=os.environ)
    return AIRFLOW_HOME


@pytest.fixture
def openlineage_events() -> Callable[[str, str, int], list[dict]]:
    """The OpenLineage events the provider wrote for a DAG's task, oldest first, once there
    are ``count`` of them (the provider emits them beside the task, not in its thread)."""

    def events(dag_id: str, task_id: str, count: int) -> list[dict]:
        job = f"{dag_id}.{task_id}"
        found: list[dict] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            lines = OPENLINEAGE_FILE.read_text().splitlines() if OPENLINEAGE_FILE.exists() else []
            found = [e for e in map(json.loads, lines) if e.get("job", {}).get("name") == job]
            if len(found) >= count:
                break
            time.sleep(0.5)
        return found

    return events


@pytest.fixture
def asset_events(airflow_db: Path) -> Callable[[str], list[tuple[dict, str]]]:
    """The events of the Asset with a URI in Airflow's metadata DB: each one's extra and the
    alias it came through, oldest first."""

    def events(uri: str) -> list[tuple[dict, str]]:
        # Read-only, waiting out a writer: the DAG run's OpenLineage events are emitted by
        # processes forked from this one, which write the database too (a plain connection
        # once met "disk I/O error" here).
        db = sqlite3.connect(f"file:{airflow_db / 'airflow.db'}?mode=ro", uri=True, timeout=30)
        try:
            rows = db.execute(
                "SELECT e.extra, al.name FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                "JOIN asset_alias_asset_event ae ON ae.event_id = e.id "
                "JOIN asset_alias al ON al.id = ae.alias_id WHERE a.uri = ? ORDER BY e.id",
                (uri,),
            ).fetchall()
        finally:
            db.close()
        return [(json.loads(extra), alias) for extra, alias in rows]

    return events
