"""``dag.test()`` of the pipeline DAG: the ``stream`` task's job is SIGKILLed once it has
committed micro-batches to the sink; Airflow's retry runs the same epoch again, which resumes
where the sink ends, and the epoch completes exactly once."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from unittest import mock

import psutil
import pytest

from modeswitch.airflow.tasks import submit_control_command
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.ops.verify import audit
from modeswitch.runners.jobs import job_script
from modeswitch.sinks.commits import committed_offsets, sink_commits
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore

REPO = Path(__file__).resolve().parents[2]
STREAM_JOB = str(job_script("stream"))
PIPELINE = "retrytest"
RECORDS = 10_000  # the backlog the batch epoch drains
MORE = 60_000  # appended for the stream: 12 micro-batches of 5 000
WAIT = 300.0  # seconds; generous, for a 2-core machine shared with other Spark jobs


@pytest.fixture
def pipeline_env(airflow_db, tmp_path: Path):
    log = SegmentLog.create(str(tmp_path / "log"), buckets=4)
    produce_backlog(log, EventGenerator(seed=3, buckets=4), records=RECORDS)
    variables = {
        "pipeline": PIPELINE,
        "source": str(tmp_path / "log"),
        "warehouse": str(tmp_path / "warehouse"),
        # The spark-submit per epoch (the default on YARN, Kubernetes, cluster deploy mode);
        # tests/airflow/test_warm_engine.py runs the default here, the warm engine.
        "engine": "submit",
        "trigger_interval": "500ms",
        "max_records_per_trigger": "5000",
        # Each try's stream stops on the test's command; this only bounds a broken run.
        "max_stream_runtime": "30m",  # pytest's timeout bounds a broken run
        "min_time_in_stream": "0s",
        "exit_threshold": "1h",
        "enter_threshold": "2h",
        "watermark_lag_threshold": "2h",
    }
    env = {f"AIRFLOW_VAR_MODESWITCH_{k.upper()}": v for k, v in variables.items()}
    with mock.patch.dict(os.environ, env):
        yield StateStore(
            str(tmp_path / "warehouse" / "_modeswitch" / PIPELINE),
            str(tmp_path / "warehouse" / PIPELINE),
            PIPELINE,
        )


def _dag(dag_id: str):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dag_file(dag_id)))
    assert bag.import_errors == {}
    return bag.dags[dag_id]


def _states(run) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def _get_variable(key: str) -> str | None:
    return os.environ.get(f"AIRFLOW_VAR_{key.upper()}")


# --- the stream job's processes ------------------------------------------------------------------


def stream_jobs() -> list[psutil.Process]:
    """The stream job's processes under this one. Under ``dag.test()`` the task runs in this
    process and SparkSubmitHook starts spark-submit (the SparkSubmit JVM) as a child, which
    starts the Python driver ``jobs/stream.py``: both name the script on their command line."""
    found = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if STREAM_JOB in process.cmdline():
                found.append(process)
    return found


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_trees(roots: Iterable[psutil.Process]) -> list[str]:
    """SIGKILL each of ``roots`` with all its descendants (never this process); returns their
    command lines.

    The roots are stopped first, so that none starts a child between the listing and the
    kill (a child started then would outlive the kill, reparented away from this process).
    Death is awaited by polling, not ``psutil.wait_procs``: that reaps spark-submit, this
    process's child, and SparkSubmitHook's ``Popen.wait()`` then reads exit code 0, so the
    killed try would pass for a success.
    """
    tree: dict[int, psutil.Process] = {}
    for root in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            root.suspend()
            tree[root.pid] = root
    for root in list(tree.values()):
        with contextlib.suppress(psutil.NoSuchProcess):
            tree.update((p.pid, p) for p in root.children(recursive=True))
    tree.pop(os.getpid(), None)
    killed = []
    for process in tree.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            killed.append(" ".join(process.cmdline()))
            process.kill()
    deadline = time.monotonic() + 60
    while not all(_gone(p) for p in tree.values()):
        assert time.monotonic() < deadline, f"still alive after SIGKILL: {killed}"
        time.sleep(0.05)
    return killed


# --- the watcher -------------------------------------------------------------------------------


@dataclass
class KillThenStop:
    """Kill the stream task's first job once the sink holds ``kill_after`` of its micro-batches;
    once the sink holds ``target`` (what the retry must bring it to), queue a command that stops
    the retry's stream at a commit boundary."""

    sink: str
    target: dict[int, int]
    kill_after: int = 2
    killed: list[str] = field(default_factory=list)
    sequences_at_kill: list[int] = field(default_factory=list)
    stop_queued: bool = False
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def stream_sequences(self) -> list[int]:
        return sorted(c.sequence for c in sink_commits(self.sink, PIPELINE) if c.mode == "stream")

    def wait_for(self, what: str, condition) -> bool:
        """Poll ``condition`` until it holds (True) or the run ended (False)."""
        deadline = time.monotonic() + WAIT
        while not condition():
            if self.done.wait(0.2):
                return False
            if time.monotonic() > deadline:
                raise TimeoutError(f"not within {WAIT:.0f} s: {what}")
        return True

    def __call__(self) -> None:
        try:
            if not self.wait_for(
                f"the stream job's first {self.kill_after} micro-batch commits",
                lambda: len(self.stream_sequences()) >= self.kill_after,
            ):
                return
            self.killed = kill_trees(stream_jobs())
            self.sequences_at_kill = self.stream_sequences()  # nothing commits after the kill
            if not self.wait_for(
                f"the retry to bring the sink to {self.target}",
                lambda: committed_offsets(self.sink, PIPELINE) == self.target,
            ):
                return
        except BaseException as exc:  # reported by the test, which asserts it is None
            self.error = exc
        finally:
            if not self.done.is_set():  # stop the stream now, however this ended
                submit_control_command(
                    {"command": "switch_to_batch", "note": "test"}, get_variable=_get_variable
                )
                self.stop_queued = True


def test_a_stream_job_killed_after_its_first_commits_succeeds_on_a_retry(
    pipeline_env: StateStore, tmp_path: Path
) -> None:
    store = pipeline_env
    pipeline = _dag("modeswitch_pipeline")

    run = pipeline.test(run_conf={"force_mode": "batch", "dry_run": False})
    assert str(run.state) == "success", _states(run)
    [batch] = store.epochs.list()
    assert (batch.mode, batch.status) == ("batch", "completed")
    assert sum(batch.end.values()) == RECORDS

    log = SegmentLog(str(tmp_path / "log"))
    produce_backlog(log, EventGenerator(seed=4, buckets=4), records=MORE, first=1_000_000)
    sink = str(tmp_path / "warehouse" / PIPELINE)
    watcher = KillThenStop(sink, log.latest_offsets())
    thread = threading.Thread(target=watcher, name="kill-then-stop")
    stream_task = pipeline.task_dict["stream"]
    assert stream_task.retries == 2  # as the DAG defines it
    stream_task.retry_delay = timedelta(seconds=1)  # dag.test() serializes this DAG object
    thread.start()
    try:
        run = pipeline.test(run_conf={"force_mode": "stream", "dry_run": False})
    finally:
        watcher.done.set()
        thread.join(timeout=120)
        leftovers = kill_trees(stream_jobs())
    assert not thread.is_alive()
    assert watcher.error is None, f"watcher: {watcher.error!r}"
    assert leftovers == [], "stream job processes outlived the run"

    states = _states(run)
    assert str(run.state) == "success", states
    assert states["backlog_batch"] == "skipped"
    [ti] = [ti for ti in run.get_task_instances() if ti.task_id == "stream"]
    assert ti.try_number == 2, "the killed try, then one retry that succeeded"
    assert any("org.apache.spark.deploy.SparkSubmit" in cmd for cmd in watcher.killed), (
        watcher.killed
    )
    assert any(cmd.split()[1:2] == [STREAM_JOB] for cmd in watcher.killed), watcher.killed
    assert watcher.stop_queued

    _, stream = store.epochs.list()
    assert (stream.mode, stream.status) == ("stream", "completed")
    assert stream.start == batch.end  # the exact handoff
    assert stream.end == log.latest_offsets()
    sequences = sorted(c.sequence for c in sink_commits(sink, PIPELINE) if c.epoch == stream.id)
    assert sequences == list(range(len(sequences)))  # none committed twice, none skipped
    assert len(watcher.sequences_at_kill) >= 2
    assert len(sequences) > len(watcher.sequences_at_kill)  # the retry committed the rest

    report = audit(str(tmp_path / "log"), sink, f"{sink}_quarantine", PIPELINE)
    assert report.totals.missing == 0, report
    assert report.totals.duplicated == 0, report
    assert report.ok, report


def dag_file(dag_id: str) -> Path:
    """An example DAG's own file, else the pipelines' factory."""
    own = REPO / "dags" / f"{dag_id}.py"
    return own if own.exists() else REPO / "dags" / "modeswitch_pipelines.py"
