"""The deployment's wiring, checked in milliseconds without Docker (the stack itself runs in
tests/compose, `make test-compose`): docker-compose.yaml parsed as YAML, its connections
resolved by the Spark provider and by modeswitch's own settings code, its Variables read as the
DAGs read them, its paths checked against what the Dockerfile puts where."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from modeswitch.airflow.settings import _kafka_extras, settings_from_airflow
from modeswitch.devtools.compose import SECRET_NAMES
from modeswitch.runners.jvm import JARS_FOLDER

pytestmark = pytest.mark.airflow

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = {"airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"}
SPARK = {"spark-master", "spark-worker-1", "spark-worker-2"}
LONG_RUNNING = AIRFLOW | SPARK | {"postgres", "kafka", "engine"}
SECRETS = ("PASSWORD", "SECRET", "FERNET", "KEY")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yaml").read_text())


@pytest.fixture(scope="module")
def services(compose: dict) -> dict:
    return compose["services"]


def image_paths() -> dict[str, str]:
    """Where the Dockerfile puts each folder of the repository: ``{source: absolute path}``."""
    workdir, placed = "/", {}
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if not line.startswith(("WORKDIR ", "COPY ")):
            continue
        words = shlex.split(line)
        if words[:1] == ["WORKDIR"]:
            workdir = words[1]
        elif words[:1] == ["COPY"]:
            sources = [w for w in words[1:-1] if not w.startswith("--")]
            target = words[-1]
            for source in sources:
                where = target if target.startswith("/") else f"{workdir}/{target}"
                placed[source] = str(Path(where.rstrip("/")))
    return placed


def test_every_service_is_there_and_the_long_running_ones_have_healthchecks(
    services: dict,
) -> None:
    assert LONG_RUNNING | {"airflow-init"} <= set(services)
    for name in LONG_RUNNING:
        test = services[name].get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL"), name
    for name, service in services.items():  # every condition names a service that can meet it
        for needed, how in (service.get("depends_on") or {}).items():
            assert needed in services, (name, needed)
            if how["condition"] == "service_healthy":
                assert "healthcheck" in services[needed], (name, needed)


def test_airflow_runs_on_postgres_with_the_local_executor_and_this_repos_dags(
    services: dict,
) -> None:
    placed = image_paths()
    assert (
        placed["dags"] == "/opt/modeswitch/dags" and placed["plugins"] == "/opt/modeswitch/plugins"
    )
    for name in AIRFLOW | {"airflow-init"}:
        env = services[name]["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor", name
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
        assert "@postgres/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        assert env["AIRFLOW__CORE__DAGS_FOLDER"] == placed["dags"], name
        assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == placed["plugins"], name
    assert {"airflow", "db", "migrate"} <= set(services["airflow-init"]["command"])
    commands = {services[n]["command"][1] for n in AIRFLOW}
    assert commands == {"api-server", "scheduler", "dag-processor", "triggerer"}
    server = services["airflow-scheduler"]["environment"]["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]
    assert server.startswith("http://airflow-apiserver:8080/")


def test_the_connections_resolve_to_the_clusters_in_the_file(
    services: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    env = services["airflow-scheduler"]["environment"]
    for key in ("AIRFLOW_CONN_SPARK_DEFAULT", "AIRFLOW_CONN_KAFKA_DEFAULT"):
        monkeypatch.setenv(key, env[key])

    spark = SparkSubmitHook(conn_id="spark_default")._connection
    master = services["spark-master"]["command"]
    port = master[master.index("--port") + 1]
    assert spark["master"] == f"spark://spark-master:{port}"
    assert spark["deploy_mode"] == "client"  # the driver in the scheduler, executors in workers
    for worker in ("spark-worker-1", "spark-worker-2"):
        command = services[worker]["command"]
        assert command[0] == "org.apache.spark.deploy.worker.Worker"
        assert command[1] == spark["master"]
    # The served engine holds part of the cluster only: a backfill's job gets executors too.
    cores = sum(int(services[w]["command"][services[w]["command"].index("--cores") + 1])
                for w in ("spark-worker-1", "spark-worker-2"))  # fmt: skip
    engine = services["engine"]["command"]
    held = engine[engine.index("--conf", engine.index("--warehouse")) + 1]
    assert held == "spark.cores.max=${MODESWITCH_ENGINE_CORES:-2}"
    assert cores > 2
    # Executors reach the driver by the scheduler's name on the network.
    assert services["airflow-scheduler"]["hostname"] == "airflow-scheduler"

    from airflow.sdk import BaseHook

    kafka = _kafka_extras(BaseHook.get_connection("kafka_default"))
    # The broker advertises itself by its name on the network (docker/kafka/kafka-start).
    start = (REPO / "docker" / "kafka" / "kafka-start").read_text()
    assert f"prop advertised.listeners PLAINTEXT://{kafka['bootstrap.servers']}" in start
    assert services["kafka"]["hostname"] == kafka["bootstrap.servers"].split(":")[0]


def test_the_pipelines_settings_come_from_the_environment_and_live_on_the_shared_volume(
    services: dict,
) -> None:
    env = services["airflow-scheduler"]["environment"]
    defaults = dict(re.findall(r"\$\{(\w+):-([^}]*)\}", " ".join(str(v) for v in env.values())))

    def variable(key: str) -> str | None:
        value = env.get(f"AIRFLOW_VAR_{key.upper()}")
        if value is None:
            return None
        return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: defaults[m.group(1)], str(value))

    settings = settings_from_airflow(get_variable=variable)
    assert settings.source == "/data/log" and settings.warehouse == "/data/warehouse"
    # The served engine takes the epochs, under the name the tasks reach it by.
    assert env["MODESWITCH_ENGINE_ADDRESS"] == f"{services['engine']['hostname']}:7788"
    engine = services["engine"]["command"]
    assert engine[engine.index("--pipeline") + 1] == env["AIRFLOW_VAR_MODESWITCH_PIPELINE"]
    assert "ports" not in services["engine"]  # reached on the compose network only
    for name in AIRFLOW | SPARK | {"engine"}:  # the drivers and every executor: same paths
        assert "./.compose/data:/data" in services[name]["volumes"], name


def test_no_secret_is_in_the_file_and_env_example_names_each_one(services: dict) -> None:
    example = (REPO / ".env.example").read_text()
    checked = 0
    for name, service in services.items():
        for key, value in (service.get("environment") or {}).items():
            text = str(value)
            password = re.search(r"://[^/@:]+:([^@]+)@", text)  # a URL's credentials
            if password is not None:
                text = password.group(1)
            elif not any(word in key.upper() for word in SECRETS):
                continue
            checked += 1
            reference = re.fullmatch(r"\$\{(\w+)(:\?[^}]*)?\}", text)
            assert reference, f"{name}: {key} holds a literal secret"
            # .env.example names it, with no value.
            assert re.search(rf"^{reference.group(1)}=$", example, re.MULTILINE), reference
    assert checked >= 5  # the database URL, its password, Fernet key, JWT secret, engine token
    for name in re.findall(r"^(\w+)=$", example, re.MULTILINE):  # what make compose-demo makes
        assert name in SECRET_NAMES, name


def test_the_image_holds_the_fetched_jars_where_every_session_looks_for_them() -> None:
    placed = image_paths()
    # runners.jvm.JARS_FOLDER is the repository's .jars/, beside include/ (editable install).
    assert placed[".jars"] == f"{Path(placed['include']).parent}/.jars"
    assert JARS_FOLDER == REPO / ".jars"
