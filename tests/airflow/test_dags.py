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


@pytest.mark.parametrize(
    "dag_file", ["modeswitch_pipeline.py", "modeswitch_control.py", "modeswitch_backfill.py"]
)
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
