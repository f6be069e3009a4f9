"""Storage credentials come from an Airflow Connection (setting ``storage_connection``): its
extras are handed to the control state and the sink as arguments (never through this process's
environment), to a deferred sensor's trigger by the Connection's id, and to the Spark job
through spark-submit's environment, never its command line or the settings."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from unittest import mock

import pytest

from modeswitch.airflow.operators import EpochJobOperator
from modeswitch.airflow.settings import connection_storage_options, settings_from_airflow
from modeswitch.airflow.tasks import decide_task
from modeswitch.airflow.triggers import LagThresholdTrigger
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import ConfigError
from modeswitch.sinks.options import sink_options
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore
from modeswitch.storage import ENV_STORAGE_OPTIONS, storage_options

SECRET = "s3cr3t-value"
EXTRAS = {"AWS_REGION": "eu-west-1", "AWS_SECRET_ACCESS_KEY": SECRET}


@pytest.fixture
def variables(tmp_path: Path):
    log = SegmentLog.create(str(tmp_path / "log"), buckets=2)
    produce_backlog(log, EventGenerator(seed=1, buckets=2), records=500)
    connections = {
        "AIRFLOW_CONN_WAREHOUSE_STORE": json.dumps({"conn_type": "generic", "extra": EXTRAS}),
        "AIRFLOW_CONN_BARE_STORE": json.dumps({"conn_type": "generic"}),
        "AIRFLOW_CONN_SPARK_YARN": json.dumps({"conn_type": "spark", "host": "yarn"}),
    }
    values = {
        "modeswitch_pipeline": "creds",
        "modeswitch_source": str(tmp_path / "log"),
        "modeswitch_warehouse": str(tmp_path / "warehouse"),
        "modeswitch_storage_connection": "warehouse_store",
    }
    with mock.patch.dict(os.environ, connections):
        os.environ.pop(ENV_STORAGE_OPTIONS, None)
        yield values


def test_the_connections_extras_become_the_tables_storage_options(variables) -> None:
    settings = settings_from_airflow(get_variable=variables.get)
    assert SECRET not in settings.to_json()  # the settings name the connection only
    options = connection_storage_options(settings)
    assert options == EXTRAS
    assert (
        StateStore.from_settings(settings, storage_options=options).tables.storage_options == EXTRAS
    )
    written = sink_options(settings, 1, "batch")  # Spark prints a write's options
    assert SECRET not in json.dumps(written)
    assert ENV_STORAGE_OPTIONS not in os.environ  # handed over, never exported
    assert StateStore.from_settings(settings).tables.storage_options == {}  # a job: its environment


def _record_stores(monkeypatch) -> list[dict[str, str]]:
    """The storage options of every StateStore made from settings, and the environment's
    value at that moment (which must stay unset)."""
    seen = []
    real = StateStore.from_settings.__func__

    def recording(cls, settings, *, storage_options=None):
        store = real(cls, settings, storage_options=storage_options)
        seen.append((store.tables.storage_options, os.environ.get(ENV_STORAGE_OPTIONS)))
        return store

    monkeypatch.setattr(StateStore, "from_settings", classmethod(recording))
    return seen


def test_decide_runs_with_the_connections_storage_options(variables, monkeypatch) -> None:
    seen = _record_stores(monkeypatch)
    plan = decide_task({"force_mode": "auto"}, get_variable=variables.get)
    assert plan["mode"] == "batch"
    assert seen == [(EXTRAS, None)]
    assert SECRET not in json.dumps(plan)  # nothing of it in the XCom


def test_a_deferred_lag_sensor_reads_with_the_connections_storage_options(
    variables, monkeypatch
) -> None:
    # The trigger runs in the triggerer, far from the task: it gets the Connection's id in
    # the settings and resolves the extras itself.
    seen = _record_stores(monkeypatch)
    settings = settings_from_airflow(get_variable=variables.get)
    trigger = LagThresholdTrigger(
        settings=settings.to_json(), offset_lag_threshold=10, poll_interval=0.1
    )
    _, kwargs = trigger.serialize()
    assert SECRET not in json.dumps(kwargs)

    async def first_event():
        async for event in LagThresholdTrigger(**kwargs).run():
            return event.payload

    event = asyncio.run(first_event())
    assert event["status"] == "crossed", event  # 500 records, nothing committed
    assert event["offset_lag"] == 500
    assert seen and all(found == (EXTRAS, None) for found in seen)

    variables["modeswitch_storage_connection"] = "nowhere"
    missing = settings_from_airflow(get_variable=variables.get).to_json()

    async def error_event():
        async for event in LagThresholdTrigger(settings=missing, offset_lag_threshold=10).run():
            return event.payload

    event = asyncio.run(error_event())
    assert event["status"] == "error"
    assert "Airflow connection 'nowhere' is not defined" in event["reason"]


def test_the_job_gets_them_in_its_environment_never_on_its_command_line(variables) -> None:
    settings = settings_from_airflow(get_variable=variables.get)
    plan = {"pipeline": "creds", "epoch": 1, "mode": "batch", "settings": settings.to_json()}
    job = EpochJobOperator(task_id="backlog_batch", kind="batch")
    job.prepare(plan)
    assert json.loads(job.env_vars[ENV_STORAGE_OPTIONS]) == EXTRAS
    command = job._get_hook()._build_spark_submit_command(job.application)
    assert SECRET not in " ".join(command)
    assert "warehouse_store" in " ".join(command)  # only the connection's id travels there

    on_yarn = EpochJobOperator(task_id="on_yarn", kind="batch", conn_id="spark_yarn")
    with pytest.raises(ConfigError, match="would put the storage credentials on its command"):
        on_yarn.prepare(plan)


@pytest.mark.parametrize(
    ("connection", "message"),
    [
        ("nowhere", "Airflow connection 'nowhere' is not defined"),
        ("bare_store", "Airflow connection 'bare_store' has no extras"),
    ],
)
def test_a_missing_or_empty_connection_is_refused(variables, connection, message) -> None:
    variables["modeswitch_storage_connection"] = connection
    with pytest.raises(ConfigError, match=f"storage_connection: {message}"):
        decide_task({"force_mode": "auto"}, get_variable=variables.get)


def test_a_malformed_environment_value_is_refused_without_repeating_it() -> None:
    with pytest.raises(ConfigError, match="not valid JSON") as raised:
        storage_options({ENV_STORAGE_OPTIONS: '{"AWS_SECRET_ACCESS_KEY": "s3cr3t'})
    assert "s3cr3t" not in str(raised.value)
    with pytest.raises(ConfigError, match="expected a JSON object"):
        storage_options({ENV_STORAGE_OPTIONS: '["a"]'})
    assert storage_options({}) == {}
