"""What an operator's command means across epochs, through ``decide`` on real control tables
(no Spark: a stream's stop is recorded as the stream job records it).

- ``switch_to_batch`` sent to a running stream: the stream applies it at its stop, and the next
  epoch is a batch, even when the policy's signals see no backlog (a stream that keeps up
  under the default, watermark-only policy). Found with ``bench/bench_airflow_handoff.py``:
  the next ``decide`` chose stream again.
- ``pause``: no epoch opens until a ``resume``, however many times ``decide`` runs (under
  Airflow the continuous pipeline DAG decides every ``idle_wait``); before, the next
  ``decide`` resumed by itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from fault_tools import commit_to_sink

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.runners.lifecycle import EpochPlan, carried_command, close_epoch, decide
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore
from modeswitch.state.records import STREAM_EXIT

pytestmark = pytest.mark.unit


@pytest.fixture
def pipeline(tmp_path: Path) -> tuple[PipelineSettings, StateStore]:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=2)
    produce_backlog(log, EventGenerator(seed=1, buckets=2), records=100)
    settings = PipelineSettings.from_mapping(
        {"pipeline": "cmds", "source": str(tmp_path / "log"), "warehouse": str(tmp_path / "w")}
    )
    return settings, StateStore.from_settings(settings)


def _stream_stops_for(store: StateStore, epoch: int, kind: str, action: str, mode: str) -> None:
    """What the stream job does at its stop for a pending ``kind`` command
    (:func:`modeswitch.modes.stream.run_stream_epoch`): apply it, record its exit."""
    [command] = [c for c in store.commands.pending() if c.kind == kind]
    end = store.progress.committed_offsets() or store.epochs.list()[-1].start
    store.commands.apply(command.id, epoch, end)
    store.decisions.record(
        "batch" if mode == "batch" else "stream",
        f"stream stopped: command #{command.id} {kind}",
        {
            "end": {str(b): o for b, o in end.items()},
            "state": {
                "mode": mode,
                "mode_since": "2026-11-27T10:00:00+00:00",
                "backlog_since": None,
            },
            "mode": mode,
            "command": {"id": command.id, "action": action},
        },
        switched=True,
        epoch=epoch,
        decided_by=STREAM_EXIT,
    )


def _drain(settings: PipelineSettings, plan: EpochPlan) -> None:
    """What the epoch's job does: commit everything up to the log's end, then close it."""
    end = SegmentLog(settings.source).latest_offsets()
    commit_to_sink(settings.sink, plan.epoch, 0, plan.start, end, mode=plan.mode, pipeline="cmds")
    assert close_epoch(settings, plan.epoch)[0] == "completed"


def test_switch_to_batch_sent_to_a_stream_makes_the_next_epoch_a_batch(pipeline) -> None:
    settings, store = pipeline
    stream = decide(settings, force_mode="stream")
    # The stream has read everything: the policy alone would stream on.
    end = SegmentLog(settings.source).latest_offsets()
    commit_to_sink(
        settings.sink, stream.epoch, 0, stream.start, end, mode="stream", pipeline="cmds"
    )
    store.commands.submit("switch_to_batch", {"note": "reprocess"}, issuer="alice")
    _stream_stops_for(store, stream.epoch, "switch_to_batch", "force_batch", "batch")
    assert close_epoch(settings, stream.epoch) == ("completed", end)
    assert decide(settings, dry_run=True).mode == "batch"
    batch = decide(settings)
    assert batch.mode == "batch", batch.reason
    assert "operator command force_batch (#1, which stopped the stream)" in batch.reason
    assert carried_command(store.decisions.latest()) is None  # carried once
    _drain(settings, batch)
    assert decide(settings, dry_run=True).mode == "stream"


def test_a_pause_holds_until_a_resume(pipeline) -> None:
    settings, store = pipeline
    stream = decide(settings, force_mode="stream")
    store.commands.submit("pause", {}, issuer="alice")
    _stream_stops_for(store, stream.epoch, "pause", "pause", "paused")
    close_epoch(settings, stream.epoch)
    for _ in range(3):
        held = decide(settings)
        assert (held.mode, held.epoch) == ("paused", None), held.reason
    assert [e.id for e in store.epochs.list()] == [stream.epoch]

    # Paused by decide itself (no stream running): the same.
    store.commands.submit("resume", {}, issuer="alice")
    resumed = decide(settings)
    assert resumed.epoch is not None and "resumed after pause (#2)" in resumed.reason
    _drain(settings, resumed)
    store.commands.submit("pause", {}, issuer="bob")
    assert decide(settings).mode == "paused"
    assert decide(settings).reason == "paused by an operator's command until a resume"
    store.commands.submit("resume", {}, issuer="bob")
    assert decide(settings).epoch is not None


def test_the_compose_drivers_see_a_pause_only_once_it_is_applied(pipeline) -> None:
    """``modeswitch.devtools.compose.paused``, what the compose demo and fault test wait for:
    between a stream that its policy ended and the epoch that follows, no epoch runs, but the
    pause sent meanwhile is still pending (seed 501 of the fault test stopped waiting there)."""
    from modeswitch.devtools.compose import paused

    settings, store = pipeline
    stream = decide(settings, force_mode="stream")
    store.commands.submit("pause", {}, issuer="alice")
    assert not paused(settings)  # the stream runs
    _drain(settings, stream)  # ended without applying it: no epoch runs, the pause pending
    assert not any(epoch.running for epoch in store.epochs.list())
    assert not paused(settings)
    assert decide(settings).mode == "paused"  # applied by decide
    assert paused(settings)
