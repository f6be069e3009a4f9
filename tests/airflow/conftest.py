"""Airflow tests: a migrated SQLite Airflow under a temp dir, configured before airflow is
imported (this module is loaded before any test module of this folder)."""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="modeswitch-airflow-"))
atexit.register(shutil.rmtree, AIRFLOW_HOME, ignore_errors=True)

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
    }
)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """``airflow db migrate`` once per session (a few seconds)."""
    airflow = Path(sys.executable).parent / "airflow"
    subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True, env=os.environ)
    return AIRFLOW_HOME
