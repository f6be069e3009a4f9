"""Under Airflow a Kafka source's client configuration is the extras of a Connection (the
``kafka_connection`` setting, ``kafka_default`` by default): the tasks open the topic with it
in-process (never through this process's environment), and the Spark job gets it in
spark-submit's environment, never on its command line, in the settings or in an XCom."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
from confluent_kafka import Producer

from modeswitch.airflow.operators import EpochJobOperator
from modeswitch.airflow.settings import settings_from_airflow
from modeswitch.airflow.tasks import decide_task
from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.errors import ConfigError
from modeswitch.sources import open_log
from modeswitch.sources.kafka import ENV_KAFKA_CONFIG, KafkaLocation

SECRET = "kafka-s3cr3t"


@pytest.fixture
def variables(kafka_cluster: KafkaBroker, new_topic: Callable[[int], str], tmp_path: Path):
    source = new_topic(2)
    producer = Producer(kafka_cluster.config)
    for n in range(100):
        producer.produce(KafkaLocation.parse(source).topic, b"{}", partition=n % 2)
    producer.flush(10)
    # sasl.password with a plaintext protocol: librdkafka takes it and does not use it; here
    # it stands for any secret of the client configuration.
    extras = {**kafka_cluster.config, "sasl.password": SECRET}
    connections = {
        "AIRFLOW_CONN_TEAM_KAFKA": json.dumps({"conn_type": "kafka", "extra": extras}),
        "AIRFLOW_CONN_NO_SERVERS": json.dumps({"conn_type": "kafka", "extra": {"a": "b"}}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
    }
    values = {
        "modeswitch_pipeline": "kafka_creds",
        "modeswitch_source": source,
        "modeswitch_warehouse": str(tmp_path / "warehouse"),
        "modeswitch_kafka_connection": "team_kafka",
    }
    with mock.patch.dict(os.environ, connections):
        os.environ.pop(ENV_KAFKA_CONFIG)  # the session's: the tasks must not need it
        yield values


def test_decide_reads_the_topic_with_the_connections_configuration(variables) -> None:
    plan = decide_task({"force_mode": "auto"}, get_variable=variables.get, idle_wait=0)
    assert plan["mode"] == "batch"
    assert plan["boundary"] == {"0": 50, "1": 50}
    assert SECRET not in json.dumps(plan)  # nothing of it in the XCom or the settings
    assert ENV_KAFKA_CONFIG not in os.environ  # handed over, never exported

    job = EpochJobOperator(task_id="backlog_batch", kind="batch")
    job.prepare(plan)
    assert json.loads(job.env_vars[ENV_KAFKA_CONFIG])["sasl.password"] == SECRET
    command = job._get_hook()._build_spark_submit_command(job.application)
    assert SECRET not in " ".join(command)
    assert "team_kafka" in " ".join(command)  # only the connection's id travels there
    with pytest.raises(ConfigError, match=r"no Kafka bootstrap\.servers"):
        open_log(variables["modeswitch_source"])  # outside the tasks: nothing configured


@pytest.mark.parametrize(
    ("connection", "message"),
    [
        ("nowhere", "Airflow connection 'nowhere' is not defined"),
        ("no_servers", "Airflow connection 'no_servers' has no bootstrap.servers"),
    ],
)
def test_a_missing_or_incomplete_connection_is_refused(variables, connection, message) -> None:
    variables["modeswitch_kafka_connection"] = connection
    with pytest.raises(ConfigError, match=f"kafka_connection: {message}"):
        decide_task({"force_mode": "auto"}, get_variable=variables.get, idle_wait=0)
    settings = settings_from_airflow(get_variable=variables.get)
    assert settings.kafka_connection == connection
