"""The launcher of Spark's Python workers: pyspark from site-packages, the rest of the path kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from modeswitch.runners.worker_python import (
    launcher_text,
    python_for,
    runs_here,
    spark_home_of,
    worker_python,
)

SPARK_HOME = Path(pyspark.__file__).resolve().parent


def test_the_launcher_drops_sparks_own_copies_and_keeps_the_rest(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MODESWITCH_CACHE", str(tmp_path / "cache"))
    launcher = worker_python()
    assert launcher != sys.executable
    assert os.access(launcher, os.X_OK)
    assert worker_python() == launcher  # written once
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "user_module_of_the_job.py").write_text("VALUE = 7\n")
    other_zip = tmp_path / "deps.zip"
    # What Spark gives a worker (PythonUtils.sparkPythonPath), a job's own folder, another zip.
    given = [
        f"{SPARK_HOME}/python/lib/pyspark.zip",
        f"{SPARK_HOME}/python/lib/py4j-0.10.9.9-src.zip",
        f"{SPARK_HOME}/jars/spark-core_2.13-4.2.0.jar",
        str(elsewhere),
        str(other_zip),
        "/a path/with a space",
    ]
    shown = subprocess.run(
        [
            launcher,
            "-c",
            "import sys, pyspark, py4j, user_module_of_the_job as m; "
            "print(repr((sys.path, pyspark.__file__, py4j.__file__, m.VALUE)))",
        ],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(given)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path, pyspark_file, py4j_file, value = eval(shown)
    assert not [entry for entry in path if entry.startswith(str(SPARK_HOME))]
    assert path[1:4] == [str(elsewhere), str(other_zip), "/a path/with a space"]
    assert pyspark_file == str(SPARK_HOME / "__init__.py")  # bytecode cached in site-packages
    assert ".zip" not in py4j_file
    assert value == 7


def test_the_launcher_runs_its_interpreter_with_the_arguments_given(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MODESWITCH_CACHE", str(tmp_path))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    done = subprocess.run(
        [worker_python(), "-c", "import sys; print(sys.executable, sys.argv[1:])", "a b", "*"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == f"{sys.executable} ['a b', '*']"


def test_paths_a_shell_script_cannot_hold_as_is_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot quote"):
        launcher_text("/opt/my python/bin/python", str(SPARK_HOME), "/tmp/forks", "/c.py")
    with pytest.raises(ValueError, match="cannot quote"):
        launcher_text(sys.executable, "/opt/$HOME/pyspark", "/tmp/forks", "/c.py")
    with pytest.raises(ValueError, match="cannot quote"):
        launcher_text(sys.executable, str(SPARK_HOME), "/my forks", "/c.py")


@pytest.mark.parametrize(
    ("master", "here"),
    [
        (None, True),
        ("local", True),
        ("local[2]", True),
        ("spark://127.0.0.1:7077", True),
        ("spark://localhost", True),
        ("spark://spark-master:7077", False),
        ("yarn", False),
        ("k8s://https://10.0.0.1:6443", False),
    ],
)
def test_the_launcher_is_used_where_the_executors_run_on_this_machine(
    master, here, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("MODESWITCH_CACHE", str(tmp_path))
    monkeypatch.delenv("MODESWITCH_WORKERS_LIKE_HERE", raising=False)
    assert runs_here(master) is here
    assert (python_for(master) != sys.executable) is here


def test_the_launcher_is_used_on_a_cluster_that_runs_this_installation(
    tmp_path, monkeypatch
) -> None:
    """The compose stack: every container from one image, the launcher made when it was built;
    MODESWITCH_WORKERS_LIKE_HERE says so, and a remote master's workers get the launcher."""
    monkeypatch.setenv("MODESWITCH_CACHE", str(tmp_path))
    monkeypatch.setenv("MODESWITCH_WORKERS_LIKE_HERE", "on")
    assert python_for("spark://spark-master:7077") == worker_python()
    monkeypatch.setenv("MODESWITCH_WORKERS_LIKE_HERE", "off")
    assert python_for("spark://spark-master:7077") == sys.executable


def test_a_driver_that_imported_pyspark_from_its_zip_finds_the_same_installation() -> None:
    """Under spark-submit the driver imports pyspark from ``<home>/python/lib/pyspark.zip``:
    its launcher must be the one the submitting process chose (the same text, the same file),
    or the engine would take Spark's workers for another interpreter's."""
    plain = str(SPARK_HOME / "__init__.py")
    zipped = f"{SPARK_HOME}/python/lib/pyspark.zip/pyspark/__init__.py"
    assert spark_home_of(plain) == spark_home_of(zipped) == str(SPARK_HOME)
