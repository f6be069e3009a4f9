"""A spark-submit job on a local master keeps its Spark scratch (local dirs, the JVM's
java.io.tmpdir) in a folder the task removes when the job ends, even when it fails, instead of
the machine's /tmp (where a killed job's folders stay)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from modeswitch.airflow.operators import EpochJobOperator, SparkSubmitRunner
from modeswitch.control.settings import PipelineSettings


def _prepared(tmp_path: Path, conn_id: str = "spark_default") -> tuple[EpochJobOperator, Any]:
    settings = PipelineSettings.from_mapping(
        {"source": str(tmp_path / "log"), "warehouse": str(tmp_path / "warehouse")}
    )
    plan = {"pipeline": settings.pipeline, "epoch": 4, "mode": "batch"}
    plan["settings"] = settings.to_json()
    job = EpochJobOperator(task_id="backlog_batch", kind="batch", conn_id=conn_id)
    return job, job.prepare(plan)


@pytest.mark.parametrize("fails", [False, True])
def test_a_local_job_has_a_scratch_folder_removed_after_it(tmp_path, monkeypatch, fails) -> None:
    job, settings = _prepared(tmp_path)
    seen: dict[str, str] = {}

    def execute(operator: SparkSubmitOperator, context: Any) -> None:
        seen.update(operator.env_vars)
        assert Path(seen["SPARK_LOCAL_DIRS"]).is_dir()
        if fails:
            raise RuntimeError("spark-submit failed")

    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    monkeypatch.setattr(SparkSubmitOperator, "execute", execute)
    runner = SparkSubmitRunner(job, {})
    if fails:
        with pytest.raises(RuntimeError):
            runner.start("batch", settings, 4).wait()
    else:
        runner.start("batch", settings, 4).wait()
    scratch = seen["SPARK_LOCAL_DIRS"]
    assert f"-Djava.io.tmpdir={scratch}" in seen["SPARK_SUBMIT_OPTS"]
    assert not os.path.exists(scratch)  # removed with what the job left in it
    assert "SPARK_LOCAL_DIRS" not in (job.env_vars or {})  # the operator's own, as they were


def test_a_job_on_a_cluster_gets_no_local_scratch(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_STANDALONE", '{"conn_type": "spark", "host": "spark://10.0.0.5:7077"}'
    )
    job, settings = _prepared(tmp_path, "spark_standalone")
    seen: dict[str, str] = {}
    monkeypatch.setattr(
        SparkSubmitOperator, "execute", lambda operator, context: seen.update(operator.env_vars)
    )
    SparkSubmitRunner(job, {}).start("batch", settings, 4).wait()
    assert "SPARK_LOCAL_DIRS" not in seen  # the cluster's executors have their own


def test_a_local_backfill_job_has_its_scratch_removed_too(tmp_path, monkeypatch) -> None:
    settings = PipelineSettings.from_mapping(
        {"source": str(tmp_path / "log"), "warehouse": str(tmp_path / "warehouse")}
    )
    plan = {"pipeline": settings.pipeline, "command": 3, "window": ["a", "b"]}
    plan["settings"] = settings.to_json()
    seen: dict[str, str] = {}
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    monkeypatch.setattr(
        SparkSubmitOperator, "execute", lambda operator, context: seen.update(operator.env_vars)
    )
    job = EpochJobOperator(task_id="backfill", kind="backfill")
    job.execute({"ti": type("TI", (), {"xcom_pull": lambda self, task_ids: plan})()})
    assert "--command" in job.application_args
    assert not os.path.exists(seen["SPARK_LOCAL_DIRS"])
