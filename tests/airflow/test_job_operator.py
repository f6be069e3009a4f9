"""The epoch job operator sizes the driver JVM that spark-submit starts from the settings."""

from __future__ import annotations

from modeswitch.airflow.operators import EpochJobOperator
from modeswitch.control.settings import PipelineSettings


def _command(kind: str, settings: PipelineSettings, **kwargs) -> str:
    plan = {"pipeline": settings.pipeline, "epoch": 3, "mode": kind, "settings": settings.to_json()}
    job = EpochJobOperator(task_id=f"job_{kind}", kind=kind, **kwargs)
    job.prepare(plan)
    return " ".join(job._get_hook()._build_spark_submit_command(job.application))


def test_the_batch_jobs_driver_heap_is_the_batch_driver_memory_setting(tmp_path) -> None:
    settings = PipelineSettings.from_mapping(
        {"warehouse": str(tmp_path), "source": str(tmp_path / "log"), "batch_driver_memory": "768m"}
    )
    batch = _command("batch", settings)
    assert "spark.driver.memory=768m" in batch
    assert "-Xms768m" in batch and "SharedArchiveFile" in batch  # with the class archive
    # The stream job keeps Spark's default; a deployment's own conf wins over the setting.
    assert "spark.driver.memory" not in _command("stream", settings)
    own = _command("batch", settings, conf={"spark.driver.memory": "4g"})
    assert "spark.driver.memory=4g" in own and "spark.driver.memory=768m" not in own
    assert "-Xms" not in own
    off = settings.to_mapping() | {"batch_driver_memory": "none"}
    assert "spark.driver.memory" not in _command("batch", PipelineSettings.from_mapping(off))
