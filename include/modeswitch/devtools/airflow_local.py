"""A local Airflow for the demo and for exploring the UI: SQLite and logs under a folder of
the repo, this repo's DAGs and plugins, ``spark_default`` set to ``local[*]``.

Everything here only builds environments and runs ``airflow`` as child processes; nothing
imports Airflow, so the caller's environment decides which Airflow home is used.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from modeswitch.control.settings_layers import variable_name
from modeswitch.runners.engine import ENGINE_DIR_ENV, stop_engines_in
from modeswitch.runners.jobs import JOBS
from modeswitch.runners.processes import start_group, stop_group

REPO = JOBS.parent
DAGS = REPO / "dags"
PLUGINS = REPO / "plugins"
SPARK_LOCAL = '{"conn_type": "spark", "host": "local[*]"}'


def airflow_environment(
    home: str | Path, *, variables: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a local Airflow under ``home``; ``variables`` (setting -> raw value)
    become ``modeswitch_<setting>`` Variables (``AIRFLOW_VAR_...``)."""
    home = Path(home).resolve()
    bin_dir = str(Path(sys.executable).parent)
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": os.environ.get("AIRFLOW__CORE__PARALLELISM", "4"),
        # SQLite waits up to a minute for another component's write lock (its default, 5 s,
        # failed `airflow` commands beside a busy scheduler on these two cores).
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db?timeout=60",
        "AIRFLOW_CONN_SPARK_DEFAULT": os.environ.get("AIRFLOW_CONN_SPARK_DEFAULT", SPARK_LOCAL),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYSPARK_PYTHON": sys.executable,
    }
    for setting, value in (variables or {}).items():
        env[f"AIRFLOW_VAR_{variable_name(setting).upper()}"] = str(value)
    return env


def migrate(env: Mapping[str, str]) -> None:
    """``airflow db migrate`` (creates the SQLite database on first use)."""
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    airflow_command(env, "db", "migrate")


def reserialize(env: Mapping[str, str]) -> None:
    """``airflow dags reserialize``: every DAG written to the database once, before several
    processes run them at once (each ``dag.test()`` would insert the rows it does not find:
    a race on their keys)."""
    airflow_command(env, "dags", "reserialize")


def airflow_command(env: Mapping[str, str], *args: str) -> None:
    """The ``airflow`` command of this environment with ``args``, in ``env``; its errors raise."""
    subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), *args],
        env={**os.environ, **env},
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def standalone(home: str | Path) -> int:
    """``airflow standalone`` with this repo's DAGs, in its own process group; Ctrl-C (or
    SIGTERM) stops the whole group, so no scheduler, triggerer or API server is left behind,
    and then every warm engine its tasks started (they outlive tasks by design, in process
    groups of their own): their address files are under ``home``/engines."""
    engines = Path(home).resolve() / "engines"
    env = {**os.environ, **airflow_environment(home), ENGINE_DIR_ENV: str(engines)}
    migrate(env)
    process = start_group([str(Path(sys.executable).parent / "airflow"), "standalone"], env)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop_group(process, grace=20)
        for pipeline in stop_engines_in(engines):
            print(f"stopped the warm engine of pipeline {pipeline!r}")


if __name__ == "__main__":  # python -m modeswitch.devtools.airflow_local [HOME]
    sys.exit(standalone(sys.argv[1] if len(sys.argv) > 1 else ".airflow"))
