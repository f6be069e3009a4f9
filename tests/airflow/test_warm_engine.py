"""``dag.test()`` of the pipeline DAG with the ``engine`` setting's default (``auto``: the warm
engine on a local master under the LocalExecutor): the epoch tasks hand
their epochs to one long-lived Spark application (``jobs/engine.py``, started by the first task
with spark-submit on ``spark_default``). Batch -> stream -> batch -> stream in one engine,
each handoff exact and every record once; the engine SIGKILLed (its whole process group)
mid-stream and mid-wave: the task fails, its retry starts a new engine that runs the
re-attached epoch, and the pipeline ends at 0 missing, 0 duplicated."""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from unittest import mock

import pytest
from fault_tools import CommandLineWatch, files_holding
from test_stream_retry import _dag, _get_variable, _states

from modeswitch.airflow.tasks import submit_control_command
from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.ops.verify import audit
from modeswitch.runners.engine import (
    ENGINE_DIR_ENV,
    EngineAddress,
    engine_file,
    engine_scratch,
    stop_engine,
)
from modeswitch.sinks.commits import SinkCommit, committed_offsets, sink_commits
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore

pytestmark = pytest.mark.airflow

PIPELINE = "warmtest"
WAIT = 300.0
STORAGE_SECRET = f"warm-s3cr3t-{secrets.token_hex(4)}"


@pytest.fixture
def warm_env(airflow_db, tmp_path: Path):
    log = SegmentLog.create(str(tmp_path / "log"), buckets=4)
    produce_backlog(log, EventGenerator(seed=3, buckets=4), records=40_000)
    variables = {
        "pipeline": PIPELINE,
        "source": str(tmp_path / "log"),
        "warehouse": str(tmp_path / "warehouse"),
        # No engine setting: the default chooses the engine here (the batch task starts one).
        "trigger_interval": "500ms",
        "max_records_per_trigger": "5000",
        "max_stream_runtime": "30m",  # each stream is stopped by the test's command (150 s raced
        # it on a slow machine: the engine opens a stream at the batch's end, before the DAG run)
        "min_time_in_stream": "0s",
        "exit_threshold": "1h",
        "enter_threshold": "2h",
        "watermark_lag_threshold": "2h",
    }
    env = {f"AIRFLOW_VAR_MODESWITCH_{k.upper()}": v for k, v in variables.items()}
    env[ENGINE_DIR_ENV] = str(tmp_path / "engines")
    # The tables' storage Connection holds a marker secret (unused by local folders, handed to
    # the engine like any credential): tests/airflow/test_warm_engine.py sweeps for it.
    env["AIRFLOW_VAR_MODESWITCH_STORAGE_CONNECTION"] = "lake"
    env["AIRFLOW_CONN_LAKE"] = json.dumps(
        {"conn_type": "generic", "extra": {"AWS_SECRET_ACCESS_KEY": STORAGE_SECRET}}
    )
    settings = PipelineSettings.from_mapping(variables)
    with mock.patch.dict(os.environ, env):
        try:
            yield settings, log
        finally:
            stop_engine(settings)  # the engine outlives its tasks: the test stops it
    assert EngineAddress.read(engine_file(settings)) is None
    assert not engine_scratch(engine_file(settings)).exists()


def engine_pid(settings: PipelineSettings) -> int | None:
    address = EngineAddress.read(engine_file(settings))
    return None if address is None else address.pid


def stream_commits(sink: str, epoch: int) -> list[SinkCommit]:
    return [c for c in sink_commits(sink, PIPELINE) if c.epoch == epoch]


def run_stream_until(
    pipeline, settings: PipelineSettings, target: dict[int, int], during: Callable[[], None]
):
    """One stream epoch's DAG run; ``during()`` runs beside it once the stream has committed
    twice (or once, if that one reached ``target``: no second would come), and a command
    stops the stream once the sink holds ``target``."""
    failure: list[BaseException] = []
    done = threading.Event()

    def watch() -> None:
        try:
            deadline = time.monotonic() + WAIT
            while not done.is_set() and time.monotonic() < deadline:
                commits = sink_commits(settings.sink, settings.pipeline)
                streams = [c for c in commits if c.mode == "stream"]
                if len(streams) >= 2 or (
                    streams and committed_offsets(settings.sink, settings.pipeline) == target
                ):
                    break  # (ci: one micro-batch held it all, and this waited out WAIT)
                time.sleep(0.2)
            during()
            while not done.is_set() and time.monotonic() < deadline:
                if committed_offsets(settings.sink, settings.pipeline) == target:
                    break
                time.sleep(0.2)
        except BaseException as exc:
            failure.append(exc)
        finally:
            if not done.is_set():
                submit_control_command(
                    {"command": "switch_to_batch", "note": "test"}, get_variable=_get_variable
                )

    thread = threading.Thread(target=watch, name="stream-watch")
    thread.start()
    try:
        run = pipeline.test(run_conf={"force_mode": "stream", "dry_run": False})
    finally:
        done.set()
        thread.join(timeout=120)
    assert not failure, failure
    return run


def kill_attached(settings: PipelineSettings) -> int:
    """:func:`kill_engine` once the stream task has attached to the stream epoch the engine
    runs (the engine started it itself at the batch's end): killed before, the task would
    start a new engine and run the epoch in its first try (ci30 saw that, under load)."""
    [epoch] = [e.id for e in StateStore.from_settings(settings).epochs.list() if e.running]
    said = engine_file(settings).with_suffix(".log")
    deadline = time.monotonic() + WAIT
    while f"attached to stream epoch {epoch}, still running" not in said.read_text():
        assert time.monotonic() < deadline, "the stream task never attached to the engine"
        time.sleep(0.2)
    return kill_engine(settings)


def kill_engine(settings: PipelineSettings) -> int:
    """SIGKILL the engine's whole process group (driver, JVM, Python workers); its pid."""
    address = EngineAddress.read(engine_file(settings))
    assert address is not None
    os.killpg(address.pgid, signal.SIGKILL)
    return address.pid


def test_batch_stream_batch_stream_in_one_warm_engine(warm_env, tmp_path: Path) -> None:
    settings, log = warm_env
    engines = str(tmp_path / "engines")
    scratch = f"-Djava.io.tmpdir={engine_scratch(engine_file(settings))}"
    with (
        CommandLineWatch(ENGINE_DIR_ENV, engines, STORAGE_SECRET) as lines,
        CommandLineWatch(ENGINE_DIR_ENV, engines, scratch) as in_scratch,
    ):
        _batch_stream_batch_stream(settings, log)
    # On the local master the engine's JVM keeps its temporary files in the engine's scratch,
    # removed with the engine (tests/e2e/test_run_engine.py), not in the machine's /tmp.
    assert in_scratch.holding, "the engine's JVM did not have its scratch as java.io.tmpdir"
    # The storage secret went to the engine (its environment), and is in no command line of
    # it or its Spark processes, nor in any file: its address file and log, the task logs and
    # Airflow's metadata DB (XComs, rendered fields), the tables and the checkpoints.
    assert len(lines.seen) > 3 and lines.holding == []
    assert any((tmp_path / "engines").iterdir()), "the engine's files are among the files"
    assert files_holding(tmp_path, STORAGE_SECRET) == []
    assert files_holding(Path(os.environ["AIRFLOW_HOME"]), STORAGE_SECRET) == []


def _batch_stream_batch_stream(settings: PipelineSettings, log: SegmentLog) -> None:
    store = StateStore.from_settings(settings)
    pipeline = _dag("modeswitch_pipeline")

    run = pipeline.test(run_conf={"force_mode": "batch", "dry_run": False})
    assert str(run.state) == "success", _states(run)
    engine = engine_pid(settings)
    assert engine is not None  # started by the batch task, and still up

    produce_backlog(log, EventGenerator(seed=4, buckets=4), records=20_000, first=1_000_000)
    run = run_stream_until(pipeline, settings, log.latest_offsets(), lambda: None)
    assert str(run.state) == "success", _states(run)
    produce_backlog(log, EventGenerator(seed=5, buckets=4), records=30_000, first=2_000_000)
    run = pipeline.test(run_conf={"force_mode": "batch", "dry_run": False})
    assert str(run.state) == "success", _states(run)
    produce_backlog(log, EventGenerator(seed=6, buckets=4), records=20_000, first=3_000_000)
    run = run_stream_until(pipeline, settings, log.latest_offsets(), lambda: None)
    assert str(run.state) == "success", _states(run)

    assert engine_pid(settings) == engine  # every epoch ran in the one engine
    # Each epoch task handed its epoch over and deferred: the engine was waited for by the
    # task's trigger (dag.test() runs it in line), not by the task.
    said = engine_file(settings).with_suffix(".log").read_text()
    waited = re.findall(r"a deferred task waits for (\w+) epoch (\d+)", said)
    assert [(e.mode, str(e.id)) for e in store.epochs.list()] == waited, waited
    # The warm-up stream started with the engine ran beside the first batch instead of giving
    # way to it: it ended (here, stopped by the first stream epoch: this batch is short) only
    # after the batch had started. (Before, it stopped at the task's first request.)
    warm_up_end = said.index("stream warm-up: ")
    assert said.index("engine: running batch epoch") < warm_up_end, said[:warm_up_end][-3000:]
    epochs = store.epochs.list()
    assert [(e.mode, e.status) for e in epochs] == [
        ("batch", "completed"),
        ("stream", "completed"),
        ("batch", "completed"),
        ("stream", "completed"),
    ]
    for before, after in itertools.pairwise(epochs):
        assert after.start == before.end  # each handoff exact
    # Each stream epoch was opened by the engine right after its batch, not by the next run.
    openers = [d.decided_by for d in store.decisions.list() if d.switched and d.mode == "stream"]
    assert openers.count("engine") == 2, openers
    assert epochs[-1].end == log.latest_offsets()
    report = audit(log.root, settings.sink, settings.quarantine, PIPELINE)
    assert report.ok and report.totals.missing == report.totals.duplicated == 0, report


def test_an_engine_killed_mid_stream_and_mid_wave_is_replaced_and_nothing_is_lost(
    warm_env,
) -> None:
    settings, log = warm_env
    store = StateStore.from_settings(settings)
    pipeline = _dag("modeswitch_pipeline")
    for task_id in ("stream", "backlog_batch"):
        task = pipeline.task_dict[task_id]
        assert task.retries == 2  # as the DAG defines it
        task.retry_delay = timedelta(seconds=1)  # dag.test() serializes this DAG object

    # Mid-wave: the first batch epoch is killed once its first wave committed.
    planner = {"AIRFLOW_VAR_MODESWITCH_WAVE_RECORDS": "8000"}
    killed: list[int] = []

    def kill_after_first_wave() -> None:
        deadline = time.monotonic() + WAIT
        while not list(sink_commits(settings.sink, PIPELINE)):
            assert time.monotonic() < deadline, "no wave committed"
            time.sleep(0.05)
        killed.append(kill_engine(settings))

    killer = threading.Thread(target=kill_after_first_wave)
    with mock.patch.dict(os.environ, planner):
        killer.start()
        try:
            run = pipeline.test(run_conf={"force_mode": "batch", "dry_run": False})
        finally:
            killer.join(timeout=WAIT)
    states = _states(run)
    assert str(run.state) == "success", states
    [batch_ti] = [ti for ti in run.get_task_instances() if ti.task_id == "backlog_batch"]
    assert batch_ti.try_number == 2, "the try whose engine was killed, then one that succeeded"
    assert len(killed) == 1 and engine_pid(settings) not in (None, killed[0])

    # Mid-stream: the engine is killed after the stream's second commit.
    produce_backlog(log, EventGenerator(seed=4, buckets=4), records=60_000, first=1_000_000)
    run = run_stream_until(
        pipeline, settings, log.latest_offsets(), lambda: killed.append(kill_attached(settings))
    )
    assert str(run.state) == "success", _states(run)
    [stream_ti] = [ti for ti in run.get_task_instances() if ti.task_id == "stream"]
    assert stream_ti.try_number == 2
    assert len(killed) == 2 and engine_pid(settings) not in (None, *killed)

    batch, stream = store.epochs.list()
    assert (batch.status, stream.status) == ("completed", "completed")
    assert stream.start == batch.end and stream.end == log.latest_offsets()
    sequences = sorted(c.sequence for c in stream_commits(settings.sink, stream.id))
    assert sequences == list(range(len(sequences)))  # none committed twice, none skipped
    report = audit(log.root, settings.sink, settings.quarantine, PIPELINE)
    assert report.ok and report.totals.missing == report.totals.duplicated == 0, report
