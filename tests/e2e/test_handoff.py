"""The whole cycle on the embedded default: batch -> stream -> (burst) -> batch -> stream.

Real parts only: the segment log, the Spark jobs as child processes (each its own driver and
JVM, stopped by process group), Delta tables on disk, a live producer thread. The demo's
settings, with its thresholds halved and scaled to this machine: a batch epoch of 1 M records
takes ~5-6 s of its job's log here (ci15, 2026-11-26), so the exit threshold (25 s) must
exceed the lag it leaves, and the enter threshold (30 s) must leave the stream room to start;
the stream reads at most 2 000 records per micro-batch (~5-6 k records/s here), so a burst of
400 000 records holds it back for over a minute, longer than the enter threshold plus the
dwell. The live
producer appends 250 records/s: the stream must catch up with the ~30 s of them the batch epoch
leaves behind and then keep up, which it does with room to spare even on a loaded machine (at
500 records/s a slow CI run once fell further behind until the policy sent it back to batch).

The epochs run as the local runner runs them: a stream epoch after a batch epoch of several
waves is handed to a stream job started in standby during it (``stream_standby``, on by
default).
"""

from __future__ import annotations

import itertools
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from fault_tools import LiveProducer, scaled_to_this_hour

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.demo import DEMO_SETTINGS
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import LocalRunner
from modeswitch.sinks.commits import sink_commits
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore

BUCKETS = 16


@pytest.fixture
def settings(tmp_path: Path) -> PipelineSettings:
    # The demo's scenario and settings: this test is what `make demo` shows, with asserts, and
    # its thresholds halved (the stream after the burst crosses 30 s half a minute sooner).
    return PipelineSettings.from_mapping(
        {
            **DEMO_SETTINGS,
            "pipeline": "e2e",
            "source": str(tmp_path / "log"),
            "warehouse": str(tmp_path / "warehouse"),
            "watermark_lag_threshold": "30s",
            "enter_threshold": "30s",
            "exit_threshold": "25s",
        }
    )


class BurstOnceCaughtUp:
    """Appends a burst of 400 000 records once the stream epoch has committed three
    micro-batches and caught up with what the log held at its first commit: from then on a
    watermark lag over the threshold can only come from the burst, however long the stream's
    cold start took on this machine (a fixed timer raced it under load)."""

    def __init__(self, settings: PipelineSettings, log: SegmentLog) -> None:
        self.settings = settings
        self.log = log
        self.stop_flag = threading.Event()
        self.fired = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        target: dict[int, int] | None = None
        while not self.stop_flag.wait(0.5):
            commits = [
                c
                for c in sink_commits(self.settings.sink, self.settings.pipeline)
                if c.mode == "stream"
            ]
            if not commits:
                continue
            if target is None:
                target = self.log.latest_offsets()
            reached = max(commits, key=lambda c: c.sequence).end
            if len(commits) >= 3 and all(reached.get(b, 0) >= o for b, o in target.items()):
                generator = EventGenerator(seed=7, buckets=BUCKETS)
                produce_backlog(self.log, generator, records=400_000, first=20_000_000)
                self.fired.set()
                return

    def __enter__(self) -> BurstOnceCaughtUp:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_flag.set()
        self.thread.join(timeout=60)


def run_epoch(
    runner: LocalRunner, settings: PipelineSettings, expected_mode: str
) -> tuple[int, dict, dict]:
    plan = decide(settings, decided_by="e2e")
    assert plan.epoch is not None
    assert plan.mode == expected_mode, plan.reason
    runner.start(plan.mode, settings, plan.epoch).wait()
    status, end = close_epoch(settings, plan.epoch)
    assert status == "completed"
    return plan.epoch, dict(plan.start), end


# Not `exclusive` (tests/conftest.py): its thresholds are scaled from the first batch epoch's
# length, measured beside whatever the other test worker runs, and the burst fires once the
# stream has caught up, not on a timer. (It ran alone until session 42, idling the other
# worker for a minute once the unit files were done.)
def test_batch_stream_burst_batch_stream_hands_off_exactly(settings: PipelineSettings) -> None:
    log = SegmentLog.create(settings.source, buckets=BUCKETS)
    generator = EventGenerator(
        seed=5, buckets=BUCKETS, skew="zipf:1.1", late_fraction=0.01, malformed_fraction=0.001
    )
    produce_backlog(log, generator, records=1_000_000, span=timedelta(hours=1))
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    epochs = []
    runner = LocalRunner(log_dir=Path(settings.warehouse).parent / "logs", timeout=600)
    producer = LiveProducer(log, EventGenerator(seed=6, buckets=BUCKETS, skew="zipf:1.1"), 250)
    with producer, runner:
        began = time.monotonic()
        epochs.append(run_epoch(runner, settings, "batch"))  # the 1 M backlog, an hour of events
        settings = scaled_to_this_hour(settings, time.monotonic() - began)
        with BurstOnceCaughtUp(settings, log) as burst:
            # stops when the burst holds it back
            epochs.append(run_epoch(runner, settings, "stream"))
        assert burst.fired.is_set(), (
            "the stream never caught up with the live producer; its epoch ended: "
            f"{store.epochs.list()[-1].end_reason}"
        )
        epochs.append(run_epoch(runner, settings, "batch"))  # drains the burst
        short = PipelineSettings.from_mapping(
            {**settings.to_mapping(), "max_stream_runtime": "20s"}
        )
        epochs.append(run_epoch(runner, short, "stream"))
    # The first stream epoch ran in a standby started during the 3-wave batch epoch before it
    # (the burst's batch epoch may be one wave, which gets no standby).
    assert runner.handed_over[0] == epochs[1][0]
    assert set(runner.handed_over) <= {epochs[1][0], epochs[3][0]}

    # Each epoch starts exactly where the previous one ended: no gap, no overlap.
    for (_, _, end), (_, start, _) in itertools.pairwise(epochs):
        assert start == end
    recorded = store.epochs.list()
    assert [e.mode for e in recorded] == ["batch", "stream", "batch", "stream"]
    assert all(e.status == "completed" for e in recorded)
    assert recorded[0].end == recorded[0].boundary
    assert recorded[2].end == recorded[2].boundary
    stream_stop = recorded[1].end_reason or ""
    assert "policy" in stream_stop, stream_stop
    assert "watermark lag" in stream_stop, stream_stop
    # The first stream kept up with the live producer before the burst held it back.
    first_stream = [p for p in store.progress.list(recorded[1].id)]
    assert len(first_stream) >= 3

    report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
    assert report.ok, report
    assert report.totals.missing == 0
    assert report.totals.duplicated == 0
    assert report.totals.in_quarantine > 0  # malformed records were kept, not dropped
    assert report.totals.expected >= 1_400_000
