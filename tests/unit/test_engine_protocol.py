"""The warm engine's protocol without Spark: a real server on loopback whose epochs are run by
a stand-in runner (the Spark side is tests/airflow/test_warm_engine.py). A run of the running
epoch attaches, another is refused, a failure comes back with its message, a request without
the token is refused, the engine going away mid-epoch is an EngineLostError, and a stale or
silent engine is found out. A deferred task's side: the epoch handed over without waiting, and
the trigger's wait (done, failed, an epoch the engine never ran, an engine killed)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import FencedError, ModeswitchError
from modeswitch.runners import engine_server
from modeswitch.runners.engine import (
    ENGINE_DIR_ENV,
    EngineAddress,
    EngineLostError,
    EngineRefusedError,
    _exchange,
    credentials_fingerprint,
    engine_file,
    ensure_engine,
    live_engine,
    run_on_engine,
    start_on_engine,
    stop_engines_in,
)
from modeswitch.runners.engine_server import Engine, _Server
from modeswitch.runners.served import await_epoch

pytestmark = pytest.mark.unit


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PipelineSettings:
    monkeypatch.setenv(ENGINE_DIR_ENV, str(tmp_path / "engines"))
    return PipelineSettings.from_mapping(
        {"pipeline": "p", "source": str(tmp_path / "log"), "warehouse": str(tmp_path / "w")}
    )


class Served:
    """An engine serving on loopback, its epochs run by the test's thread via ``step()``."""

    def __init__(self, settings: PipelineSettings, runner) -> None:
        self.engine = Engine(None, settings.pipeline, runner, handoff=False)
        self.server = _Server(self.engine, "secret")
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        host, port = self.server.server_address[:2]
        self.address = EngineAddress("p", settings.state_root, os.getpid(), 0, host, port, "secret")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def in_thread(action) -> tuple[threading.Thread, list]:
    outcome: list = []

    def go() -> None:
        try:
            outcome.append(action())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=go, daemon=True)  # a failed test must not hang the exit
    thread.start()
    return thread, outcome


def test_an_epoch_runs_once_a_retry_attaches_another_waits_a_failure_is_told(
    settings: PipelineSettings,
) -> None:
    release = threading.Event()
    ran: list[tuple[str, int]] = []

    def runner(kind, spark, epoch, s):
        ran.append((kind, epoch))
        assert s.pipeline == "p"
        release.wait(10)
        if epoch == 2:
            raise FencedError("epoch 2 is fenced out")

    served = Served(settings, runner)
    config = settings.to_json()
    try:
        first, first_out = in_thread(lambda: run_on_engine(served.address, "batch", 1, config))
        worker, _ = in_thread(lambda: served.engine.run_next(timeout=5))
        deadline = time.monotonic() + 10
        while served.engine.running() != ("batch", 1) or not ran:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # A retry of the same epoch attaches (answered "running" while it runs); another
        # epoch is refused while it runs.
        request = {"op": "run", "kind": "batch", "epoch": 1, "config": config}
        again = _exchange(served.address, request, 10)
        assert next(again)["event"] == "running"
        with pytest.raises(EngineRefusedError, match="running batch epoch 1"):
            run_on_engine(served.address, "stream", 2, config)
        release.set()
        assert next(again)["event"] == "done"
        again.close()
        for thread in (first, worker):
            thread.join(10)
        assert first_out == [None]
        assert ran == [("batch", 1)]  # run once, however many waited for it

        # A failure comes back with its message.
        worker, _ = in_thread(lambda: served.engine.run_next(timeout=5))
        with pytest.raises(ModeswitchError, match=r"stream epoch 2 failed in the engine.*fenced"):
            run_on_engine(served.address, "stream", 2, config)
        worker.join(10)

        # Without the token, nothing runs.
        stranger = EngineAddress(**{**served.address.__dict__, "token": "guess"})
        with pytest.raises(EngineRefusedError, match="token"):
            run_on_engine(stranger, "batch", 3, config)
        assert not served.engine.pending()
    finally:
        release.set()
        served.close()


def test_a_batch_is_told_done_only_once_the_engines_handoff_queued_its_stream(
    settings: PipelineSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The handoff (close, decide) takes a while; the batch's task must not end before it, or
    # the next DAG run's decide would open the stream epoch instead of the engine.
    served = Served(settings, lambda *a: None)
    served.engine.handoff = True

    def slow_hand_off(batch_epoch: int, _settings) -> int:
        time.sleep(0.5)
        return batch_epoch + 1

    monkeypatch.setattr(served.engine, "_hand_off", slow_hand_off)
    try:
        worker, _ = in_thread(lambda: served.engine.run_next(timeout=5))
        run_on_engine(served.address, "batch", 1, settings.to_json())
        assert served.engine.running() == ("stream", 2)  # queued before "done" was sent
        worker.join(10)
    finally:
        served.close()


def test_a_stream_that_ended_before_its_task_came_is_done_not_run_again(
    settings: PipelineSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine hands batch 1 over to stream 2, which stops by itself (a command, its
    policy) before the next DAG run's task comes for it: that task is told it is done, and
    the stream does not run again. bench/bench_airflow_handoff.py found it: a switch_to_batch
    queued right after the handoff stopped the stream, then the same stream ran again for its
    whole max_stream_runtime. An epoch whose run failed runs again when asked (a retry)."""
    ran: list[tuple[str, int]] = []

    def runner(kind, spark, epoch, s):
        ran.append((kind, epoch))
        if epoch == 3:
            raise FencedError("epoch 3 is fenced out")

    served = Served(settings, runner)
    served.engine.handoff = True
    monkeypatch.setattr(served.engine, "_hand_off", lambda batch_epoch, _s: batch_epoch + 1)
    config = settings.to_json()
    try:
        worker, _ = in_thread(lambda: served.engine.run_next(timeout=5))
        run_on_engine(served.address, "batch", 1, config)
        worker.join(10)
        assert served.engine.run_next(timeout=5) is not None  # stream 2, no task attached
        assert served.engine.running() is None
        # The next DAG run's task; were it queued again, this worker would run it.
        worker, _ = in_thread(lambda: served.engine.run_next(timeout=2))
        run_on_engine(served.address, "stream", 2, config)
        worker.join(10)
        assert ran == [("batch", 1), ("stream", 2)] and not served.engine.pending()
        for _ in range(2):
            worker, _ = in_thread(lambda: served.engine.run_next(timeout=5))
            with pytest.raises(ModeswitchError, match="fenced"):
                run_on_engine(served.address, "stream", 3, config)
            worker.join(10)
        assert ran[2:] == [("stream", 3), ("stream", 3)]
    finally:
        served.close()


def test_a_deferred_task_hands_its_epoch_over_and_its_trigger_waits_for_the_end(
    settings: PipelineSettings, tmp_path: Path
) -> None:
    """start_on_engine returns as soon as the engine has taken the epoch, which runs on
    without a client; EngineEpochTrigger attaches through the address file and fires once,
    with the epoch's end: done, or its failure; an epoch this engine never ran is lost (the
    task's retry runs it again)."""
    from modeswitch.airflow.triggers import EngineEpochTrigger

    release = threading.Event()
    ran: list[tuple[str, int]] = []

    def runner(kind, spark, epoch, s):
        ran.append((kind, epoch))
        release.wait(10)
        if epoch == 2:
            raise FencedError("epoch 2 is fenced out")

    served = Served(settings, runner)
    address_file = tmp_path / "engine.json"
    served.address.write(address_file)
    config = settings.to_json()

    def fire(kind: str, epoch: int) -> list[dict]:
        trigger = EngineEpochTrigger(follow_at=str(address_file), kind=kind, epoch=epoch)
        classpath, kwargs = trigger.serialize()
        assert classpath == "modeswitch.airflow.triggers.EngineEpochTrigger"
        assert "secret" not in json.dumps(kwargs)  # the token stays in the address file

        async def events() -> list[dict]:
            return [event.payload async for event in EngineEpochTrigger(**kwargs).run()]

        return asyncio.run(events())

    try:
        start_on_engine(served.address, "stream", 1, config)  # back before the epoch ends
        assert served.engine.running() == ("stream", 1) and not ran
        worker, _ = in_thread(lambda: served.engine.run_next(timeout=5))
        waiting, events = in_thread(lambda: fire("stream", 1))
        time.sleep(0.5)
        assert events == []  # the epoch runs on: nothing fired
        release.set()
        waiting.join(10)
        worker.join(10)
        assert events == [[{"status": "done", "kind": "stream", "epoch": 1}]]
        assert ran == [("stream", 1)]
        # An epoch that ended before the trigger came is told at once, as is a failure.
        assert fire("stream", 1) == [{"status": "done", "kind": "stream", "epoch": 1}]
        start_on_engine(served.address, "batch", 2, config)
        served.engine.run_next(timeout=5)
        [failed] = fire("batch", 2)
        assert failed["status"] == "failed" and failed["modeswitch"]
        assert "batch epoch 2 failed in the engine" in failed["error"]
        assert "fenced" in failed["error"]
        [lost] = fire("stream", 7)
        assert lost["status"] == "lost" and "has not run stream epoch 7" in lost["error"]
        # Another epoch while one runs is refused, as for a waiting task.
        start_on_engine(served.address, "stream", 3, config)
        with pytest.raises(EngineRefusedError, match="running stream epoch 3"):
            start_on_engine(served.address, "batch", 4, config)
    finally:
        release.set()
        served.close()
    [gone] = fire("stream", 3)  # the server is shut: nobody answers
    assert gone["status"] == "lost", gone


ENGINE_PROCESS = """
import os, sys, threading, time
from pathlib import Path
from modeswitch.runners.engine import EngineAddress
from modeswitch.runners.engine_server import Engine, _Server
from modeswitch.runners.served import await_epoch
engine = Engine(None, "p", lambda *a: time.sleep(60), handoff=False)
server = _Server(engine, "secret")
threading.Thread(target=server.serve_forever, daemon=True).start()
host, port = server.server_address[:2]
address = EngineAddress("p", sys.argv[2], os.getpid(), os.getpgid(0), host, port, "secret")
address.write(Path(sys.argv[1]))
while True:
    engine.run_next(timeout=0.5)
"""


def test_the_engine_killed_mid_epoch_is_an_engine_lost_error(
    settings: PipelineSettings, tmp_path: Path
) -> None:
    path = tmp_path / "address.json"
    process = subprocess.Popen(
        [sys.executable, "-c", ENGINE_PROCESS, str(path), settings.state_root]
    )
    try:
        deadline = time.monotonic() + 30
        while EngineAddress.read(path) is None:
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
        address = EngineAddress.read(path)
        # Mid-epoch (the runner sleeps 60 s), well after the waiter has attached: unit tests
        # run at the lowest priority beside the exclusive ones, 1 s apart was not always enough.
        killer = threading.Timer(5.0, process.kill)
        killer.start()
        # A deferred task's trigger waits on the same epoch (attached once it runs).
        waiter = threading.Timer(
            0.5, lambda: waited.append(asyncio.run(await_epoch(path, "stream", 4)))
        )
        waited: list[dict] = []
        waiter.start()
        with pytest.raises(EngineLostError, match="went away while running stream epoch 4"):
            run_on_engine(address, "stream", 4, settings.to_json())
        killer.join()
        waiter.join(10)
        assert [w["status"] for w in waited] == ["lost"], waited
        assert "went away while running stream epoch 4" in waited[0]["error"]
        process.wait(10)
        # Its retry, or a triggerer restarted, finds the engine gone: lost at once.
        ended = asyncio.run(await_epoch(path, "stream", 4, check_every=0.2))
        assert ended["status"] == "lost", ended
    finally:
        process.kill()
        process.wait()


def test_a_stale_address_is_dropped_and_a_silent_engine_is_stopped(
    settings: PipelineSettings, tmp_path: Path
) -> None:
    path = engine_file(settings)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    stale = EngineAddress("p", settings.state_root, int(dead.stdout), 0, "127.0.0.1", 9, "t")
    stale.write(path)
    assert json.loads(path.read_text())["pid"] == int(dead.stdout)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert live_engine(settings) is None and not path.exists()

    # A live process that does not answer (here: a sleeping Python in its own group) is
    # stopped by its process group, and a new engine is started in its place.
    silent = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    EngineAddress("p", settings.state_root, silent.pid, silent.pid, "127.0.0.1", 9, "t").write(path)
    served = Served(settings, lambda *a: None)
    try:

        def start(address_file: Path):
            served.address.write(address_file)
            return None

        address = ensure_engine(settings, start, timeout=10)
        assert address == served.address
        assert silent.wait(10) is not None  # stopped
    finally:
        served.close()
        if silent.poll() is None:
            silent.kill()

    # An engine that exits before it answers is reported with its status.
    path.unlink(missing_ok=True)
    crashed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(EngineLostError, match="exited with status 3"):
        ensure_engine(settings, lambda _: crashed, timeout=10)


def test_an_idle_engine_with_other_credentials_is_restarted_a_busy_one_is_kept(
    settings: PipelineSettings,
) -> None:
    old = credentials_fingerprint({"MODESWITCH_STORAGE_OPTIONS": '{"KEY": "old"}', "HOME": "/a"})
    new = credentials_fingerprint({"MODESWITCH_STORAGE_OPTIONS": '{"KEY": "new"}', "HOME": "/a"})
    assert old != new
    assert new == credentials_fingerprint({"MODESWITCH_STORAGE_OPTIONS": '{"KEY": "new"}'})
    assert "new" not in new and len(new) == 64  # a hash, not the values

    running = Served(settings, lambda *a: None)
    replacement = Served(settings, lambda *a: None)
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    started: list[Path] = []

    def start(address_file: Path):
        started.append(address_file)
        EngineAddress(**{**replacement.address.__dict__, "credentials": new}).write(address_file)

    try:
        fields = {**running.address.__dict__, "pid": sleeper.pid, "pgid": sleeper.pid}
        EngineAddress(**{**fields, "credentials": old}).write(engine_file(settings))
        # Busy (an epoch runs in it): kept, with its credentials, until that epoch ends.
        running.engine.submit("stream", 4, settings.to_json())
        assert ensure_engine(settings, start, credentials=new, timeout=10).credentials == old
        assert started == [] and sleeper.poll() is None
        # The same credentials: kept.
        running.engine._running = None
        assert ensure_engine(settings, start, credentials=old, timeout=10).pid == sleeper.pid
        # Idle, other credentials: stopped by its process group, and a new one started.
        address = ensure_engine(settings, start, credentials=new, timeout=10)
        assert started and address.credentials == new and address.port == replacement.address.port
        assert sleeper.wait(10) is not None
    finally:
        running.close()
        replacement.close()
        if sleeper.poll() is None:
            sleeper.kill()


def test_the_command_line_tells_whether_an_engine_runs_and_stops_it(
    settings: PipelineSettings, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from modeswitch.cli import main

    config = tmp_path / "settings.json"
    config.write_text(settings.to_json())
    assert main(["engine", "status", "--config", str(config)]) == 1
    assert "no engine runs" in capsys.readouterr().out

    served = Served(settings, lambda *a: None)
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        # The engine's address: the stand-in process's pid and group, the server's port.
        fields = {**served.address.__dict__, "pid": sleeper.pid, "pgid": sleeper.pid}
        EngineAddress(**fields).write(engine_file(settings))
        assert main(["engine", "status", "--config", str(config)]) == 0
        assert f"engine pid {sleeper.pid}" in capsys.readouterr().out
        # Stop: by the process group the address names.
        assert main(["engine", "stop", "--config", str(config)]) == 0
        assert sleeper.wait(10) is not None
        assert not engine_file(settings).exists()
    finally:
        served.close()
        if sleeper.poll() is None:
            sleeper.kill()


def _sleeping_engine(folder: Path, pipeline: str) -> subprocess.Popen:
    """A process in its own group standing in for a pipeline's engine, its address file in
    ``folder`` (as the engine writes it)."""
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    address = EngineAddress(pipeline, "/state", sleeper.pid, sleeper.pid, "127.0.0.1", 9, "t")
    address.write(folder / f"{pipeline}-0123456789ab.json")
    return sleeper


def test_every_engine_of_a_folder_is_stopped(tmp_path: Path) -> None:
    folder = tmp_path / "engines"
    sleepers = [_sleeping_engine(folder, name) for name in ("a", "b")]
    try:
        assert stop_engines_in(folder, grace=5) == ["a", "b"]
        assert all(s.wait(10) is not None for s in sleepers)
        assert list(folder.iterdir()) == []
        assert stop_engines_in(folder) == [] and stop_engines_in(tmp_path / "none") == []
    finally:
        for sleeper in sleepers:
            if sleeper.poll() is None:
                sleeper.kill()


def test_make_airflow_stops_the_engines_its_tasks_started_when_it_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``modeswitch.devtools.airflow_local.standalone`` (``make airflow``): its tasks get an engine
    folder under its home, and every engine there is stopped when Airflow is."""
    from modeswitch.devtools import airflow_local as local

    home = tmp_path / "airflow"
    started: dict[str, Any] = {}

    def start_airflow(command: list[str], env: dict[str, str]) -> subprocess.Popen:
        # What a task of this Airflow does: start its pipeline's engine in the folder it got.
        started["engine"] = _sleeping_engine(Path(env[ENGINE_DIR_ENV]), "demo")
        return subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)

    monkeypatch.setattr(local, "migrate", lambda env: None)
    monkeypatch.setattr(local, "start_group", start_airflow)
    assert local.standalone(home) == 0
    engine = started["engine"]
    try:
        assert engine.wait(10) is not None
        assert list((home / "engines").iterdir()) == []
    finally:
        if engine.poll() is None:
            engine.kill()


class FakeWarmUp:
    """A warm-up stream as :class:`~modeswitch.modes.warmup.WarmingUp` shows it."""

    def __init__(
        self, journal: list[str], records: int, stand_in: bool = False, fails: bool = False
    ) -> None:
        self.journal, self.records, self.running = journal, records, True
        self.stand_in, self.fails = stand_in, fails
        journal.append("warm-up started" + (" (stand-in)" if stand_in else ""))

    def ended(self) -> bool:
        return not self.running

    def finish(self):
        from modeswitch.modes.warmup import WarmUp

        self.journal.append("warm-up stopped" if self.running else "warm-up collected")
        self.running = False
        return None if self.fails else WarmUp(self.records, 1.0, stand_in=self.stand_in)


def test_the_engines_warm_up_runs_beside_the_first_batch_and_gives_way_to_a_stream(
    settings: PipelineSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm-up stream started with the engine is not cut short by the first batch, nor by
    the first stream epoch (it runs beside both, and is collected once it has ended); once a
    stream ran, no warm-up starts again; a warm-up that read nothing leaves the path cold, and
    an idle engine tries again."""
    from modeswitch.modes import warmup
    from modeswitch.runners.engine_server import StreamPath

    journal: list[str] = []
    records = iter([2_000, 0, 2_000])
    warming: list[FakeWarmUp] = []

    def start(spark, s, **_):
        warming.append(FakeWarmUp(journal, next(records)))
        return warming[-1]

    monkeypatch.setattr(warmup, "start_warm_up", start)
    path = StreamPath(None, lambda kind, spark, epoch, s: journal.append(f"{kind} {epoch}"))
    path.start(settings)
    path.run("batch", None, 1, settings)
    path.collect()
    assert journal == ["warm-up started", "batch 1"]  # beside the batch, still running
    path.run("stream", None, 2, settings)
    assert journal[2:] == ["stream 2"] and path.warm  # the warm-up runs on beside it
    path.collect()
    assert path.warming is warming[0]  # not ended yet: left to run
    warming[0].running = False
    path.collect()
    assert journal[3:] == ["warm-up collected"] and path.warming is None
    path.start(settings)
    assert len(warming) == 1  # warm: no warm-up again

    cold = StreamPath(None, lambda kind, spark, epoch, s: journal.append(f"{kind} {epoch}"))
    cold.start(settings)
    warming[-1].running = False  # it ended by itself, having read nothing
    cold.collect()
    assert not cold.warm and cold.warming is None
    cold.start(settings)  # an idle engine tries again
    warming[-1].running = False
    cold.collect()
    assert cold.warm and journal[-1] == "warm-up collected"


class Topic:
    """A Kafka topic as the warm engine's warm-ups see it: nothing in it at first."""

    def __init__(self, journal: list[str]) -> None:
        self.journal, self.records, self.asked, self.fails = journal, 0, 0, False

    def start_warm_up(self, spark, s, *, stand_in: bool = True, **_):
        """:func:`~modeswitch.modes.warmup.start_warm_up` on this topic."""
        self.asked += 1
        if self.records:
            return FakeWarmUp(self.journal, self.records, fails=self.fails)
        return FakeWarmUp(self.journal, 2_000, stand_in=True) if stand_in else None


def test_a_path_warmed_on_generated_events_awaits_its_topics_records_and_warms_up_on_them(
    settings: PipelineSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compose stack's engine starts before its demo's Kafka topic has records: its first
    warm-up reads generated events (the rest of the path warms up, Spark's Kafka source does
    not), so the path stays cold and the idle engine asks for the topic's records every
    WARM_UP_RETRY_SECONDS, never starting another stand-in, until a warm-up reads them."""
    from modeswitch.modes import warmup

    journal: list[str] = []
    topic = Topic(journal)
    monkeypatch.setattr(warmup, "start_warm_up", topic.start_warm_up)
    path = engine_server.StreamPath(None)
    path.start(settings)  # at the engine's start
    path.warming.running = False
    path.collect()
    assert journal == ["warm-up started (stand-in)", "warm-up collected"]
    assert not path.warm and path.awaits_source
    for _ in range(5):  # the lane's idle turns, half a second apart: not due yet
        path.start(settings, at_once=False)
    assert topic.asked == 1
    path.asked_at -= engine_server.WARM_UP_RETRY_SECONDS
    path.start(settings, at_once=False)  # due: asked, and still nothing there
    assert topic.asked == 2 and path.warming is None and len(journal) == 2
    path.start(settings, at_once=False)
    assert topic.asked == 2  # asked again only after another WARM_UP_RETRY_SECONDS
    topic.records = 2_000
    path.asked_at -= engine_server.WARM_UP_RETRY_SECONDS
    path.start(settings, at_once=False)
    assert journal[2:] == ["warm-up started"]  # on the topic's own records
    path.warming.running = False
    path.collect()
    assert path.warm
    path.asked_at -= engine_server.WARM_UP_RETRY_SECONDS
    path.start(settings, at_once=False)
    assert topic.asked == 3  # warm: never asked again


def test_a_batch_epoch_of_a_path_awaiting_its_topic_has_a_warm_up_on_it_beside(
    settings: PipelineSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch on Kafka is the sign that the topic has records: the warm-up on them starts
    beside it, at once, so that the stream which follows the batch starts warm; a stream
    epoch starts none (it warms the path itself)."""
    from modeswitch.modes import warmup

    journal: list[str] = []
    topic = Topic(journal)
    monkeypatch.setattr(warmup, "start_warm_up", topic.start_warm_up)
    path = engine_server.StreamPath(None, lambda kind, spark, epoch, s: journal.append(kind))
    path.start(settings)
    path.warming.running = False
    path.collect()
    topic.records = 500
    path.run("batch", None, 1, settings)
    assert journal[2:] == ["warm-up started", "batch"] and topic.asked == 2
    path.warming.running = False
    path.collect()
    path.run("stream", None, 2, settings)
    assert journal[-1] == "stream" and topic.asked == 2 and path.warm


def test_a_warm_up_on_the_topics_records_that_failed_ends_the_asking(
    settings: PipelineSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the topic has records, the path awaits them no more, whatever came of the warm-up
    on them: one that failed (the Kafka source faulty) leaves the path merely cold, and the
    idle engine does not start a failing query every WARM_UP_RETRY_SECONDS."""
    from modeswitch.modes import warmup

    journal: list[str] = []
    topic = Topic(journal)
    monkeypatch.setattr(warmup, "start_warm_up", topic.start_warm_up)
    path = engine_server.StreamPath(None)
    path.start(settings)
    path.warming.running = False
    path.collect()
    assert path.awaits_source
    topic.records, topic.fails = 2_000, True
    path.asked_at -= engine_server.WARM_UP_RETRY_SECONDS
    path.start(settings, at_once=False)
    path.warming.running = False
    path.collect()
    assert not path.warm and not path.awaits_source
    path.asked_at -= 10 * engine_server.WARM_UP_RETRY_SECONDS
    path.start(settings, at_once=False)
    assert topic.asked == 2 and path.warming is None


def test_a_warm_up_that_failed_is_tried_again_after_an_epoch_not_on_a_clock(
    settings: PipelineSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm-up that could not start (a fault that may fail every one) is not repeated every
    few seconds by an idle engine; the next epoch's moments try again."""
    from modeswitch.modes import warmup

    tried: list[bool] = []

    def start(spark, s, *, stand_in: bool = True, **_):
        tried.append(stand_in)

    monkeypatch.setattr(warmup, "start_warm_up", start)
    path = engine_server.StreamPath(None, lambda kind, spark, epoch, s: None)
    path.start(settings)
    path.asked_at -= 10 * engine_server.WARM_UP_RETRY_SECONDS
    path.start(settings, at_once=False)
    assert tried == [True]
    path.run("batch", None, 1, settings)
    assert tried == [True, True]  # with a stand-in allowed: nothing says the topic is empty


@pytest.mark.parametrize(
    ("warm", "warming", "at_once", "awaits_source", "since_asked", "due"),
    [
        (False, False, True, False, 0.0, True),  # the engine's start, a batch, after an epoch
        (True, False, True, False, 0.0, False),  # warm already
        (False, True, True, False, 0.0, False),  # one is running
        (False, False, False, False, 60.0, False),  # cold from a failure: not on a clock
        (False, False, False, True, 5.0, False),  # awaits the topic, asked 5 s ago
        (False, False, False, True, 10.0, True),  # awaits the topic, asked 10 s ago
        (True, False, False, True, 10.0, False),  # warm: asks no more
    ],
)
def test_a_warm_up_is_due_when_cold_none_runs_and_the_moment_or_the_clock_says_so(
    warm: bool, warming: bool, at_once: bool, awaits_source: bool, since_asked: float, due: bool
) -> None:
    assert engine_server.warm_up_due(warm, warming, at_once, awaits_source, since_asked) is due


def test_an_idle_lane_asks_its_stream_path_in_every_turn_and_at_once_after_an_epoch(
    settings: PipelineSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only after an epoch: the engine waits for its first epoch (the compose stack's
    waited 77 s for its topic's records) and the path decides whether a warm-up is due."""

    class Lane:
        pipeline = settings.pipeline
        epochs = [(1, settings)]

        def run_next(self, timeout: float):
            time.sleep(0.05)
            return self.epochs.pop() if self.epochs else None

        def pending(self) -> bool:
            return False

    class Path:
        def __init__(self) -> None:
            self.asked: list[tuple[str, bool]] = []

        def start(self, chosen: PipelineSettings, *, at_once: bool = True) -> None:
            self.asked.append((chosen.pipeline, at_once))

        def collect(self) -> None:
            pass

    monkeypatch.setattr(engine_server, "bind_thread", lambda spark, pipeline: None)
    stop, path = threading.Event(), Path()
    lane = threading.Thread(
        target=engine_server.run_lane, args=(None, Lane(), stop, path, settings)
    )
    lane.start()
    time.sleep(0.5)
    stop.set()
    lane.join(timeout=10)
    assert path.asked[:2] == [(settings.pipeline, True), (settings.pipeline, True)]
    assert len(path.asked) >= 4 and set(path.asked[2:]) == {(settings.pipeline, False)}
