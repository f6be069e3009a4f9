"""The task callables without a scheduler: settings from Variables (a bad one is refused,
naming it, with nothing written), control commands and their validation, the lag trigger."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest

from modeswitch.airflow.settings import settings_from_airflow
from modeswitch.airflow.tasks import branch_for, decide_task, submit_control_command
from modeswitch.airflow.triggers import LagThresholdTrigger
from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import ConfigError
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore

RECORDS = 2_000


@pytest.fixture
def variables(tmp_path: Path) -> dict[str, str]:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=2)
    produce_backlog(log, EventGenerator(seed=1, buckets=2), records=RECORDS)
    return {
        "modeswitch_pipeline": "af",
        "modeswitch_source": str(tmp_path / "log"),
        "modeswitch_warehouse": str(tmp_path / "warehouse"),
    }


def test_variables_and_params_layer_over_defaults(variables) -> None:
    variables["modeswitch_enter_threshold"] = "90s"
    settings = settings_from_airflow({"exit_threshold": "10s"}, get_variable=variables.get)
    assert settings.pipeline == "af"
    assert settings.policy.enter_threshold == timedelta(seconds=90)
    assert settings.policy.exit_threshold == timedelta(seconds=10)
    assert settings.policy.min_time_in_stream == timedelta(minutes=5)  # code default


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("modeswitch_enter_threshold", "-5s"),
        ("modeswitch_wave_records", "lots"),
        ("modeswitch_offset_lag_threshold", "0"),
    ],
)
def test_bad_variable_fails_decide_naming_it_and_writes_nothing(
    variables, tmp_path: Path, variable: str, value: str
) -> None:
    variables[variable] = value
    with pytest.raises(ConfigError, match=f"Airflow Variable '{variable}'.*{value}"):
        decide_task({"force_mode": "auto"}, get_variable=variables.get)
    assert not (tmp_path / "warehouse").exists()


def test_dry_run_decides_without_writing(variables, tmp_path: Path) -> None:
    plan = decide_task({"dry_run": True}, get_variable=variables.get)
    assert plan["mode"] == "batch"
    assert plan["epoch"] is None
    assert branch_for(plan) == []
    assert not any((tmp_path / "warehouse").rglob("*.json"))


def test_decide_opens_a_batch_epoch_and_a_retry_reattaches(variables) -> None:
    plan = decide_task({}, get_variable=variables.get)
    assert (plan["epoch"], plan["mode"], plan["attached"]) == (1, "batch", False)
    assert sum(plan["boundary"].values()) == RECORDS
    assert branch_for(plan) == ["backlog_batch"]
    retried = decide_task({}, get_variable=variables.get)
    assert (retried["epoch"], retried["attached"]) == (1, True)


def test_control_command_is_queued(variables) -> None:
    result = submit_control_command(
        {"command": "switch_to_batch", "note": "burst"}, get_variable=variables.get
    )
    settings = settings_from_airflow(get_variable=variables.get)
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    [pending] = store.commands.pending()
    assert (pending.id, pending.kind, pending.args) == (
        result["command"],
        "switch_to_batch",
        {"note": "burst"},
    )


def test_rewind_by_event_time_resolves_offsets(variables) -> None:
    result = submit_control_command(
        {"command": "rewind", "event_time": "2000-01-01T00:00:00Z"}, get_variable=variables.get
    )
    assert result["args"]["offsets"] == {"0": 0, "1": 0}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"command": "explode"}, "param command: 'explode' is not one of"),
        ({"command": "rewind"}, "rewind needs exactly one of param offsets"),
        ({"command": "rewind", "offsets": {"7": 1}}, r"unknown bucket\(s\) \[7\]"),
        ({"command": "rewind", "offsets": {"0": -1}}, "offsets >= 0"),
        ({"command": "rewind", "event_time": "yesterday-ish"}, "param event_time"),
        ({"command": "pause", "offsets": {"0": 1}}, "only rewind takes them"),
    ],
)
def test_bad_control_params_are_refused(variables, params, message) -> None:
    with pytest.raises(ConfigError, match=message):
        submit_control_command(params, get_variable=variables.get)
    settings = settings_from_airflow(get_variable=variables.get)
    assert StateStore(settings.state_root, settings.sink, settings.pipeline).commands.list() == []


def test_trigger_serialize_round_trip(variables) -> None:
    settings = settings_from_airflow(get_variable=variables.get).to_json()
    trigger = LagThresholdTrigger(settings=settings, offset_lag_threshold=10, poll_interval=0.1)
    classpath, kwargs = trigger.serialize()
    assert classpath == "modeswitch.airflow.triggers.LagThresholdTrigger"
    module, name = classpath.rsplit(".", 1)
    rebuilt = getattr(__import__(module, fromlist=[name]), name)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    with pytest.raises(ValueError, match="set watermark_lag_threshold or offset_lag_threshold"):
        LagThresholdTrigger(settings=settings)


async def _first_event(trigger: LagThresholdTrigger, timeout: float):
    async def first():
        async for event in trigger.run():
            return event

    return await asyncio.wait_for(first(), timeout)


def test_trigger_fires_when_offset_lag_crosses(variables) -> None:
    settings = settings_from_airflow(get_variable=variables.get).to_json()
    above = LagThresholdTrigger(settings=settings, offset_lag_threshold=RECORDS - 1)
    event = asyncio.run(_first_event(above, timeout=10))
    assert event.payload["status"] == "crossed"
    assert event.payload["offset_lag"] == RECORDS

    below = LagThresholdTrigger(settings=settings, offset_lag_threshold=RECORDS, poll_interval=0.05)
    with pytest.raises(TimeoutError):
        asyncio.run(_first_event(below, timeout=0.5))


def test_sensor_defers_below_the_threshold_and_returns_when_crossed(variables, monkeypatch) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from modeswitch.airflow.sensors import LagThresholdSensor

    for key, value in variables.items():
        monkeypatch.setenv(f"AIRFLOW_VAR_{key.upper()}", value)
    below = LagThresholdSensor(task_id="lag_below", offset_lag_threshold=RECORDS, poke_interval=5)
    with pytest.raises(TaskDeferred) as deferred:
        below.execute({})
    assert isinstance(deferred.value.trigger, LagThresholdTrigger)
    assert deferred.value.method_name == "execute_complete"
    above = LagThresholdSensor(task_id="lag_above", offset_lag_threshold=RECORDS - 1)
    assert above.execute({})["offset_lag"] == RECORDS
    event = {"status": "crossed", "reason": "offset lag", "offset_lag": RECORDS}
    assert below.execute_complete({}, event) == event


def test_a_missing_spark_connection_is_refused_not_yarn() -> None:
    from modeswitch.airflow.operators import require_spark_connection

    with pytest.raises(ConfigError, match=r"'spark_nowhere' is not defined.*YARN"):
        require_spark_connection("spark_nowhere")
    require_spark_connection("spark_default")  # set by conftest, as make demo/airflow set it


def test_the_job_task_refuses_a_plan_of_the_other_mode() -> None:
    from modeswitch.airflow.tasks import require_running_epoch
    from modeswitch.errors import ModeswitchError

    require_running_epoch({"epoch": 3, "mode": "stream"}, "stream")
    with pytest.raises(ModeswitchError, match="stream job was asked to run plan batch epoch 3"):
        require_running_epoch({"epoch": 3, "mode": "batch"}, "stream")


def test_a_declared_pipelines_decide_uses_its_layers_and_logs_variables_that_tune_nothing(
    variables, tmp_path: Path, monkeypatch, caplog, airflow_db
) -> None:
    """decide for a pipeline of the pipelines folder: its file over the deployment's Variables
    (which name another pipeline's source, left out for it), its own Variable over its file;
    a misspelled Variable, in the metadata database or the environment, is a warning in the
    task's log naming it and the nearest real name."""
    import logging

    from airflow.models.variable import Variable as StoredVariable

    from modeswitch.airflow.settings import deployment_fleet

    folder = tmp_path / "pipelines"
    folder.mkdir()
    log = SegmentLog.create(str(tmp_path / "orders-log"), buckets=3)
    produce_backlog(log, EventGenerator(seed=3, buckets=3), records=300)
    (folder / "orders.toml").write_text(
        f'source = "{tmp_path}/orders-log"\nwarehouse = "{tmp_path}/fleet"\nexit_threshold = "9s"\n'
    )
    monkeypatch.setenv("MODESWITCH_PIPELINES_DIR", str(folder))
    monkeypatch.setenv("AIRFLOW_VAR_MODESWITCH_ORDERS_ENTER_THRESHOLD", "77s")
    monkeypatch.setenv("AIRFLOW_VAR_MODESWITCH_EXIT_TRESHOLD", "1s")
    StoredVariable.set("modeswitch_orders_exti_threshold", "2s")
    try:
        variables["modeswitch_orders_enter_threshold"] = "77s"
        with caplog.at_level(logging.WARNING, logger="modeswitch.airflow.tasks"):
            plan = decide_task(
                {"dry_run": True},
                get_variable=variables.get,
                pipeline=deployment_fleet().get("orders"),
            )
    finally:
        StoredVariable.delete("modeswitch_orders_exti_threshold")
    assert plan["pipeline"] == "orders" and plan["mode"] == "batch"
    settings = PipelineSettings.from_json(plan["settings"])
    assert settings.source == f"{tmp_path}/orders-log"
    assert settings.policy.enter_threshold == timedelta(seconds=77)
    assert settings.policy.exit_threshold == timedelta(seconds=9)
    warned = caplog.text
    assert "'modeswitch_exit_treshold'" in warned and "modeswitch_exit_threshold?" in warned
    assert "'modeswitch_orders_exti_threshold'" in warned
    assert "modeswitch_orders_exit_threshold?" in warned
    assert "modeswitch_orders_enter_threshold'" not in warned
