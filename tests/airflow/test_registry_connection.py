"""A registry-framed Avro payload's schema registry comes from an Airflow Connection (setting
``schema_registry_connection``): the Spark job gets its client settings in spark-submit's
environment, as a Kafka source's client configuration, never on its command line or in the
settings; a pipeline of any other payload looks no such Connection up. (The mapping of the
Connection's fields: tests/unit/test_registry_client_config.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

import pytest

from modeswitch.airflow.operators import EpochJobOperator
from modeswitch.airflow.settings import settings_from_airflow
from modeswitch.environment import SCHEMA_REGISTRY_CONFIG
from modeswitch.errors import ConfigError

SECRET = "r3gistry-s3cr3t-51c2"
ENV_REGISTRY = SCHEMA_REGISTRY_CONFIG.name


@pytest.fixture
def variables(tmp_path: Path):
    connections = {
        "AIRFLOW_CONN_TEAM_REGISTRY": json.dumps(
            {
                "conn_type": "http",
                "host": "registry",
                "schema": "https",
                "port": 8081,
                "login": "reader",
                "password": SECRET,
                "extra": {"timeout": 5},
            }
        ),
        "AIRFLOW_CONN_SPARK_YARN": json.dumps({"conn_type": "spark", "host": "yarn"}),
    }
    values = {
        "modeswitch_pipeline": "orders",
        "modeswitch_source": str(tmp_path / "log"),
        "modeswitch_warehouse": str(tmp_path / "warehouse"),
        "modeswitch_value_format": "avro",
        "modeswitch_value_subject": "orders-value",
        "modeswitch_schema_registry_connection": "team_registry",
    }
    with mock.patch.dict(os.environ, connections):
        os.environ.pop(ENV_REGISTRY, None)
        yield values


def _plan(variables) -> dict:
    settings = settings_from_airflow(get_variable=variables.get)
    return {"pipeline": "orders", "epoch": 1, "mode": "batch", "settings": settings.to_json()}


@pytest.mark.parametrize(
    "payload",
    [
        {},
        # A key framed by the registry beside a value that is not: the Connection all the same.
        {
            "modeswitch_value_format": "raw",
            "modeswitch_value_subject": "",
            "modeswitch_key_format": "avro",
            "modeswitch_key_subject": "orders-key",
        },
    ],
)
def test_an_avro_jobs_environment_carries_the_registrys_connection(variables, payload) -> None:
    variables.update(payload)
    plan = _plan(variables)
    assert SECRET not in plan["settings"]  # the settings name the connection only
    job = EpochJobOperator(task_id="backlog_batch", kind="batch")
    job.prepare(plan)
    assert json.loads(job.env_vars[ENV_REGISTRY]) == {
        "url": "https://registry:8081",
        "basic.auth.credentials.source": "USER_INFO",
        "basic.auth.user.info": f"reader:{SECRET}",
        "timeout": "5",
    }
    assert ENV_REGISTRY not in os.environ  # handed over, never exported
    command = job._get_hook()._build_spark_submit_command(job.application)
    assert SECRET not in " ".join(command)
    assert "team_registry" in " ".join(command)  # only the connection's id travels there

    on_yarn = EpochJobOperator(task_id="on_yarn", kind="batch", conn_id="spark_yarn")
    with pytest.raises(ConfigError, match="schema registry's client configuration on its command"):
        on_yarn.prepare(plan)


@pytest.mark.parametrize(
    "payload",
    [
        {"modeswitch_value_format": "raw", "modeswitch_value_subject": ""},
        {"modeswitch_value_schema_file": "/schemas/order.avsc", "modeswitch_value_subject": ""},
    ],
)
def test_a_payload_without_a_registry_looks_up_no_connection(variables, payload) -> None:
    variables.update(payload, modeswitch_schema_registry_connection="nowhere")
    job = EpochJobOperator(task_id="backlog_batch", kind="batch")
    job.prepare(_plan(variables))
    assert ENV_REGISTRY not in job.env_vars


def test_an_undefined_registry_connection_is_refused_naming_the_setting(variables) -> None:
    variables["modeswitch_schema_registry_connection"] = "nowhere"
    job = EpochJobOperator(task_id="backlog_batch", kind="batch")
    with pytest.raises(
        ConfigError,
        match="schema_registry_connection: Airflow connection 'nowhere' is not defined; define "
        "it with the registry API's URL as its host",
    ):
        job.prepare(_plan(variables))
