"""One task run parses the pipeline's settings once: the epoch job operator reads the plan's
settings JSON once for its job's arguments and its runner; the lag sensor reads the Variables
once for its check and the trigger it defers to."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
import pytest

from modeswitch.airflow import sensors
from modeswitch.airflow.lag import LagReading
from modeswitch.airflow.operators import EpochJobOperator
from modeswitch.control.settings import PipelineSettings
from modeswitch.runners.base import EpochHandle


class _Task:
    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan

    def xcom_pull(self, task_ids: str) -> dict[str, Any]:
        return self.plan


class _Runner:
    def __init__(self) -> None:
        self.ran: list[tuple[str, PipelineSettings, int]] = []

    def start(self, kind: str, settings: PipelineSettings, epoch: int) -> EpochHandle:
        return EpochHandle(kind, epoch, wait=lambda: self.ran.append((kind, settings, epoch)))


def test_the_job_operator_parses_the_plans_settings_once(tmp_path, monkeypatch) -> None:
    settings = PipelineSettings.from_mapping(
        {"source": str(tmp_path / "log"), "warehouse": str(tmp_path / "warehouse")}
    )
    plan = {"pipeline": settings.pipeline, "epoch": 4, "mode": "batch"}
    plan["settings"] = settings.to_json()
    parsed: list[str] = []
    from_json = PipelineSettings.from_json.__func__

    def counted(cls: type[PipelineSettings], text: str) -> PipelineSettings:
        parsed.append(text)
        return from_json(cls, text)

    monkeypatch.setattr(PipelineSettings, "from_json", classmethod(counted))
    runner = _Runner()
    job = EpochJobOperator(task_id="backlog_batch", kind="batch")
    monkeypatch.setattr(job, "epoch_runner", lambda plan, settings, context: runner)
    job.execute({"ti": _Task(plan)})
    assert runner.ran == [("batch", settings, 4)]
    assert parsed == [plan["settings"]]
    assert "--epoch" in job.application_args  # prepared from the same parse


def test_the_lag_sensor_resolves_the_settings_once_for_its_check_and_its_trigger(
    monkeypatch,
) -> None:
    resolved: list[dict[str, Any]] = []

    def settings_from_airflow(overrides: dict[str, Any], **layers: Any) -> PipelineSettings:
        resolved.append(dict(overrides))
        return PipelineSettings.from_mapping(overrides)

    quiet = LagReading(pendulum.now("UTC"), "defined", timedelta(seconds=1), 0)
    monkeypatch.setattr(sensors, "settings_from_airflow", settings_from_airflow)
    monkeypatch.setattr(sensors, "measure_lag", lambda settings, storage_options: quiet)
    deferred: list[Any] = []
    sensor = sensors.LagThresholdSensor(
        task_id="watch",
        watermark_lag_threshold=timedelta(minutes=5),
        settings={"pipeline": "orders"},
    )
    monkeypatch.setattr(sensor, "defer", lambda **kwargs: deferred.append(kwargs["trigger"]))
    sensor.execute({})
    (trigger,) = deferred
    assert resolved == [{"pipeline": "orders"}]
    assert PipelineSettings.from_json(trigger.settings).pipeline == "orders"
    assert not sensor.poke({})  # a poke of the same run uses them too
    assert len(resolved) == 1


@pytest.fixture(autouse=True)
def _spark_connection(monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[*]"}')
