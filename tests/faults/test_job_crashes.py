"""SIGKILL the Spark jobs at the worst moments; a rerun must converge to exactly once.

Each job runs as a child process in its own process group (the Python driver and its JVM);
a fault point (modeswitch.faults) pauses it at an exact moment, and the test kills the whole
group there, like a machine losing power. Then the same epoch is run again, closed, and the
sink plus quarantine are audited against the source.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from fault_tools import assert_exactly_once, kill_at, pause_when_caught_up

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import ModeswitchError
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import LocalRunner, run_job_process
from modeswitch.sinks.commits import sink_commits
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore


@pytest.fixture
def settings(tmp_path: Path) -> PipelineSettings:
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "faults",
            "source": str(tmp_path / "log"),
            "warehouse": str(tmp_path / "warehouse"),
            "wave_records": "40000",
            "max_split_records": "20000",
            "max_records_per_trigger": "15000",
            "trigger_interval": "200ms",
            "max_stream_runtime": "10m",
            "watermark_lag_threshold": "1h",
            "enter_threshold": "1h",
            "exit_threshold": "1h",
        }
    )
    log = SegmentLog.create(settings.source, buckets=4)
    produce_backlog(
        log,
        EventGenerator(seed=3, buckets=4, skew="zipf:1.1", malformed_fraction=0.01),
        records=150_000,
        span=timedelta(minutes=30),
    )
    return settings


def test_batch_driver_killed_mid_wave_then_after_a_wave_commit_then_rerun_converges(
    settings, tmp_path
) -> None:
    """One batch epoch whose job is SIGKILLed mid-wave (files written, nothing committed), then
    in its rerun after the first wave's sink commit landed and before the state write did."""
    plan = decide(settings)
    assert plan.mode == "batch"
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    for number, fault in enumerate(["sink.between_check_and_commit", "batch.after_wave_commit"]):
        kill_at(settings, "batch", plan.epoch, fault, tmp_path / f"markers-{number}")
        assert store.epochs.current().id == plan.epoch  # still open: the rerun re-attaches
        again = decide(settings)
        assert again.attached
        assert again.epoch == plan.epoch
    # The second kill's wave (the first wave replanned after the first kill) is in the sink.
    [held] = [c.sequence for c in sink_commits(settings.sink, settings.pipeline)]
    scratch = Path(settings.state_root) / "scratch"
    stale = scratch / f"epoch-{plan.epoch}-wave-99"  # what a killed wave may leave behind
    stale.mkdir(parents=True, exist_ok=True)
    (stale / "0-0.parquet").write_bytes(b"a killed wave's snapshot")
    run_job_process("batch", settings, plan.epoch, timeout=600)
    assert not scratch.exists() or not any(scratch.iterdir())  # swept, and each wave's own
    status, end = close_epoch(settings, plan.epoch)
    assert status == "completed"
    assert end == plan.boundary
    assert_exactly_once(settings)
    ledger = store.ledger.splits(plan.epoch)
    live = [s for s in ledger if s.status != "replanned"]
    assert all(s.status == "committed" for s in live)
    # The wave the sink held but the ledger missed was reconciled, never read again.
    held_splits = [s for s in ledger if s.wave == held]
    assert held_splits and all(s.status == "committed" for s in held_splits)


STREAM_KILLS = [
    # The first micro-batch's files are written, nothing is committed: the rerun resumes the
    # checkpoint (Spark runs the planned micro-batch again).
    ("sink.between_check_and_commit", 0),
    # The rerun commits micro-batches 0 and 1; the third commit is checked, not made: the sink
    # and Spark's commit log both hold 0 and 1, and the next rerun resumes the checkpoint.
    ("sink.between_check_and_commit@3", 2),
    # That rerun commits 2 and 3, then 4 is in the sink but not in Spark's commit log:
    # resuming would run it again, so the last rerun starts a fresh checkpoint at the sink's
    # offsets, sequence 5.
    ("sink.after_commit@3", 5),
]


def test_stream_driver_killed_mid_micro_batch_again_and_again_then_rerun_converges(
    settings, tmp_path
) -> None:
    """One stream epoch whose job is SIGKILLed at three worst moments in a row, each kill in
    the rerun of the one before (one batch epoch to start from, for all three)."""
    batch = decide(settings, force_mode="batch")
    run_job_process("batch", settings, batch.epoch, timeout=600)
    close_epoch(settings, batch.epoch)
    log = SegmentLog(settings.source)
    # Seven micro-batches of 15 000: enough for the five the kills need, and more after them.
    produce_backlog(log, EventGenerator(seed=4, buckets=4), records=100_000, first=1_000_000)
    stream = decide(settings, force_mode="stream")
    assert stream.mode == "stream"
    assert stream.start == batch.boundary  # the exact handoff
    for number, (fault, committed) in enumerate(STREAM_KILLS):
        kill_at(settings, "stream", stream.epoch, fault, tmp_path / f"markers-{number}")
        mine = [
            c for c in sink_commits(settings.sink, settings.pipeline) if c.epoch == stream.epoch
        ]
        assert len(mine) == committed, f"after the kill at {fault}"
        again = decide(settings)  # as an Airflow retry: re-attach, rerun
        assert again.attached and again.epoch == stream.epoch
    with pause_when_caught_up(settings, log.latest_offsets()):
        run_job_process("stream", settings, stream.epoch, timeout=600)
    status, end = close_epoch(settings, stream.epoch)
    assert status == "completed"
    assert end == log.latest_offsets()
    assert_exactly_once(settings)
    commits = sink_commits(settings.sink, settings.pipeline)
    mine = sorted(c.sequence for c in commits if c.epoch == stream.epoch)
    assert mine == list(range(len(mine)))  # no micro-batch committed twice, none skipped
    assert len(mine) > 5
    root = Path(settings.checkpoint(stream.epoch))
    restarted = sorted(p.name for p in root.parent.glob(f"{root.name}-from-*"))
    assert restarted == [f"{root.name}-from-5"]


def test_a_standby_killed_before_its_epoch_is_replaced_by_a_cold_stream_job(
    settings, tmp_path
) -> None:
    logs = tmp_path / "logs"
    with LocalRunner(log_dir=logs, timeout=600) as runner:
        batch = decide(settings, force_mode="batch")
        runner.start("batch", settings, batch.epoch).wait()  # 150 000 records, waves of 40 000
        close_epoch(settings, batch.epoch)
        standby = runner.standby
        assert standby is not None and standby.process.poll() is None
        # Not started with the batch job: only once a wave had shown its throughput.
        waves = sorted(c.committed_at_ms for c in sink_commits(settings.sink, settings.pipeline))
        assert len(waves) == 4
        # The runner's clock, not psutil's create_time: that rests on the boot time in whole
        # seconds, and came out 0.4 s before the commit the standby was started after.
        started_ms = standby.started_at * 1000
        assert waves[0] - 50 <= started_ms, (waves, started_ms)
        # Killed once its JVM has put something in the scratch (under CI's load a batch can end
        # before the standby's JVM has unpacked anything: then there is nothing to look for).
        scratch = runner.scratch.folder
        assert scratch is not None
        deadline = time.monotonic() + 60
        jvm_left = {"spark", "blockmgr", "liblz4", "snappy"}
        while time.monotonic() < deadline:
            if {p.name.split("-")[0] for p in Path(scratch).iterdir()} & jvm_left:
                break
            time.sleep(0.1)
        os.killpg(standby.process.pid, signal.SIGKILL)
        standby.process.wait(timeout=60)
        # What the killed JVM left (its local dirs, the libraries it unpacked) is in the
        # runner's scratch, which the runner removes at its end, not in the machine's /tmp.
        # How far the standby got before the kill decides what: Spark's local dirs (``spark-``,
        # ``blockmgr-``) or only the native libraries unpacked into its java.io.tmpdir
        # (``liblz4``: stop 46's CI killed it that early).
        left = {p.name.split("-")[0] for p in scratch.iterdir()}
        assert left & jvm_left, left

        log = SegmentLog(settings.source)
        produce_backlog(log, EventGenerator(seed=5, buckets=4), records=20_000, first=2_000_000)
        stream = decide(settings, force_mode="stream")
        with pause_when_caught_up(settings, log.latest_offsets()):
            runner.start(
                "stream", settings, stream.epoch
            ).wait()  # the standby is gone: a cold job runs it
        assert runner.handed_over == []
        assert runner.log_file(stream.epoch) == logs / f"epoch-{stream.epoch}-stream.log"
        status, end = close_epoch(settings, stream.epoch)
        assert status == "completed"
        assert end == log.latest_offsets()
        assert_exactly_once(settings)

        # A standby no stream epoch comes for is released at the end: it exits by itself.
        # Several waves of 40 000: a one-wave epoch gets no standby.
        produce_backlog(log, EventGenerator(seed=6, buckets=4), records=100_000, first=3_000_000)
        again = decide(settings, force_mode="batch")
        runner.start("batch", settings, again.epoch).wait()
        close_epoch(settings, again.epoch)
        unused = runner.standby
        assert unused is not None
    assert unused.process.returncode == 0
    assert not scratch.exists()
    released = (logs / f"stream-standby-after-epoch-{again.epoch}.log").read_text()
    assert "standby: released without an epoch" in released
    assert_exactly_once(settings)


def test_a_standby_killed_after_its_first_commits_is_rerun_cold_from_where_the_sink_ends(
    settings, tmp_path
) -> None:
    logs = tmp_path / "logs"
    with LocalRunner(log_dir=logs, timeout=600) as runner:
        batch = decide(settings, force_mode="batch")
        runner.start("batch", settings, batch.epoch).wait()
        close_epoch(settings, batch.epoch)
        standby = runner.standby
        assert standby is not None and standby.process.poll() is None
        log = SegmentLog(settings.source)
        produce_backlog(log, EventGenerator(seed=7, buckets=4), records=90_000, first=4_000_000)
        stream = decide(settings, force_mode="stream")

        def kill_after_two_commits() -> None:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and standby.process.poll() is None:
                commits = sink_commits(settings.sink, settings.pipeline)
                if sum(c.epoch == stream.epoch for c in commits) >= 2:
                    os.killpg(standby.process.pid, signal.SIGKILL)
                    return
                time.sleep(0.1)

        killer = threading.Thread(target=kill_after_two_commits)
        killer.start()
        try:
            with pytest.raises(ModeswitchError, match=r"standby.*status -9"):
                runner.start("stream", settings, stream.epoch).wait()
        finally:
            killer.join()
        assert runner.handed_over == [stream.epoch]
        again = decide(settings)  # as an Airflow retry: re-attach, rerun (cold: no standby)
        assert again.attached and again.epoch == stream.epoch
        with pause_when_caught_up(settings, log.latest_offsets()):
            runner.start("stream", settings, stream.epoch).wait()
        status, end = close_epoch(settings, stream.epoch)
    assert status == "completed"
    assert end == log.latest_offsets()
    assert_exactly_once(settings)
    commits = sink_commits(settings.sink, settings.pipeline)
    mine = sorted(c.sequence for c in commits if c.epoch == stream.epoch)
    assert len(mine) > 2 and mine == list(range(len(mine)))
