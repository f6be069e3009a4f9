"""An engine's lanes (modeswitch.runners.lanes, engine_server.run_lane): a shared engine runs
several pipelines' epochs at once, a lane each, each lane one epoch at a time; one pipeline's
stuck or failing epoch holds up only its own lane; an engine of one pipeline refuses the
others'. The epochs are stand-ins (no Spark); the server and the protocol are the real ones."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ModeswitchError
from modeswitch.runners.engine import (
    EngineAddress,
    EngineRefusedError,
    run_on_engine,
    start_on_engine,
    wait_on_engine,
)
from modeswitch.runners.engine_server import _Server, run_lane
from modeswitch.runners.lanes import Engine, Lanes
from modeswitch.runners.served import await_epoch

pytestmark = pytest.mark.unit


def settings_of(tmp_path: Path, pipeline: str) -> PipelineSettings:
    return PipelineSettings.from_mapping(
        {"pipeline": pipeline, "source": str(tmp_path / pipeline), "warehouse": str(tmp_path / "w")}
    )


class SharedEngine:
    """A shared engine on loopback whose lanes run stand-in epochs in threads of their own
    (``run_lane``), as ``serve`` runs them."""

    def __init__(self, runner, *, shared: bool = True, first: str = "a") -> None:
        self.stop = threading.Event()
        self.threads: dict[str, threading.Thread] = {}

        def start(lane: Engine) -> None:
            thread = threading.Thread(
                target=run_lane, args=(None, lane, self.stop), name=f"lane-{lane.pipeline}"
            )
            self.threads[lane.pipeline] = thread
            thread.start()

        self.lanes = Lanes(
            first, lambda name: Engine(None, name, runner, handoff=False), start, shared=shared
        )
        self.lanes.lane(first)
        self.server = _Server(self.lanes, "secret")
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        host, port = self.server.server_address[:2]
        self.address = EngineAddress(first, "", os.getpid(), 0, host, port, "secret", shared=shared)

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
        for thread in self.threads.values():
            thread.join(10)


def test_a_shared_engine_runs_pipelines_at_once_a_lane_each(tmp_path: Path) -> None:
    started: dict[str, threading.Event] = {p: threading.Event() for p in ("a", "b", "c")}
    release = {p: threading.Event() for p in ("a", "b", "c")}
    threads: dict[str, str] = {}

    def runner(kind, spark, epoch, settings) -> None:
        threads[settings.pipeline] = threading.current_thread().name
        started[settings.pipeline].set()
        assert release[settings.pipeline].wait(10)
        if settings.pipeline == "c" and epoch == 1:
            raise ModeswitchError("c's transform failed on a bad record")

    engine = SharedEngine(runner)
    try:
        for pipeline in ("a", "b", "c"):
            config = settings_of(tmp_path, pipeline).to_json()
            start_on_engine(engine.address, "stream", 1, config, pipeline)
        for pipeline in ("a", "b", "c"):  # all three run at the same time, each its own lane
            assert started[pipeline].wait(10), pipeline
        assert threads == {p: f"lane-{p}" for p in ("a", "b", "c")}
        assert engine.lanes.running() == {p: ("stream", 1) for p in ("a", "b", "c")}
        # Another epoch of a busy pipeline is refused; its lane runs one at a time.
        with pytest.raises(EngineRefusedError, match="pipeline 'a' is running stream epoch 1"):
            run_on_engine(engine.address, "batch", 2, settings_of(tmp_path, "a").to_json(), "a")
        # c fails: only c's epoch is told so; b ends while a is still held (stuck).
        release["c"].set()
        with pytest.raises(ModeswitchError, match="bad record"):
            wait_on_engine(engine.address, "stream", 1, "c")
        release["b"].set()
        wait_on_engine(engine.address, "stream", 1, "b")
        follow = _follow(engine, tmp_path)
        assert asyncio.run(await_epoch(follow, "stream", 1, pipeline="b")) == {"status": "done"}
        assert engine.lanes.running() == {"a": ("stream", 1)}
        # c runs again at once, beside a's epoch that is still stuck.
        start_on_engine(engine.address, "batch", 2, settings_of(tmp_path, "c").to_json(), "c")
        release["c"].set()
        wait_on_engine(engine.address, "batch", 2, "c")
        assert engine.lanes.running() == {"a": ("stream", 1)}
    finally:
        for event in release.values():
            event.set()
        engine.close()


def _follow(engine: SharedEngine, folder: Path) -> str:
    """The engine as a follower (a trigger) finds it: its address file."""
    path = folder / "engine.json"
    engine.address.write(path)
    return str(path)


def test_an_engine_of_one_pipeline_refuses_anothers_epochs(tmp_path: Path) -> None:
    ran: list[str] = []
    engine = SharedEngine(lambda kind, spark, epoch, s: ran.append(s.pipeline), shared=False)
    try:
        with pytest.raises(EngineRefusedError, match="runs pipeline 'a' only, not 'b'"):
            run_on_engine(engine.address, "batch", 1, settings_of(tmp_path, "b").to_json(), "b")
        run_on_engine(engine.address, "batch", 1, settings_of(tmp_path, "a").to_json(), "a")
        assert ran == ["a"]
    finally:
        engine.close()


def test_a_lane_that_dies_stops_the_engine_as_the_main_loop_did(tmp_path: Path) -> None:
    """Anything but an epoch's own failure (here: a SystemExit in the epoch) stops the
    engine: its tasks fail as after a lost engine and their retries start a new one."""

    def runner(kind, spark, epoch, s) -> None:
        raise SystemExit(3)

    engine = SharedEngine(runner)
    try:
        start_on_engine(engine.address, "batch", 1, settings_of(tmp_path, "a").to_json(), "a")
        assert engine.stop.wait(10)
    finally:
        engine.close()
