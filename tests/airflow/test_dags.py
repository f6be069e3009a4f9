"""DagBag integrity: both DAGs import cleanly, are tagged, retry sensibly, and read no
Variable while they are parsed."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import Variable

    def refuse(*args, **kwargs):
        raise AssertionError(f"Variable read while parsing DAGs: {args}")

    with mock.patch.object(Variable, "get", side_effect=refuse):
        return DagBag(dag_folder=str(REPO / "dags"))


def test_no_import_errors(dagbag) -> None:
    assert dagbag.import_errors == {}
    assert {
        "modeswitch_pipeline",
        "modeswitch_control",
        "modeswitch_backfill",
        "modeswitch_maintenance",
    } <= set(dagbag.dag_ids)


def test_pipeline_dag_shape(dagbag) -> None:
    dag = dagbag.dags["modeswitch_pipeline"]
    assert "modeswitch" in dag.tags
    assert dag.max_active_runs == 1
    assert type(dag.timetable).__name__ == "ContinuousTimetable"
    assert dag.doc_md
    assert set(dag.task_dict) == {"decide", "branch", "backlog_batch", "stream", "close_epoch"}
    assert dag.task_dict["branch"].downstream_task_ids == {"backlog_batch", "stream"}
    assert dag.task_dict["close_epoch"].upstream_task_ids >= {"backlog_batch", "stream"}
    for task in dag.tasks:
        assert task.owner == "modeswitch"
        assert task.retries >= 1, task.task_id
        assert task.execution_timeout is not None, task.task_id
    for task_id in ("backlog_batch", "stream"):
        assert dag.task_dict[task_id]._conn_id == "spark_default"
    assert set(dag.params.get_param("force_mode").schema["enum"]) == {"auto", "batch", "stream"}


def test_the_pipeline_tasks_retry_after_the_deployments_delay(monkeypatch) -> None:
    from datetime import timedelta

    from airflow.dag_processing.dagbag import DagBag

    from modeswitch.airflow.tasks import pipeline_task_defaults
    from modeswitch.errors import ConfigError

    monkeypatch.setenv("MODESWITCH_PIPELINE_RETRY_DELAY", "5s")
    dag = DagBag(dag_folder=str(REPO / "dags")).dags["modeswitch_pipeline"]
    assert {t.retry_delay for t in dag.tasks} == {timedelta(seconds=5)}
    assert {t.retries for t in dag.tasks} == {2}
    monkeypatch.setenv("MODESWITCH_PIPELINE_RETRY_DELAY", "soon")
    with pytest.raises(ConfigError, match=r"^MODESWITCH_PIPELINE_RETRY_DELAY: 'soon' is not a"):
        pipeline_task_defaults()


def test_control_dag_is_manual_with_validated_params(dagbag) -> None:
    dag = dagbag.dags["modeswitch_control"]
    assert "modeswitch" in dag.tags
    assert not dag.timetable.can_be_scheduled
    assert set(dag.params.get_param("command").schema["enum"]) == {
        "switch_to_batch",
        "switch_to_stream",
        "pause",
        "resume",
        "rewind",
    }
    with pytest.raises(Exception, match="bogus"):
        dag.params.get_param("command").resolve("bogus")


@pytest.mark.parametrize("dag_file", ["modeswitch_pipelines.py"])
def test_parsing_a_dag_file_does_not_import_spark(dag_file) -> None:
    # The dag-processor parses every file again and again: Spark belongs to the jobs only.
    import subprocess
    import sys

    probe = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('dag', {str(REPO / 'dags' / dag_file)!r})\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pyspark', 'py4j'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-2000:]


def test_each_pipeline_file_becomes_its_dags_and_a_bad_one_is_an_import_error_alone(
    tmp_path: Path, monkeypatch
) -> None:
    """A file per pipeline, five DAGs each, beside modeswitch's; a file with a bad setting or a
    bad name is named (with the setting) in the factory file's import error, and every other
    pipeline's DAGs are there."""
    from airflow.dag_processing.dagbag import DagBag

    (tmp_path / "orders.toml").write_text('source = "/logs/orders"\nenter_threshold = "30s"\n')
    (tmp_path / "refunds.json").write_text('{"source": "/logs/refunds"}')
    (tmp_path / "payments.toml").write_text('enter_threshold = "soon"\n')
    (tmp_path / "bad name.toml").write_text("")
    monkeypatch.setenv("MODESWITCH_PIPELINES_DIR", str(tmp_path))
    bag = DagBag(dag_folder=str(REPO / "dags" / "modeswitch_pipelines.py"))
    roles = ("pipeline", "control", "backfill", "maintenance", "lag_alerts")
    expected = {f"{p}_{r}" for p in ("modeswitch", "orders", "refunds") for r in roles}
    assert set(bag.dag_ids) == expected
    (error,) = bag.import_errors.values()
    assert f"{tmp_path}/payments.toml: enter_threshold: 'soon' is not a duration" in error
    assert f"{tmp_path}/bad name.toml: pipeline: 'bad name' is not a valid name" in error
    orders = bag.dags["orders_pipeline"]
    assert "pipeline:orders" in orders.tags
    assert set(orders.task_dict) == {"decide", "branch", "backlog_batch", "stream", "close_epoch"}
    assert "pipeline" not in bag.dags["orders_backfill"].params  # its DAGs are its own
    assert "pipeline" in bag.dags["modeswitch_backfill"].params  # as it always was


def test_fifty_pipeline_files_parse_without_reading_a_variable(tmp_path: Path, monkeypatch) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import Variable

    for n in range(50):
        (tmp_path / f"topic{n:02d}.toml").write_text(f'source = "kafka://topic{n:02d}"\n')
    monkeypatch.setenv("MODESWITCH_PIPELINES_DIR", str(tmp_path))

    def refuse(*args, **kwargs):
        raise AssertionError(f"Variable read while parsing DAGs: {args}")

    with mock.patch.object(Variable, "get", side_effect=refuse):
        bag = DagBag(dag_folder=str(REPO / "dags" / "modeswitch_pipelines.py"))
    assert bag.import_errors == {}
    assert len(bag.dag_ids) == 51 * 5
