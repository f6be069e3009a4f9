"""The runner seam: which runner the settings choose, and the engine runner's lifecycle.

The runners themselves run real jobs in the e2e, faults and Airflow tiers; here the choice is
a pure function, tested one case at a time, and the engine runner is tried against a real
engine server on loopback whose epochs a stand-in runs (no Spark)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError, ModeswitchError
from modeswitch.runners import engine as engine_client
from modeswitch.runners.base import runner_choice
from modeswitch.runners.engine import ENGINE_DIR_ENV, EngineAddress, EngineRunner, engine_file
from modeswitch.runners.engine_server import Engine, _Server
from modeswitch.runners.local import LocalRunner
from modeswitch.runners.pipeline_run import open_runner

pytestmark = pytest.mark.unit


def test_warm_is_the_engine_with_or_without_airflow() -> None:
    assert runner_choice("warm", airflow=True)[0] == "warm"
    assert runner_choice("warm", airflow=False)[0] == "warm"
    assert runner_choice("warm", airflow=True, deploy_mode="client")[0] == "warm"


def test_submit_is_spark_submit_under_airflow_and_child_processes_without() -> None:
    assert runner_choice("submit", airflow=True)[0] == "submit"
    assert runner_choice("submit", airflow=True, deploy_mode="cluster")[0] == "submit"
    assert runner_choice("submit", airflow=False)[0] == "local"


def test_the_engine_in_cluster_deploy_mode_is_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match=r"engine: 'warm'.*cluster mode"):
        runner_choice("warm", airflow=True, deploy_mode="cluster")[0]


def test_an_unknown_engine_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"engine: 'hot' is not one of auto, submit, warm"):
        runner_choice("hot", airflow=False)[0]


def test_auto_is_the_default_and_the_engine_on_a_local_or_standalone_master() -> None:
    assert PipelineSettings.from_mapping({"pipeline": "p", "source": "/s"}).engine == "auto"
    assert runner_choice("auto", airflow=False)[0] == "warm"  # modeswitch run: the local master
    for master in ("local[*]", "local", "spark://127.0.0.1:7077", "spark://a:7077,b:7077"):
        for executor in ("LocalExecutor", "", "airflow.executors.local_executor.LocalExecutor"):
            name, why = runner_choice(
                "auto", airflow=True, deploy_mode="client", master=master, executor=executor
            )
            assert name == "warm", (master, executor, why)
            assert why.startswith("engine = auto: the pipeline's warm engine"), why
    assert runner_choice("auto", airflow=True, master="local[2]", deploy_mode=None)[0] == "warm"


@pytest.mark.parametrize(
    ("master", "deploy_mode", "executor", "because"),
    [
        ("spark://m:7077", "cluster", "LocalExecutor", "cluster deploy mode"),
        ("yarn", "client", "LocalExecutor", "master 'yarn'"),
        ("k8s://https://api:6443", None, "LocalExecutor", "master 'k8s://https://api:6443'"),
        ("local[*]", None, "CeleryExecutor", "executor CeleryExecutor may run tasks"),
        (
            "local[*]",
            None,
            "LocalExecutor,k8s:airflow.providers.cncf.kubernetes.executors."
            "kubernetes_executor.KubernetesExecutor",
            "executor KubernetesExecutor may run tasks",
        ),
    ],
)
def test_auto_is_a_job_per_epoch_where_the_engine_does_not_fit_and_says_why(
    master: str, deploy_mode: str | None, executor: str, because: str
) -> None:
    name, why = runner_choice(
        "auto", airflow=True, deploy_mode=deploy_mode, master=master, executor=executor
    )
    assert name == "submit"
    assert why.startswith("engine = auto: a job per epoch, not the warm engine: "), why
    assert because in why, why


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PipelineSettings:
    monkeypatch.setenv(ENGINE_DIR_ENV, str(tmp_path / "engines"))
    return PipelineSettings.from_mapping(
        {"pipeline": "p", "source": str(tmp_path / "log"), "warehouse": str(tmp_path / "w")}
    )


def _with(settings: PipelineSettings, **changes: str) -> PipelineSettings:
    return PipelineSettings.from_mapping({**settings.to_mapping(), **changes})


def test_open_runner_gives_the_runner_the_engine_setting_chooses(settings) -> None:
    with open_runner(_with(settings, engine="submit")) as runner:
        assert isinstance(runner, LocalRunner)
    for engine in ("warm", "auto"):
        with open_runner(_with(settings, engine=engine)) as runner:
            assert isinstance(runner, EngineRunner) and runner.owns_engine


class FakeEngine:
    """A real engine server on loopback, its epochs run by a stand-in in a thread."""

    def __init__(self, settings: PipelineSettings) -> None:
        self.ran: list[tuple[str, int]] = []
        self.failed: list[tuple[str, int]] = []

        def run(kind, spark, epoch, s) -> None:
            if epoch == 13:
                self.failed.append((kind, epoch))
                raise ModeswitchError("epoch 13 failed on purpose")
            self.ran.append((kind, epoch))

        self.engine = Engine(None, settings.pipeline, run, handoff=False)
        self.server = _Server(self.engine, "secret")
        self.stop = threading.Event()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        threading.Thread(target=self._loop, daemon=True).start()
        host, port = self.server.server_address[:2]
        self.address = EngineAddress(
            settings.pipeline, settings.state_root, os.getpid(), 0, host, port, "secret"
        )
        self.starts = 0

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.engine.run_next(timeout=0.1)

    def start(self, address_file: Path) -> None:
        self.starts += 1
        self.address.write(address_file)

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def test_the_engine_runner_starts_the_engine_once_and_runs_each_epoch_on_it(
    settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeEngine(settings)
    stopped: list[str] = []
    monkeypatch.setattr(engine_client, "stop_engine", lambda s: stopped.append(s.pipeline))
    try:
        runner = EngineRunner(fake.start, owns_engine=True)
        assert not runner.alive()
        runner.start("batch", settings, 1).wait()
        runner.start("stream", settings, 2).wait()
        assert fake.ran == [("batch", 1), ("stream", 2)]
        assert fake.starts == 1  # the second epoch found it running
        assert runner.alive() and engine_file(settings).exists()
        with pytest.raises(ModeswitchError, match="epoch 13 failed on purpose"):
            runner.start("batch", settings, 13).wait()
        assert fake.failed == [("batch", 13)]  # waiting on a failed epoch does not run it again
        runner.stop()
        assert stopped == ["p"]  # it started the engine, so it stops it
    finally:
        fake.close()


def test_an_engine_runner_stops_only_an_engine_it_started(
    settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeEngine(settings)
    stopped: list[str] = []
    monkeypatch.setattr(engine_client, "stop_engine", lambda s: stopped.append(s.pipeline))
    try:
        fake.start(engine_file(settings))  # someone else's engine runs already
        runner = EngineRunner(fake.start, owns_engine=True)
        runner.start("batch", settings, 1).wait()
        assert fake.starts == 1
        runner.stop()
        assert stopped == []
        # An Airflow task's runner never stops the engine: the next task uses it.
        airflow_task = EngineRunner(fake.start, owns_engine=False)
        airflow_task.start("stream", settings, 2).wait()
        airflow_task.stop()
        assert stopped == []
    finally:
        fake.close()
