"""The deployment's served engine (runners/served.py): reached at MODESWITCH_ENGINE_ADDRESS with
MODESWITCH_ENGINE_TOKEN, followed by a trigger through tcp://HOST:PORT, and refused without
its token; the runner choice hands it the epochs wherever one is configured."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.environment import ENGINE_ADDRESS, ENGINE_TOKEN
from modeswitch.errors import ConfigError
from modeswitch.runners.base import runner_choice
from modeswitch.runners.engine import EngineLostError, ping
from modeswitch.runners.engine_server import Engine, _Server, main
from modeswitch.runners.served import (
    ServedEngineRunner,
    await_epoch,
    engine_at,
    reachable,
    serve_command,
    served_address,
    spark_conf_pair,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def settings(tmp_path: Path) -> PipelineSettings:
    return PipelineSettings.from_mapping(
        {"pipeline": "p", "source": str(tmp_path / "log"), "warehouse": str(tmp_path / "w")}
    )


@pytest.fixture
def served(settings: PipelineSettings, monkeypatch: pytest.MonkeyPatch):
    """An engine listening on a port of its own with the token ``s3cret``, its epochs run by
    a thread of the test; the environment names it as the compose stack's does."""
    ran: list[tuple[str, int]] = []
    engine = Engine(
        None, settings.pipeline, lambda kind, spark, epoch, s: ran.append((kind, epoch))
    )
    server = _Server(engine, "s3cret", "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            engine.run_next(timeout=0.1)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    port = server.server_address[1]
    monkeypatch.setenv(ENGINE_ADDRESS.name, f"127.0.0.1:{port}")
    monkeypatch.setenv(ENGINE_TOKEN.name, "s3cret")
    yield ran, port
    stop.set()
    worker.join(5)
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("engine", ["auto", "warm"])
def test_a_served_engine_takes_the_epochs_whatever_the_executor(engine) -> None:
    name, why = runner_choice(
        engine, airflow=True, executor="CeleryExecutor", deploy_mode="cluster", served="engine:7788"
    )
    assert name == "served" and "engine:7788" in why
    assert runner_choice(engine, airflow=False, served="engine:7788")[0] == "served"
    # A job per epoch, when the settings ask for it, even where an engine is served.
    assert runner_choice("submit", airflow=True, served="engine:7788")[0] == "submit"
    assert runner_choice(engine, airflow=False)[0] == "warm"  # none served: as before


def test_an_epoch_runs_on_the_served_engine_and_a_trigger_follows_it(
    served, settings: PipelineSettings
) -> None:
    ran, port = served
    runner = ServedEngineRunner()
    handle = runner.start("batch", settings, 4)
    assert handle.follow_at == f"tcp://127.0.0.1:{port}"
    handle.wait()
    assert ran == [("batch", 4)] and runner.alive()
    # A trigger follows it through tcp://HOST:PORT, its token from its own environment: the
    # token is never in the trigger's arguments (Airflow's metadata database).
    from modeswitch.airflow.triggers import EngineEpochTrigger

    trigger = EngineEpochTrigger(follow_at=handle.follow_at, kind="batch", epoch=4)
    assert "s3cret" not in json.dumps(trigger.serialize()[1])
    assert asyncio.run(await_epoch(handle.follow_at, "batch", 4)) == {"status": "done"}
    ended = asyncio.run(await_epoch(handle.follow_at, "stream", 9))
    assert ended["status"] == "lost" and "has not run stream epoch 9" in ended["error"]


def test_without_the_token_nothing_runs(served, settings, monkeypatch) -> None:
    ran, port = served
    monkeypatch.setenv(ENGINE_TOKEN.name, "guess")
    with pytest.raises(EngineLostError, match=rf"127.0.0.1:{port}.*bad or missing token"):
        ServedEngineRunner().start("batch", settings, 1)
    monkeypatch.delenv(ENGINE_TOKEN.name)
    address = served_address(settings)
    assert address is not None and address.token == ""
    with pytest.raises(OSError, match="refused"):
        ping(address)
    assert not reachable(address)
    assert ran == []


def test_an_engine_out_of_reach_fails_the_task_naming_it(settings, monkeypatch) -> None:
    monkeypatch.setenv(ENGINE_ADDRESS.name, "127.0.0.1:9")  # discard: nothing listens
    monkeypatch.setenv(ENGINE_TOKEN.name, "s3cret")
    with pytest.raises(EngineLostError, match=r"127.0.0.1:9 \(MODESWITCH_ENGINE_ADDRESS\)"):
        ServedEngineRunner().start("stream", settings, 2)
    lost = asyncio.run(await_epoch("tcp://127.0.0.1:9", "stream", 2))
    assert lost["status"] == "lost" and "tcp://127.0.0.1:9" in lost["error"]


def test_the_address_is_checked_and_a_listening_engine_needs_its_token(monkeypatch) -> None:
    monkeypatch.setenv(ENGINE_ADDRESS.name, "engine")
    with pytest.raises(ConfigError, match="MODESWITCH_ENGINE_ADDRESS: 'engine' is not HOST:PORT"):
        served_address(PipelineSettings.from_mapping({"source": "/l", "warehouse": "/w"}))
    monkeypatch.setenv(ENGINE_ADDRESS.name, "engine:7788")
    monkeypatch.delenv(ENGINE_TOKEN.name, raising=False)
    with pytest.raises(SystemExit):
        main(["--pipeline", "p", "--config", "{}", "--listen"])
    address = engine_at("tcp://engine:7788")
    assert (address.host, address.port, address.pid) == ("engine", 7788, 0)


def test_the_served_engines_submit_carries_the_deployments_conf(monkeypatch) -> None:
    """``serve --conf spark.cores.max=2``: the engine's application holds no more of a shared
    cluster than the deployment gives it (a backfill's job needs the rest); the driver's
    address stays the engine's own."""
    conf = dict(spark_conf_pair(p) for p in ("spark.cores.max=2", "spark.executor.cores=1"))
    command, _ = serve_command(
        "events", "/data/log", "/data/warehouse", "spark://m:7077", "engine", conf
    )
    pairs = {command[i + 1] for i, part in enumerate(command) if part == "--conf"}
    assert {"spark.cores.max=2", "spark.executor.cores=1", "spark.driver.host=engine"} <= pairs
    with pytest.raises(ConfigError, match="expected spark"):
        spark_conf_pair("cores.max=2")
