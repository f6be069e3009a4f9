"""The stream standby without Spark: the request a standby job reads, how the job entrypoint
dispatches it, and when the local runner starts one (a lead before the batch epoch's end).

The standby's Spark side (the warm-up) is in tests/spark/test_stream_warm_up.py, and a whole
pipeline handing its stream epochs to standbys in tests/e2e/test_handoff.py. Here the job
entrypoint runs with its session and its epoch replaced by stand-ins that record what they
were given: what is checked is which epoch, with which settings, reaches ``run``.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pendulum
import pyarrow as pa
import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ModeswitchError
from modeswitch.modes.batch import plan_remaining
from modeswitch.runners import jobs as jobrunner
from modeswitch.runners.jobs import read_standby_request, standby_request
from modeswitch.runners.local import BatchEndWatch, LocalRunner
from modeswitch.sinks.commits import commits_after
from modeswitch.sinks.delta import DeltaSinkOptions, commit_files, write_files
from modeswitch.state import StateStore, reconcile


def test_a_standby_request_carries_the_epoch_and_its_settings() -> None:
    settings = PipelineSettings.from_mapping({"pipeline": "orders", "max_stream_runtime": "20s"})
    line = standby_request(7, settings)
    assert line.endswith("\n") and line.count("\n") == 1
    epoch, config = read_standby_request(io.StringIO(line))
    assert epoch == 7
    assert PipelineSettings.from_json(config) == settings


@pytest.mark.parametrize("line", ["", "\n", "  \n"])
def test_the_end_of_input_releases_a_standby(line: str) -> None:
    assert read_standby_request(io.StringIO(line)) is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("7\n", "is not valid"),
        ("{not json\n", "is not valid"),
        ('{"epoch": 7}\n', "is not valid"),
        ('{"epoch": "7", "config": "{}"}\n', "expected an epoch and settings"),
        ('{"epoch": true, "config": "{}"}\n', "expected an epoch and settings"),
    ],
)
def test_a_bad_standby_request_is_refused_naming_it(line: str, message: str) -> None:
    with pytest.raises(ModeswitchError, match=message):
        read_standby_request(io.StringIO(line))


class StandIns:
    """Records what the job entrypoint did: the session it started, the warm-up, the run."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sessions: list[str] = []
        self.warm_ups = 0
        self.warm_up_seconds = 0.0
        self.cut_short = False
        self.runs: list[tuple[str, int, PipelineSettings]] = []
        self.jobs: list[object] = []  # the job resolved before the session, if run() got one
        test = self

        class Session:
            def stop(self) -> None:
                test.sessions.append("stopped")

        def create_spark_session(name: str, **kwargs: object) -> Session:
            self.sessions.append(name)
            return Session()

        def warm_up(spark: object, job: object, *, should_stop) -> float:
            self.warm_ups += 1
            # Like the real one, it runs until done or until its epoch has come.
            deadline = time.monotonic() + self.warm_up_seconds
            while time.monotonic() < deadline and not should_stop():
                time.sleep(0.01)
            self.cut_short = should_stop()
            return 0.0

        def run(
            kind: str,
            spark: object,
            settings: PipelineSettings,
            *,
            epoch: int,
            command=None,
            job=None,
        ) -> None:
            self.runs.append((kind, epoch, settings))
            self.jobs.append(job)

        monkeypatch.setattr("modeswitch.runners.session.create_spark_session", create_spark_session)
        monkeypatch.setattr("modeswitch.modes.warmup.warm_up", warm_up)
        monkeypatch.setattr(jobrunner, "run", run)


def test_a_standby_job_warms_up_then_runs_the_epoch_it_is_handed(monkeypatch) -> None:
    done = StandIns(monkeypatch)
    started = PipelineSettings.from_mapping({"pipeline": "orders"})
    handed = PipelineSettings.from_mapping({"pipeline": "orders", "max_stream_runtime": "20s"})
    argv = ["--pipeline", "orders", "--standby", "--config", started.to_json()]
    requests = io.StringIO(standby_request(12, handed))
    assert jobrunner.main("stream", "test", argv, requests=requests) == 0
    assert done.sessions == ["modeswitch-orders-stream-standby", "stopped"]
    assert done.warm_ups == 1
    assert done.runs == [("stream", 12, handed)]
    assert done.jobs == [None]  # resolved from the handed settings, not the started ones


def test_an_epoch_that_comes_during_the_warm_up_cuts_it_short(monkeypatch) -> None:
    done = StandIns(monkeypatch)
    done.warm_up_seconds = 60.0
    settings = PipelineSettings.from_mapping({"pipeline": "orders"})
    argv = ["--pipeline", "orders", "--standby", "--config", settings.to_json()]
    began = time.monotonic()
    requests = io.StringIO(standby_request(5, settings))
    assert jobrunner.main("stream", "test", argv, requests=requests) == 0
    assert time.monotonic() - began < 30
    assert done.cut_short
    assert done.runs == [("stream", 5, settings)]


def test_a_released_standby_job_runs_nothing_and_stops_its_session(monkeypatch) -> None:
    done = StandIns(monkeypatch)
    config = PipelineSettings.from_mapping({"pipeline": "orders"}).to_json()
    argv = ["--pipeline", "orders", "--standby", "--config", config]
    assert jobrunner.main("stream", "test", argv, requests=io.StringIO("")) == 0
    assert done.warm_ups == 1
    assert done.runs == []
    assert done.sessions[-1] == "stopped"


def test_a_standby_handed_another_pipelines_settings_fails_clearly(monkeypatch, caplog) -> None:
    done = StandIns(monkeypatch)
    config = PipelineSettings.from_mapping({"pipeline": "orders"}).to_json()
    other = PipelineSettings.from_mapping({"pipeline": "payments"})
    argv = ["--pipeline", "orders", "--standby", "--config", config]
    requests = io.StringIO(standby_request(3, other))
    assert jobrunner.main("stream", "test", argv, requests=requests) == 1
    assert done.runs == []
    assert "does not match the settings' pipeline 'payments'" in caplog.text
    assert done.sessions[-1] == "stopped"


def test_only_the_stream_job_has_a_standby_and_it_excludes_an_epoch(capsys) -> None:
    config = PipelineSettings().to_json()
    with pytest.raises(SystemExit):
        jobrunner.main(
            "batch", "test", ["--pipeline", "modeswitch", "--standby", "--config", config]
        )
    assert "the following arguments are required: --epoch" in capsys.readouterr().err
    both = ["--pipeline", "modeswitch", "--epoch", "3", "--standby", "--config", config]
    with pytest.raises(SystemExit):
        jobrunner.main("stream", "test", both)
    assert "not allowed with argument" in capsys.readouterr().err


SCHEMA = pa.schema(
    [
        ("bucket", pa.int32()),
        ("offset", pa.int64()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("value", pa.string()),
    ]
)


def commit_wave(
    settings: PipelineSettings, epoch: int, sequence: int, bucket: int, lo: int, hi: int
):
    options = DeltaSinkOptions.parse(
        {"path": settings.sink, "pipeline": settings.pipeline, "epoch": str(epoch)}
    )
    batch = pa.RecordBatch.from_pydict(
        {
            "bucket": [bucket] * (hi - lo),
            "offset": list(range(lo, hi)),
            "event_time": [1_790_000_000_000_000 + o for o in range(lo, hi)],
            "value": ["v"] * (hi - lo),
        },
        schema=SCHEMA,
    )
    message = write_files(options, iter([batch]))
    return commit_files(
        options, SCHEMA, [message], sequence=sequence, start={bucket: lo}, end={bucket: hi}
    )


def watched_settings(tmp_path: Path, wave_records: int) -> PipelineSettings:
    return PipelineSettings.from_mapping(
        {
            "pipeline": "orders",
            "warehouse": str(tmp_path),
            "source": str(tmp_path / "log"),
            "wave_records": str(wave_records),
        }
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def planned_at(monkeypatch, when: pendulum.DateTime, store: StateStore, settings, epoch: int):
    """Plan the epoch's waves as the batch job does, recorded in the ledger at ``when``."""
    from modeswitch.state import ledger as store_module

    with monkeypatch.context() as patch:  # only this plan: undo() would undo the test's too
        patch.setattr(store_module, "utc_now", lambda: when)
        return plan_remaining(store, settings, epoch)


def committed_at(settings: PipelineSettings, version: int) -> pendulum.DateTime:
    """When the sink's commit at ``version`` was made, by its own timestamp."""
    commit = commits_after(settings.sink, settings.pipeline, version - 1)[0][0]
    assert commit.table_version == version
    return pendulum.from_timestamp(commit.committed_at_ms / 1000)


def test_a_standby_is_due_lead_seconds_before_the_batch_is_expected_to_end(
    tmp_path: Path, monkeypatch
) -> None:
    settings = watched_settings(tmp_path, 1500)
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    epoch = store.epochs.open("batch", "test", {0: 0, 1: 0}, {0: 3000, 1: 1000})
    clock = Clock()
    watch = BatchEndWatch(settings, epoch, clock=clock)
    assert watch.remaining() == 4000
    assert watch.seconds_left() is None  # no wave yet: no throughput to go by
    assert not watch.due(timedelta(hours=1))
    # The job started its session long ago (the watch began at 0), and planned 100 s ago.
    clock.now = 500.0
    planned = pendulum.now("UTC").subtract(seconds=100)
    assert len(planned_at(monkeypatch, planned, store, settings, epoch).waves) == 3
    first = commit_wave(settings, epoch, 0, 0, 0, 1500)
    # The first wave's pace, from its planning to its commit: not since the job started.
    wave = (committed_at(settings, first.table_version) - planned).total_seconds()
    assert 100 <= wave < 130
    assert watch.seconds_left() == pytest.approx(2500 / (1500 / wave))
    assert watch.due(timedelta(seconds=wave * 2500 / 1500 + 1))
    assert not watch.due(timedelta(seconds=wave * 2500 / 1500 - 1))
    clock.now = 560.0  # no commit for a minute: the end is a minute nearer
    assert watch.seconds_left() == pytest.approx(2500 / (1500 / wave) - 60)
    time.sleep(0.5)
    second = commit_wave(settings, epoch, 1, 1, 0, 1000)
    assert watch.remaining() == 1500
    # Two commits: the waves' own pace, between their commits.
    apart = (
        committed_at(settings, second.table_version) - committed_at(settings, first.table_version)
    ).total_seconds()
    assert apart >= 0.5
    clock.now = 561.0
    assert watch.seconds_left() == pytest.approx(1500 / (1000 / apart) - 1)
    commit_wave(settings, epoch, 2, 0, 1500, 3000)
    assert watch.remaining() == 0 and watch.seconds_left() == 0


def test_a_one_wave_batch_epoch_gets_no_standby(tmp_path: Path) -> None:
    settings = watched_settings(tmp_path, 5000)
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    epoch = store.epochs.open("batch", "test", {0: 0, 1: 0}, {0: 3000, 1: 1000})
    watch = BatchEndWatch(settings, epoch)
    assert not watch.due(timedelta(hours=1))  # no wave yet: no estimate
    commit_wave(settings, epoch, 0, 0, 0, 3000)
    commit_wave(settings, epoch, 1, 1, 0, 1000)
    assert watch.due(timedelta(seconds=1))  # done: nothing left to wait for


def test_the_watch_counts_only_its_own_epochs_commits(tmp_path: Path) -> None:
    settings = watched_settings(tmp_path, 100)
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    first = store.epochs.open("batch", "test", {0: 0}, {0: 500})
    commit_wave(settings, first, 0, 0, 0, 200)
    reconcile(store)
    store.epochs.close(first, {0: 200}, "failed", "test")
    second = store.epochs.open("batch", "test", {0: 200}, {0: 1000})
    watch = BatchEndWatch(settings, second)  # what the sink held before counts from the start
    assert watch.total == 800 and watch.remaining() == 800
    commit_wave(settings, second, 0, 0, 200, 950)
    assert watch.remaining() == 50


def test_a_batch_job_that_overruns_is_killed_while_its_standby_is_not_yet_due(
    tmp_path: Path, monkeypatch
) -> None:
    from modeswitch.runners import local as local_runner

    settings = watched_settings(tmp_path, 100)
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    epoch = store.epochs.open("batch", "test", {0: 0}, {0: 1000})  # ten waves: not due at once
    pid_file = tmp_path / "pid"
    # A stand-in for the batch job: a real process that never ends (and never commits).
    job = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    monkeypatch.setattr(local_runner, "job_command", lambda *args: [sys.executable, "-c", job])
    runner = LocalRunner(timeout=3)
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        runner.start("batch", settings, epoch).wait()
    assert time.monotonic() - began < 30
    assert runner.standby is None
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
