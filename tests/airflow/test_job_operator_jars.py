"""The spark-submit of every epoch job (and of the warm engine, built from the same conf) puts
the jars ``make install`` fetched on the driver's and executors' class path, with Delta's
session extension and catalog (modeswitch.runners.session)."""

from __future__ import annotations

from pathlib import Path

from modeswitch.airflow.operators import EpochJobOperator
from modeswitch.control.settings import PipelineSettings
from modeswitch.runners.jvm import fetched_jars


def _command(tmp_path: Path, kind: str = "stream", **kwargs) -> list[str]:
    settings = PipelineSettings.from_mapping(
        {"warehouse": str(tmp_path), "source": str(tmp_path / "log")}
    )
    plan = {"pipeline": settings.pipeline, "epoch": 3, "mode": kind, "settings": settings.to_json()}
    job = EpochJobOperator(task_id=f"job_{kind}", kind=kind, **kwargs)
    job.prepare(plan)
    return job._get_hook()._build_spark_submit_command(job.application)


def _values(command: list[str], flag: str) -> list[str]:
    return [command[i + 1] for i, word in enumerate(command) if word == flag]


def test_the_job_is_submitted_with_the_fetched_jars_and_delta_session_settings(tmp_path) -> None:
    for kind in ("batch", "stream"):
        conf = _values(_command(tmp_path, kind), "--conf")
        assert f"spark.jars={','.join(fetched_jars())}" in conf
        assert "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension" in conf
        assert (
            "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog"
            in conf
        )


def test_a_deployments_own_jars_are_kept_beside_ours(tmp_path) -> None:
    ours = ",".join(fetched_jars())
    conf = _values(_command(tmp_path, conf={"spark.jars": "/opt/own.jar"}), "--conf")
    assert f"spark.jars=/opt/own.jar,{ours}" in conf
    # --jars wins over spark.jars on spark-submit's command line: ours go there too.
    command = _command(tmp_path, jars="/opt/kafka.jar")
    assert _values(command, "--jars") == [f"/opt/kafka.jar,{ours}"]
