"""Rewind commands without Spark: the sink's rewind commit, its fencing, that it is applied
once (also across a crash), its refusals, the quarantine, ``decide`` applying it between
epochs, and the audit after reprocessing. Real Delta tables and a real segment log; the sink
commits are made with the same functions the Spark driver calls."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import FencedError, OffsetsContinuityError, RewindRefusedError
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide, hand_off_to_stream
from modeswitch.sinks.commits import (
    SinkCommit,
    committed_offsets,
    offset_regressions,
    rewind_txn_version,
    sink_commits,
)
from modeswitch.sinks.delta import DeltaSinkOptions, commit_files, write_files
from modeswitch.sinks.rewind import rewind_sink
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore, reconcile
from modeswitch.state.commands import CommandTable
from modeswitch.transforms import QUARANTINE_REASON

PIPELINE = "orders"
LATEST = {0: 100, 1: 60}
BAD = {(0, 7), (0, 45), (0, 77), (1, 50)}  # malformed records: quarantined
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def settings(tmp_path: Path) -> PipelineSettings:
    # Segments of 10 records, published closed: retention drops whole segments.
    log = SegmentLog.create(str(tmp_path / "log"), buckets=len(LATEST), open_segment_seconds=0)
    for bucket, count in LATEST.items():
        for lo in range(0, count, 10):
            log.append(
                bucket,
                pa.table(
                    {
                        "event_time": [T0 + timedelta(seconds=o) for o in range(lo, lo + 10)],
                        "key": [f"k{o}" for o in range(lo, lo + 10)],
                        "value": [f"v{bucket}-{o}" for o in range(lo, lo + 10)],
                    }
                ),
            )
    return PipelineSettings.from_mapping(
        {
            "pipeline": PIPELINE,
            "source": str(tmp_path / "log"),
            "warehouse": str(tmp_path / "warehouse"),
        }
    )


@pytest.fixture
def store(settings: PipelineSettings) -> StateStore:
    return StateStore(settings.state_root, settings.sink, settings.pipeline)


def commit_wave(
    settings: PipelineSettings, epoch: int, sequence: int, ranges: dict[int, tuple[int, int]]
):
    """What one batch wave commits: the records of ``ranges``, malformed ones quarantined."""
    options = DeltaSinkOptions.parse(
        {
            "path": settings.sink,
            "pipeline": PIPELINE,
            "epoch": str(epoch),
            "quarantinePath": settings.quarantine,
        }
    )
    positions = [(b, o) for b, (lo, hi) in sorted(ranges.items()) for o in range(lo, hi)]
    batch = pa.RecordBatch.from_pydict(
        {
            "bucket": pa.array([b for b, _ in positions], pa.int32()),
            "offset": pa.array([o for _, o in positions], pa.int64()),
            "event_time": pa.array(
                [T0 + timedelta(seconds=o) for _, o in positions], pa.timestamp("us", tz="UTC")
            ),
            "key": pa.array([f"k{o}" for _, o in positions], pa.string()),
            "value": pa.array([f"v{b}-{o}" for b, o in positions], pa.string()),
            QUARANTINE_REASON: pa.array(
                ["bad JSON" if p in BAD else None for p in positions], pa.string()
            ),
        }
    )
    message = write_files(options, iter([batch]))
    return commit_files(
        options,
        batch.schema,
        [message],
        sequence=sequence,
        start={b: lo for b, (lo, _) in ranges.items()},
        end={b: hi for b, (_, hi) in ranges.items()},
    )


def run_batch_epoch(store: StateStore, settings: PipelineSettings, waves: list[dict]) -> int:
    """Open a batch epoch at the committed offsets, commit its waves, close it."""
    start = {**{b: 0 for b in LATEST}, **store.progress.committed_offsets()}
    boundary = {b: max([start[b]] + [w[b][1] for w in waves if b in w]) for b in LATEST}
    epoch = store.epochs.open("batch", "test", start, boundary)
    for sequence, wave in enumerate(waves):
        commit_wave(settings, epoch, sequence, wave)
    assert close_epoch(settings, epoch)[0] == "completed"
    return epoch


def positions(uri: str) -> list[tuple[int, int]]:
    rows = DeltaTable(uri).to_pyarrow_table(columns=["bucket", "offset"]).to_pylist()
    return sorted((r["bucket"], r["offset"]) for r in rows)


def expected(ranges: dict[int, tuple[int, int]], *, bad: bool) -> list[tuple[int, int]]:
    return sorted(
        (b, o) for b, (lo, hi) in ranges.items() for o in range(lo, hi) if ((b, o) in BAD) == bad
    )


def rewind(settings: PipelineSettings, command: int, epoch: int, offsets: dict[int, int]):
    return rewind_sink(
        settings.sink,
        PIPELINE,
        command=command,
        epoch=epoch,
        offsets=offsets,
        earliest=SegmentLog(settings.source).earliest_offsets(),
        buckets=list(LATEST),
        quarantine_uri=settings.quarantine,
    )


FULL = [{0: (0, 50), 1: (0, 30)}, {0: (50, 100), 1: (30, 60)}]


def test_a_rewind_deletes_what_lies_beyond_its_offsets_in_one_recorded_commit(
    settings: PipelineSettings, store: StateStore
) -> None:
    epoch = run_batch_epoch(store, settings, FULL)
    before = DeltaTable(settings.sink).version()
    outcome = rewind(settings, 1, epoch, {0: 40})
    assert outcome.status == "committed"
    table = DeltaTable(settings.sink)
    assert table.version() == before + 1  # one commit
    assert outcome.deleted == 60 - 2  # bucket 0 offsets 40..99, less 2 quarantined
    assert positions(settings.sink) == expected({0: (0, 40), 1: (0, 60)}, bad=False)
    assert positions(settings.quarantine) == expected({0: (0, 40), 1: (0, 60)}, bad=True)
    # The sink's log says what happened; committed offsets follow it.
    assert committed_offsets(settings.sink, PIPELINE) == {0: 40, 1: 60}
    newest = next(sink_commits(settings.sink, PIPELINE))
    assert (newest.mode, newest.command, newest.epoch) == ("rewind", 1, epoch)
    assert newest.start == {0: 40}
    assert newest.rewound_from == {0: 100}
    assert table.transaction_version(PIPELINE) == rewind_txn_version(epoch, 1)
    entry = (Path(settings.sink) / "_delta_log" / f"{before + 1:020d}.json").read_text()
    info = next(
        json.loads(line)["commitInfo"] for line in entry.splitlines() if "commitInfo" in line
    )
    assert info["operation"] == "DELETE"
    assert json.loads(info["modeswitch"])["command"] == 1


def test_the_next_epoch_continues_exactly_at_the_rewound_offsets(
    settings: PipelineSettings, store: StateStore
) -> None:
    epoch = run_batch_epoch(store, settings, FULL)
    rewind(settings, 1, epoch, {0: 40, 1: 10})
    with pytest.raises(OffsetsContinuityError, match=r"starts at offset 100 .* a gap"):
        commit_wave(settings, epoch + 1, 0, {0: (100, 100), 1: (60, 60)})
    commit_wave(settings, epoch + 1, 0, {0: (40, 100), 1: (10, 60)})
    assert committed_offsets(settings.sink, PIPELINE) == {0: 100, 1: 60}
    # The rewound ranges are there exactly once, in the sink or the quarantine.
    assert positions(settings.sink) == expected({0: (0, 100), 1: (0, 60)}, bad=False)
    assert positions(settings.quarantine) == expected({0: (0, 100), 1: (0, 60)}, bad=True)
    report = audit(settings.source, settings.sink, settings.quarantine, PIPELINE)
    assert report.ok, report
    assert (report.totals.missing, report.totals.duplicated) == (0, 0)
    assert report.totals.expected == 160


def test_the_audit_after_a_rewind_alone_is_exact(
    settings: PipelineSettings, store: StateStore
) -> None:
    epoch = run_batch_epoch(store, settings, FULL)
    rewind(settings, 1, epoch, {0: 0})
    report = audit(settings.source, settings.sink, settings.quarantine, PIPELINE)
    assert report.ok, report
    assert report.totals.expected == 60
    assert report.totals.out_of_range == 0


def test_a_rewind_fences_out_its_epochs_zombies(
    settings: PipelineSettings, store: StateStore
) -> None:
    epoch = run_batch_epoch(store, settings, [FULL[0]])
    rewind(settings, 1, epoch, {0: 20})
    with pytest.raises(FencedError, match=f"epoch {epoch} sequence 1"):
        commit_wave(settings, epoch, 1, {0: (20, 60)})  # a late wave of the ended epoch
    assert committed_offsets(settings.sink, PIPELINE) == {0: 20, 1: 30}
    # ...and a later epoch already in the sink fences out the rewind.
    commit_wave(settings, epoch + 1, 0, {0: (20, 30)})
    with pytest.raises(FencedError, match="rewind command #2 after epoch 1"):
        rewind(settings, 2, epoch, {0: 25})


def test_a_rewind_is_applied_once(settings: PipelineSettings, store: StateStore) -> None:
    epoch = run_batch_epoch(store, settings, FULL)
    first = rewind(settings, 1, epoch, {0: 40})
    version = DeltaTable(settings.sink).version()
    again = rewind(settings, 1, epoch, {0: 40})
    assert again.status == "already_applied"
    assert again.commit.table_version == first.table_version
    assert DeltaTable(settings.sink).version() == version
    # Still once after the rewound range was reprocessed: nothing is deleted again.
    commit_wave(settings, epoch + 1, 0, {0: (40, 100)})
    assert rewind(settings, 1, epoch, {0: 40}).status == "already_applied"
    assert len(positions(settings.sink)) + len(positions(settings.quarantine)) == 160


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        ({7: 0}, r"bucket 7 is not a bucket of the source \(it has \[0, 1\]\)"),
        ({0: 120}, "bucket 0: offset 120 is above the committed offset 100; a rewind moves back"),
        ({1: 5}, "bucket 1: offset 5 is below the source's earliest retained offset 10"),
    ],
)
def test_bad_rewinds_are_refused_before_anything_is_written(
    settings: PipelineSettings, store: StateStore, offsets: dict, message: str
) -> None:
    SegmentLog(settings.source).drop_before({1: 10})  # retention: bucket 1 starts at 10
    epoch = run_batch_epoch(store, settings, [{0: (0, 100), 1: (10, 60)}])
    version = DeltaTable(settings.sink).version()
    with pytest.raises(RewindRefusedError, match=rf"rewind command #3 .* refused: {message}"):
        rewind(settings, 3, epoch, offsets)
    assert DeltaTable(settings.sink).version() == version
    assert committed_offsets(settings.sink, PIPELINE) == {0: 100, 1: 60}


def test_a_crash_between_the_sink_and_quarantine_commits_is_repaired_once(
    settings: PipelineSettings, store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import modeswitch.sinks.rewind as rewind_module

    def crash(name: str) -> None:
        if name == "rewind.after_sink_commit":
            raise KeyboardInterrupt("simulated crash")

    epoch = run_batch_epoch(store, settings, FULL)
    monkeypatch.setattr(rewind_module, "pause_point", crash)
    with pytest.raises(KeyboardInterrupt):
        rewind(settings, 1, epoch, {0: 40})
    monkeypatch.undo()
    assert committed_offsets(settings.sink, PIPELINE) == {0: 40, 1: 60}
    assert (0, 45) in positions(settings.quarantine)  # not yet deleted there
    # The next sink commit repairs the quarantine first, then adds its own records.
    commit_wave(settings, epoch + 1, 0, {0: (40, 100)})
    assert positions(settings.quarantine) == expected({0: (0, 100), 1: (0, 60)}, bad=True)
    commit_wave(settings, epoch + 1, 1, {1: (60, 60)})  # and never deletes twice
    assert positions(settings.quarantine) == expected({0: (0, 100), 1: (0, 60)}, bad=True)


def test_decide_applies_a_pending_rewind_before_it_opens_the_next_epoch(
    settings: PipelineSettings, store: StateStore
) -> None:
    epoch = run_batch_epoch(store, settings, FULL)
    command = store.commands.submit("rewind", {"offsets": {"0": 40}}, issuer="test")
    plan = decide(settings, force_mode="batch", decided_by="test")
    assert plan.start == {0: 40, 1: 60}
    assert plan.boundary == LATEST
    assert plan.reason.startswith(f'command #{command} rewind to {{"0":40}}; ')
    assert command in plan.commands
    applied = store.commands.get(command)
    assert (applied.status, applied.applied_epoch) == ("applied", epoch)
    assert applied.applied_offsets == {0: 40, 1: 60}
    opened = store.epochs.get(plan.epoch)
    assert opened.start == {0: 40, 1: 60}
    assert opened.reason == plan.reason
    assert store.decisions.latest().reason == plan.reason
    assert committed_offsets(settings.sink, PIPELINE) == {0: 40, 1: 60}


def test_decide_rejects_a_bad_rewind_with_the_reason_and_writes_nothing(
    settings: PipelineSettings, store: StateStore
) -> None:
    run_batch_epoch(store, settings, [FULL[0]])
    version = DeltaTable(settings.sink).version()
    command = store.commands.submit("rewind", {"offsets": {"0": 90}}, issuer="test")
    plan = decide(settings, force_mode="batch", decided_by="test")
    rejected = store.commands.get(command)
    assert rejected.status == "rejected"
    assert "bucket 0: offset 90 is above the committed offset 50" in (rejected.reason or "")
    assert DeltaTable(settings.sink).version() == version
    assert plan.start == {0: 50, 1: 30}  # the epoch opens as if no rewind had been asked


def test_a_dry_run_shows_the_rewind_and_writes_nothing(
    settings: PipelineSettings, store: StateStore
) -> None:
    run_batch_epoch(store, settings, FULL)
    version = DeltaTable(settings.sink).version()
    command = store.commands.submit("rewind", {"offsets": {"1": 5}}, issuer="test")
    plan = decide(settings, dry_run=True)
    assert plan.epoch is None
    assert plan.start == {0: 100, 1: 5}
    assert plan.reason.startswith(f"would apply command #{command} rewind")
    assert store.commands.get(command).status == "pending"
    assert DeltaTable(settings.sink).version() == version


def test_a_crash_before_the_command_is_acknowledged_is_reconciled_not_reapplied(
    settings: PipelineSettings, store: StateStore
) -> None:
    epoch = run_batch_epoch(store, settings, FULL)
    command = store.commands.submit("rewind", {"offsets": {"0": 40}}, issuer="test")
    rewind(settings, command, epoch, {0: 40})  # decide's sink commit; then it crashed
    version = DeltaTable(settings.sink).version()
    assert store.commands.get(command).status == "pending"
    repaired = reconcile(store)
    assert repaired.rewinds == (command,)
    applied = store.commands.get(command)
    assert (applied.status, applied.applied_epoch) == ("applied", epoch)
    assert applied.applied_offsets == {0: 40, 1: 60}  # what decide would have recorded
    assert reconcile(store).repaired is False
    plan = decide(settings, force_mode="batch", decided_by="test")
    assert plan.start == {0: 40, 1: 60}
    assert DeltaTable(settings.sink).version() == version  # not applied twice
    assert [c.command for c in sink_commits(settings.sink, PIPELINE) if c.is_rewind] == [command]


def test_a_crash_after_the_sink_commit_inside_decide_is_applied_once(
    settings: PipelineSettings, store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    epoch = run_batch_epoch(store, settings, FULL)
    command = store.commands.submit("rewind", {"offsets": {"0": 40}}, issuer="test")

    def crash(self, commit):
        raise KeyboardInterrupt("simulated crash before the commands table")

    monkeypatch.setattr(CommandTable, "acknowledge_rewind", crash)
    with pytest.raises(KeyboardInterrupt):
        decide(settings, force_mode="batch", decided_by="test")
    monkeypatch.undo()
    assert store.epochs.list()[-1].id == epoch  # no epoch opened
    plan = decide(settings, force_mode="batch", decided_by="test")
    assert plan.start == {0: 40, 1: 60}
    assert store.commands.get(command).status == "applied"
    assert [c.command for c in sink_commits(settings.sink, PIPELINE) if c.is_rewind] == [command]


def test_rewound_buckets_forget_the_event_times_of_deleted_rows(
    settings: PipelineSettings, store: StateStore
) -> None:
    run_batch_epoch(store, settings, FULL)
    before = store.epochs.max_event_times()
    store.commands.submit("rewind", {"offsets": {"0": 40}}, issuer="test")
    plan = decide(settings, force_mode="batch", decided_by="test")
    after = store.epochs.max_event_times()
    assert 0 not in after  # its max came from deleted rows; it is behind until reprocessed
    assert after[1] == before[1]
    commit_wave(settings, plan.epoch, 0, {0: (40, 100)})
    reconcile(store)
    assert store.epochs.max_event_times()[0] == before[0]


def test_offsets_that_decrease_without_a_rewind_are_reported() -> None:
    def commit(version: int, mode: str, end: dict[int, int]) -> SinkCommit:
        return SinkCommit(PIPELINE, 1, mode, version, {}, end, 0, table_version=version)  # type: ignore[arg-type]

    fine = [commit(2, "batch", {0: 50}), commit(1, "rewind", {0: 20}), commit(0, "batch", {0: 60})]
    assert offset_regressions(fine) == []
    forged = [commit(1, "batch", {0: 20}), commit(0, "batch", {0: 60})]
    assert offset_regressions(forged) == [
        "bucket 0: sink version 1 (epoch 1 batch) moves the committed offset back from 60 "
        "to 20 without a recorded rewind"
    ]
    forward = [commit(1, "rewind", {0: 70}), commit(0, "batch", {0: 60})]
    assert "a rewind, moves the committed offset forward" in offset_regressions(forward)[0]


def test_a_commit_landing_between_the_rewinds_check_and_commit_is_not_overwritten(
    settings: PipelineSettings, store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rewind commits on exactly the snapshot it checked (no automatic retry): a commit
    of the next epoch landing in between makes it check again, and be refused."""
    import modeswitch.sinks.rewind as rewind_module

    epoch = run_batch_epoch(store, settings, [FULL[0]])
    racing = iter([lambda: commit_wave(settings, epoch + 1, 0, {0: (50, 70)})])

    def window(name: str) -> None:
        if name == "rewind.between_check_and_commit":
            next(racing, lambda: None)()

    monkeypatch.setattr(rewind_module, "pause_point", window)
    with pytest.raises(FencedError, match=f"the table already holds epoch {epoch + 1}"):
        rewind(settings, 1, epoch, {0: 20})
    assert committed_offsets(settings.sink, PIPELINE) == {0: 70, 1: 30}
    assert len(positions(settings.sink)) + len(positions(settings.quarantine)) == 100


def test_deciding_only_a_stream_writes_nothing_when_the_policy_wants_a_batch(
    settings: PipelineSettings, store: StateStore
) -> None:
    run_batch_epoch(store, settings, [FULL[0]])  # half the log left: a backlog
    command = store.commands.submit("rewind", {"offsets": {"0": 40}}, issuer="test")
    version, decisions = DeltaTable(settings.sink).version(), len(store.decisions.list())
    plan = decide(settings, only="stream", decided_by="test")
    assert (plan.epoch, plan.mode) == (None, "batch")
    assert plan.start == {0: 40, 1: 30}
    assert store.commands.get(command).status == "pending"
    assert DeltaTable(settings.sink).version() == version
    assert len(store.decisions.list()) == decisions
    assert store.epochs.current() is None


def test_deciding_only_a_stream_applies_a_pending_rewind_when_a_stream_comes_next(
    settings: PipelineSettings, store: StateStore
) -> None:
    epoch = run_batch_epoch(store, settings, FULL)
    rewound = store.commands.submit("rewind", {"offsets": {"1": 5}}, issuer="test")
    switch = store.commands.submit("switch_to_stream", {}, issuer="test")
    plan = decide(settings, only="stream", decided_by="test")
    assert plan.mode == "stream" and plan.epoch is not None
    assert plan.start == {0: 100, 1: 5}
    assert {rewound, switch} <= set(plan.commands)
    assert store.commands.get(rewound).applied_epoch == epoch
    assert store.epochs.current().start == {0: 100, 1: 5}
    assert committed_offsets(settings.sink, PIPELINE) == {0: 100, 1: 5}


def test_the_engine_hands_a_completed_batch_to_its_stream_with_one_recorded_decision(
    settings: PipelineSettings, store: StateStore
) -> None:
    start = {b: 0 for b in LATEST}
    epoch = store.epochs.open("batch", "test", start, dict(LATEST))
    for sequence, wave in enumerate(FULL):
        commit_wave(settings, epoch, sequence, wave)
    store.commands.submit("switch_to_stream", {}, issuer="test")
    decisions = len(store.decisions.list())
    stream = hand_off_to_stream(settings, epoch, decided_by="test")
    assert stream is not None and store.epochs.current().id == stream
    assert store.epochs.get(epoch).status == "completed"
    assert store.epochs.get(stream).start == LATEST
    assert len(store.decisions.list()) == decisions + 1
    assert store.decisions.latest().decided_by == "test"


def test_a_hand_off_loads_each_table_at_most_once_in_a_thread_that_read_them(
    settings: PipelineSettings, store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing a batch and deciding its stream read the control tables, the sink and the
    quarantine many times over: in a thread that has read them before (a lane's), each is
    brought up to date instead of loaded afresh (41 loads before, in this layout)."""
    import deltalake

    epoch = run_batch_epoch(store, settings, FULL[:1])
    second = decide(settings, force_mode="batch", decided_by="test").epoch
    assert second is not None and store.epochs.get(second).boundary == LATEST
    for sequence, wave in enumerate(FULL[1:]):
        commit_wave(settings, second, sequence, wave)
    store.commands.submit("switch_to_stream", {}, issuer="test")
    loads: list[str] = []
    real = deltalake.DeltaTable.__init__

    def counted(self, *args, **kwargs):
        loads.append(Path(str(args[0] if args else kwargs["table_uri"])).name)
        real(self, *args, **kwargs)

    monkeypatch.setattr(deltalake.DeltaTable, "__init__", counted)
    stream = hand_off_to_stream(settings, second, decided_by="test")
    assert stream is not None and store.epochs.get(stream).start == LATEST
    assert epoch < second < stream
    assert len(loads) == len(set(loads)), sorted(loads)
