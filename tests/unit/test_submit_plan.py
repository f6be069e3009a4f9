"""One builder of every spark-submit of ours (runners/submit.py): a rule per test."""

from __future__ import annotations

import json

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.runners.submit import SubmitMachine, job_arguments, submit_plan

MACHINE = SubmitMachine(
    driver_python="/venv/bin/python",
    worker_python="/venv/bin/worker-python",
    jars=("/jars/delta-spark.jar", "/jars/delta-storage.jar"),
    java_options="-XX:SharedArchiveFile=/cache/spark.jsa",
    search_path="/usr/bin",
)


def settings(**overrides) -> PipelineSettings:
    return PipelineSettings.from_mapping(
        {"warehouse": "/w", "source": "/w/log", "batch_driver_memory": "768m", **overrides}
    )


def plan(kind, **kwargs):
    given = settings()
    return submit_plan(
        kind,
        given,
        label=kwargs.pop("label", kind),
        target=kwargs.pop("target", ["--epoch", "3"]),
        config=given.to_json(),
        machine=MACHINE,
        **kwargs,
    )


def test_the_arguments_name_the_pipeline_target_and_settings() -> None:
    job = plan("batch", label="batch-epoch-3")
    assert job.name == "modeswitch-modeswitch-batch-epoch-3"
    assert job.application.endswith("jobs/backlog_batch.py")
    assert job.application_args == job_arguments(
        "modeswitch", ["--epoch", "3"], settings().to_json()
    )
    assert job.application_args[:4] == ["--pipeline", "modeswitch", "--epoch", "3"]


@pytest.mark.parametrize("kind", ["batch", "backfill", "engine"])
def test_a_job_that_runs_batch_waves_gets_the_batch_driver_sizing(kind) -> None:
    conf = plan(kind).conf
    assert conf["spark.driver.memory"] == "768m"
    assert (
        conf["spark.driver.extraJavaOptions"] == "-Xms768m -XX:SharedArchiveFile=/cache/spark.jsa"
    )


def test_the_stream_job_keeps_sparks_driver_default() -> None:
    conf = plan("stream").conf
    assert "spark.driver.memory" not in conf
    assert conf["spark.driver.extraJavaOptions"] == MACHINE.java_options


def test_the_deployments_conf_wins_and_a_driver_it_sizes_is_not_resized() -> None:
    conf = plan("engine", own_conf={"spark.driver.memory": "4g", "spark.ui.enabled": "true"}).conf
    assert conf["spark.driver.memory"] == "4g" and conf["spark.ui.enabled"] == "true"
    assert "-Xms" not in conf["spark.driver.extraJavaOptions"]
    # Its JVM options are kept, with the fixed heap beside them when the settings size it.
    own = plan("batch", own_conf={"spark.driver.extraJavaOptions": "-Dx=1"}).conf
    assert own["spark.driver.extraJavaOptions"].split() == [
        "-Dx=1",
        "-Xms768m",
        "-XX:SharedArchiveFile=/cache/spark.jsa",
    ]


def test_our_jars_follow_the_deployments_and_delta_is_the_catalog_unless_it_says_otherwise() -> (
    None
):
    conf = plan("stream", own_conf={"spark.jars": "/own.jar, /jars/delta-spark.jar"}).conf
    assert conf["spark.jars"] == "/own.jar,/jars/delta-spark.jar,/jars/delta-storage.jar"
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    mine = plan("stream", own_conf={"spark.sql.extensions": "my.Extension"}).conf
    assert mine["spark.sql.extensions"] == "my.Extension"


def test_the_interpreters_and_the_environment_layers() -> None:
    job = plan(
        "stream",
        connection_env={"AWS_ACCESS_KEY_ID": "from-connection", "KAFKA": "k"},
        own_env={"AWS_ACCESS_KEY_ID": "from-dag"},
    )
    assert job.conf["spark.pyspark.python"] == "/venv/bin/worker-python"
    assert job.conf["spark.pyspark.driver.python"] == "/venv/bin/python"
    assert job.env_vars["PATH"] == "/venv/bin:/usr/bin"
    assert job.env_vars["PYSPARK_PYTHON"] == "/venv/bin/python"
    assert job.env_vars["AWS_ACCESS_KEY_ID"] == "from-dag" and job.env_vars["KAFKA"] == "k"


def _kafka_plan(config: dict[str, str], **kwargs):
    given = settings(source="kafka://events")
    return submit_plan(
        "stream",
        given,
        label="stream",
        target=["--epoch", "3"],
        config=given.to_json(),
        machine=MACHINE,
        connection_env={"MODESWITCH_KAFKA_CONFIG": json.dumps(config)},
        **kwargs,
    )


def test_a_kafka_source_logging_in_at_a_token_endpoint_allows_it_in_every_jvm() -> None:
    """kafka-clients 4 refuses a token endpoint its JVM does not allow; the URL goes on the
    JVMs' options, the client's secret never does."""
    oauth = {
        "bootstrap.servers": "b:9094",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": "reader",
        "sasl.oauthbearer.client.secret": "submit-s3cr3t",
        "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
    }
    job = _kafka_plan(oauth, own_conf={"spark.executor.extraJavaOptions": "-Dx=1"})
    allowed = "-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=https://idp/token"
    assert job.conf["spark.driver.extraJavaOptions"].split() == [MACHINE.java_options, allowed]
    assert job.conf["spark.executor.extraJavaOptions"].split() == ["-Dx=1", allowed]
    assert not any("submit-s3cr3t" in value for value in job.conf.values())
    # Another way in, or another source: no such option.
    assert "spark.executor.extraJavaOptions" not in _kafka_plan({"bootstrap.servers": "b"}).conf
    assert "spark.executor.extraJavaOptions" not in plan("stream").conf
