"""The control state: each table round-trips, statuses move only forward, bad input is refused."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pendulum
import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from state_tools import warehouse_store

from modeswitch.errors import (
    EpochStillOpenError,
    InvalidOffsetsError,
    InvalidStateInputError,
    InvalidStateTransitionError,
    StateRecordNotFoundError,
)
from modeswitch.sinks.commits import SinkCommit
from modeswitch.state import StateStore
from modeswitch.state.tables import TAIL_KEYS

pytestmark = pytest.mark.unit

PIPELINE = "orders"


@dataclass(frozen=True)
class Split:
    bucket: int
    start: int
    end: int


@dataclass(frozen=True)
class Wave:
    index: int
    splits: tuple[Split, ...]


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    return warehouse_store(str(tmp_path / "warehouse"), PIPELINE, str(tmp_path / "sink"))


def sink_commit(epoch: int, sequence: int, start: dict[int, int], end: dict[int, int], **kw):
    fields = {"records": sum(end[b] - start.get(b, 0) for b in end), "mode": "batch"} | kw
    return SinkCommit(
        pipeline=PIPELINE, epoch=epoch, sequence=sequence, start=start, end=end, **fields
    )


def write_sink_commit(uri: str, commit: SinkCommit) -> None:
    rows = pa.table({"bucket": pa.array([0], pa.int32()), "value": ["x"]})
    write_deltalake(
        uri,
        rows,
        mode="append",
        commit_properties=CommitProperties(
            custom_metadata=commit.to_metadata(),
            app_transactions=[Transaction(commit.pipeline, commit.txn_version)],
        ),
    )


def assert_utc_between(value: datetime | None, before: datetime, after: datetime) -> None:
    assert value is not None
    assert value.utcoffset() == timedelta(0)
    assert before <= value <= after


# --- store construction ----------------------------------------------------------------------


def test_default_root_is_under_the_warehouse_and_reads_create_nothing(tmp_path: Path) -> None:
    store = warehouse_store(str(tmp_path / "wh"), PIPELINE, str(tmp_path / "sink"))

    assert store.tables.state_root == str(tmp_path / "wh" / "_modeswitch" / PIPELINE)
    assert store.tables.uri("epochs") == f"{store.tables.state_root}/epochs"
    assert store.epochs.current() is None
    assert store.epochs.list() == []
    assert store.commands.pending() == []
    assert store.progress.committed_offsets() == {}
    assert not (tmp_path / "wh").exists()


def test_store_pickles_and_a_rebuilt_store_sees_the_same_state(store: StateStore) -> None:
    epoch = store.epochs.open("stream", "live", {0: 5})
    command = store.commands.submit("pause", issuer="ops")

    clone = pickle.loads(pickle.dumps(store))
    rebuilt = StateStore(
        store.tables.state_root, store.tables.sink_table_uri, store.tables.pipeline
    )

    for other in (clone, rebuilt):
        assert other.epochs.current() == store.epochs.get(epoch)
        assert [c.id for c in other.commands.pending()] == [command]


def test_relative_roots_are_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = StateStore("state", "sink", PIPELINE)
    assert store.tables.state_root == str(tmp_path / "state")
    assert store.tables.sink_table_uri == str(tmp_path / "sink")


def test_tables_are_created_with_their_explicit_schemas(store: StateStore) -> None:
    epoch = store.epochs.open("batch", "backlog", {0: 0}, {0: 10})
    store.ledger.record(epoch, [Wave(0, (Split(0, 0, 10),))])
    store.progress.record(sink_commit(epoch, 0, {0: 0}, {0: 10}))
    store.decisions.record("batch", "backlog", {})
    store.commands.submit("pause", issuer="ops")

    utc = pa.timestamp("us", tz="UTC")
    expected = {
        "epochs": {"started_at": utc, "ended_at": utc, "id": pa.int64()},
        "splits": {"start_offset": pa.int64(), "end_offset": pa.int64(), "updated_at": utc},
        "progress": {"watermark": utc, "committed_at": utc, "sink_version": pa.int64()},
        "decisions": {"at": utc, "inputs": pa.string(), "switched": pa.bool_()},
        "commands": {"created_at": utc, "applied_at": utc, "applied_epoch": pa.int64()},
    }
    for name, columns in expected.items():
        schema = pa.schema(DeltaTable(store.tables.uri(name)).schema().to_arrow())
        for column, type_ in columns.items():
            assert schema.field(column).type == type_, (name, column)


# --- epochs ----------------------------------------------------------------------------------


def test_epoch_round_trip_open_then_close(store: StateStore) -> None:
    before = pendulum.now("UTC")
    epoch_id = store.epochs.open("batch", "offset lag 5000 > 1000", {0: 10, 1: 0}, {0: 90, 1: 40})
    opened = store.epochs.current()

    assert epoch_id == 1
    assert opened is not None
    assert (opened.id, opened.mode, opened.status) == (1, "batch", "running")
    assert opened.reason == "offset lag 5000 > 1000"
    assert (opened.start, opened.boundary, opened.end) == ({0: 10, 1: 0}, {0: 90, 1: 40}, None)
    assert_utc_between(opened.started_at, before, pendulum.now("UTC"))

    assert store.epochs.close(epoch_id, {0: 90, 1: 40}, "completed", "boundary reached") is True
    closed = store.epochs.get(epoch_id)

    assert store.epochs.current() is None
    assert store.epochs.latest() == closed
    assert (closed.status, closed.end, closed.end_reason) == (
        "completed",
        {0: 90, 1: 40},
        "boundary reached",
    )
    assert_utc_between(closed.ended_at, opened.started_at, pendulum.now("UTC"))

    second = store.epochs.open("stream", "caught up", closed.end)
    assert second == 2
    assert [e.id for e in store.epochs.list()] == [1, 2]
    assert store.epochs.get(second).boundary is None


def test_open_epoch_is_refused_while_another_runs(store: StateStore) -> None:
    first = store.epochs.open("stream", "live", {0: 0})

    with pytest.raises(EpochStillOpenError, match=f"epoch {first} \\(stream"):
        store.epochs.open("batch", "lagging", {0: 0}, {0: 10})

    assert [e.id for e in store.epochs.list()] == [first]


def test_supersede_closes_the_running_epoch_in_the_same_commit(store: StateStore) -> None:
    first = store.epochs.open("stream", "live", {0: 0})
    version = DeltaTable(store.tables.uri("epochs")).version()

    second = store.epochs.open("batch", "operator forced", {0: 3}, {0: 10}, supersede=True)

    assert second == first + 1
    assert DeltaTable(store.tables.uri("epochs")).version() == version + 1
    old = store.epochs.get(first)
    assert old.status == "superseded"
    assert old.end_reason is not None
    assert f"superseded by epoch {second}" in old.end_reason
    assert store.epochs.current() == store.epochs.get(second)


def test_epoch_ids_stay_above_the_epochs_already_in_the_sink(store: StateStore) -> None:
    # The control tables were lost, but the sink remembers epoch 7: a new epoch 1 would be
    # fenced out by the sink forever.
    write_sink_commit(store.tables.sink_table_uri, sink_commit(7, 3, {0: 0}, {0: 12}))

    assert store.epochs.open("stream", "restart", {0: 12}) == 8


def test_close_epoch_transitions(store: StateStore) -> None:
    epoch = store.epochs.open("stream", "live", {0: 0})
    assert store.epochs.close(epoch, {0: 7}, "failed", "driver lost") is True

    # An Airflow retry of the same close is a no-op.
    assert store.epochs.close(epoch, {0: 7}, "failed", "driver lost") is False
    with pytest.raises(InvalidStateTransitionError, match=f"epoch {epoch} is already failed"):
        store.epochs.close(epoch, {0: 7}, "completed")
    with pytest.raises(InvalidStateTransitionError, match="already failed"):
        store.epochs.close(epoch, {0: 9}, "failed")
    with pytest.raises(StateRecordNotFoundError, match="epoch 42 does not exist"):
        store.epochs.close(42, {0: 7})
    with pytest.raises(InvalidStateInputError, match="closing status: 'running'"):
        store.epochs.close(epoch, {0: 7}, "running")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("batched", "r", {0: 0}, {0: 1}), InvalidStateInputError, "epoch mode: 'batched'"),
        (("batch", "r", {0: 0}, None), InvalidStateInputError, "batch epoch needs a boundary"),
        (("stream", "r", {0: 0}, {0: 1}), InvalidStateInputError, "stream epoch has no boundary"),
        (("batch", "r", {0: 5}, {0: 4}), InvalidStateInputError, "bucket 0 ends at 4, below"),
        (("batch", "r", {0: 0, 3: 1}, {0: 4}), InvalidStateInputError, "lacks bucket 3"),
        (("batch", "r", {0: -1}, {0: 4}), InvalidOffsetsError, "epoch start: offset -1"),
        (("stream", "r", {"x": 1}), InvalidOffsetsError, "epoch start: bucket 'x'"),
        (("stream", 5, {0: 1}), InvalidStateInputError, "epoch reason: 5"),
    ],
)
def test_open_epoch_validates_its_inputs(
    store: StateStore, args: tuple, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        store.epochs.open(*args)
    assert store.epochs.list() == []


# --- split ledger ----------------------------------------------------------------------------


@pytest.fixture
def batch_epoch(store: StateStore) -> int:
    return store.epochs.open("batch", "backlog", {0: 0, 1: 10}, {0: 100, 1: 50})


PLAN = [
    Wave(0, (Split(0, 0, 50), Split(1, 10, 30))),
    Wave(1, (Split(0, 50, 100), Split(1, 30, 50))),
]


def test_splits_round_trip_and_recording_is_idempotent(store: StateStore, batch_epoch: int) -> None:
    assert store.ledger.record(batch_epoch, PLAN) == 4
    assert store.ledger.record(batch_epoch, PLAN) == 0  # a retried planning task

    pending = store.ledger.splits(batch_epoch, "pending")
    assert [(s.wave, s.bucket, s.start, s.end) for s in pending] == [
        (0, 0, 0, 50),
        (0, 1, 10, 30),
        (1, 0, 50, 100),
        (1, 1, 30, 50),
    ]
    assert {s.status for s in pending} == {"pending"}
    assert all(s.epoch == batch_epoch for s in pending)


def test_mark_splits_committed_leaves_the_rest_pending(store: StateStore, batch_epoch: int) -> None:
    store.ledger.record(batch_epoch, PLAN)

    assert store.ledger.mark(batch_epoch, [(0, 0, 50), Split(1, 10, 30)], "committed") == 2
    assert store.ledger.mark(batch_epoch, [(0, 0, 50)], "committed") == 0  # already so

    assert [s.key for s in store.ledger.splits(batch_epoch, "pending")] == [
        (0, 50, 100),
        (1, 30, 50),
    ]
    committed = store.ledger.splits(batch_epoch, "committed")
    assert [s.key for s in committed] == [(0, 0, 50), (1, 10, 30)]
    assert all(s.updated_at >= s.recorded_at for s in committed)


def test_split_status_moves_only_forward(store: StateStore, batch_epoch: int) -> None:
    store.ledger.record(batch_epoch, PLAN)
    store.ledger.mark(batch_epoch, [(0, 0, 50)], "committed")

    with pytest.raises(InvalidStateTransitionError, match=r"\[0, 50\) .* is committed"):
        store.ledger.mark(batch_epoch, [(0, 0, 50)], "pending")
    with pytest.raises(InvalidStateTransitionError, match="cannot become replanned"):
        store.ledger.mark(batch_epoch, [(0, 0, 50)], "replanned")
    with pytest.raises(StateRecordNotFoundError, match=r"no split bucket 0 \[0, 40\)"):
        store.ledger.mark(batch_epoch, [(0, 0, 40)], "committed")
    with pytest.raises(InvalidStateInputError, match="split status: 'done'"):
        store.ledger.mark(batch_epoch, [(0, 50, 100)], "done")  # type: ignore[arg-type]
    # A refused call changes nothing, not even its valid part.
    with pytest.raises(StateRecordNotFoundError):
        store.ledger.mark(batch_epoch, [(0, 50, 100), (9, 0, 1)], "committed")
    assert (0, 50, 100) in [s.key for s in store.ledger.splits(batch_epoch, "pending")]


def test_a_replan_replaces_pending_splits_with_new_waves(
    store: StateStore, batch_epoch: int
) -> None:
    store.ledger.record(batch_epoch, PLAN)
    store.ledger.mark(batch_epoch, [(0, 0, 50), (1, 10, 30)], "committed")

    # Wave 1 failed; the re-plan cuts what remains differently and numbers on.
    store.ledger.mark(batch_epoch, [(0, 50, 100), (1, 30, 50)], "replanned")
    replan = [Wave(2, (Split(0, 50, 75), Split(1, 30, 50))), Wave(3, (Split(0, 75, 100),))]
    assert store.ledger.record(batch_epoch, replan) == 3

    assert [(s.wave, s.key) for s in store.ledger.splits(batch_epoch, "pending")] == [
        (2, (0, 50, 75)),
        (2, (1, 30, 50)),
        (3, (0, 75, 100)),
    ]
    # (1, 30, 50) is live in wave 2 now, so marking it finds the live row, not the replanned.
    assert store.ledger.mark(batch_epoch, [(1, 30, 50)], "committed") == 1
    assert len(store.ledger.splits(batch_epoch, "replanned")) == 2


@pytest.mark.parametrize(
    ("waves", "message"),
    [
        ([Wave(5, (Split(0, 40, 60),))], r"overlap its ledger: bucket 0 \[0, 50\) and \[40, 60\)"),
        ([Wave(5, (Split(1, 10, 30),))], r"overlap its ledger: bucket 1 \[10, 30\)"),
        ([Wave(5, (Split(0, 90, 110),))], r"\[90, 110\) lies outside epoch 1's range \[0, 100\)"),
        ([Wave(5, (Split(1, 5, 12),))], r"outside epoch 1's range \[10, 50\)"),
        ([Wave(5, (Split(2, 0, 5),))], "epoch 1 has no such bucket"),
        ([Wave(5, ((0, 5, 5),))], r"bucket 0 \[5, 5\) is empty"),
        ([Wave(-1, (Split(0, 0, 5),))], "wave index: -1"),
    ],
)
def test_record_splits_refuses_bad_splits(
    store: StateStore, batch_epoch: int, waves: list[Wave], message: str
) -> None:
    store.ledger.record(batch_epoch, PLAN[:1])
    with pytest.raises(InvalidStateInputError, match=message):
        store.ledger.record(batch_epoch, waves)
    assert len(store.ledger.splits(batch_epoch)) == 2


def test_overlapping_splits_within_one_call_are_refused(
    store: StateStore, batch_epoch: int
) -> None:
    with pytest.raises(InvalidStateInputError, match=r"bucket 0 \[0, 50\) and \[0, 50\)"):
        store.ledger.record(batch_epoch, [Wave(0, (Split(0, 0, 50),)), Wave(1, (Split(0, 0, 50),))])
    assert store.ledger.splits(batch_epoch) == []


def test_only_batch_epochs_have_a_ledger(store: StateStore) -> None:
    epoch = store.epochs.open("stream", "live", {0: 0})
    with pytest.raises(InvalidStateInputError, match=f"epoch {epoch} is a stream epoch"):
        store.ledger.record(epoch, PLAN)
    with pytest.raises(StateRecordNotFoundError, match="epoch 99"):
        store.ledger.record(99, PLAN)


# --- progress --------------------------------------------------------------------------------


def test_progress_round_trip_and_idempotence(store: StateStore) -> None:
    watermark = pendulum.datetime(2025, 3, 1, 12, 0, 5, tz="Europe/Paris")
    commit = sink_commit(
        3,
        7,
        {0: 10, 1: 0},
        {0: 20, 1: 5},
        mode="stream",
        max_event_time_us={0: 1_740_830_405_000_001, 1: 1_740_830_400_000_000},
        table_version=12,
        committed_at_ms=1_740_830_406_123,
    )

    assert store.progress.record(commit, watermark=watermark) is True
    assert store.progress.record(commit, watermark=watermark) is False  # a retried writer

    [row] = store.progress.list()
    assert (row.epoch, row.sequence, row.mode) == (3, 7, "stream")
    assert (row.start, row.end, row.records) == ({0: 10, 1: 0}, {0: 20, 1: 5}, 15)
    assert row.max_event_time_us == {0: 1_740_830_405_000_001, 1: 1_740_830_400_000_000}
    assert row.watermark == watermark
    assert row.watermark.utcoffset() == timedelta(0)
    assert row.committed_at == pendulum.datetime(2025, 3, 1, 12, 0, 6, 123000, tz="UTC")
    assert (row.sink_version, row.recorded_by) == (12, "sink")
    assert store.progress.list(epoch=4) == []


def test_small_files_are_compacted_and_no_row_is_lost(tmp_path: Path) -> None:
    store = StateStore(
        str(tmp_path / "state"), str(tmp_path / "sink"), PIPELINE, compact_at_files=8
    )
    for sequence in range(30):
        store.progress.record(sink_commit(1, sequence, {0: sequence}, {0: sequence + 1}))
        store.decisions.record("stream", f"tick {sequence}", {})

    for name in ("progress", "decisions"):
        table = DeltaTable(store.tables.uri(name))
        assert len(table.file_uris()) < 8, name
        assert "compact" in {entry.get("modeswitch.state") for entry in table.history()}, name
    assert [p.sequence for p in store.progress.list()] == list(range(30))
    assert len(store.decisions.list()) == 30
    assert store.progress.record(sink_commit(1, 3, {0: 3}, {0: 4})) is False


def test_progress_refuses_a_different_commit_under_the_same_key(store: StateStore) -> None:
    store.progress.record(sink_commit(1, 0, {0: 0}, {0: 10}))
    with pytest.raises(InvalidStateTransitionError, match=r"epoch 1 sequence 0 is recorded"):
        store.progress.record(sink_commit(1, 0, {0: 0}, {0: 11}))
    assert [p.end for p in store.progress.list()] == [{0: 10}]


def test_progress_refuses_bad_input(store: StateStore) -> None:
    other = SinkCommit("payments", 1, "batch", 0, {0: 0}, {0: 1}, 1)
    with pytest.raises(InvalidStateInputError, match="pipeline 'payments'"):
        store.progress.record(other)
    with pytest.raises(InvalidStateInputError, match=r"watermark: .* is naive"):
        store.progress.record(sink_commit(1, 0, {0: 0}, {0: 1}), watermark=datetime(2025, 1, 1))
    with pytest.raises(InvalidStateInputError, match="mode: 'fast'"):
        store.progress.record(sink_commit(1, 0, {0: 0}, {0: 1}, mode="fast"))
    with pytest.raises(InvalidStateInputError, match="is not a SinkCommit"):
        store.progress.record({"epoch": 1})  # type: ignore[arg-type]
    assert store.progress.list() == []


# --- decisions -------------------------------------------------------------------------------


def test_decisions_keep_their_inputs_and_come_back_newest_first(store: StateStore) -> None:
    t0 = pendulum.datetime(2025, 3, 1, 12, tz="UTC")
    store.decisions.record(
        "batch",
        "watermark lag 10m > 5m",
        {"lag": timedelta(minutes=10), "now": t0, "latest": {"0": 900}, "idle": {2}},
        at=t0,
        switched=True,
        epoch=4,
        decided_by="decide",
    )
    store.decisions.record("batch", "still behind", {}, at=t0.add(minutes=1))

    newest, oldest = store.decisions.list()
    assert newest.reason == "still behind"
    assert store.decisions.latest() == newest
    assert (oldest.at, oldest.mode, oldest.switched, oldest.epoch) == (t0, "batch", True, 4)
    assert oldest.decided_by == "decide"
    assert oldest.inputs == {
        "idle": [2],
        "lag": 600.0,
        "latest": {"0": 900},
        "now": "2025-03-01T12:00:00+00:00",
    }
    assert store.decisions.list(limit=1) == [newest]


def test_decisions_refuse_bad_input(store: StateStore) -> None:
    with pytest.raises(InvalidStateInputError, match="decision mode: 'backlog'"):
        store.decisions.record("backlog", "r", {})  # type: ignore[arg-type]
    with pytest.raises(InvalidStateInputError, match=r"decision time: .* is naive"):
        store.decisions.record("batch", "r", {}, at=datetime(2025, 1, 1))
    with pytest.raises(InvalidStateInputError, match="decision inputs: not JSON-serialisable"):
        store.decisions.record("batch", "r", {"x": object()})
    with pytest.raises(InvalidStateInputError, match="decision inputs: not JSON-serialisable"):
        store.decisions.record("batch", "r", {"x": float("nan")})
    assert store.decisions.list() == []


def test_decision_time_is_kept_in_utc(store: StateStore) -> None:
    at = datetime(2025, 6, 1, 14, 30, tzinfo=pendulum.timezone("Asia/Tokyo"))
    recorded = store.decisions.record("stream", "r", {}, at=at)
    [stored] = store.decisions.list()
    assert stored.at == recorded.at == at
    assert stored.at.isoformat() == "2025-06-01T05:30:00+00:00"
    assert stored.at == datetime(2025, 6, 1, 5, 30, tzinfo=UTC)


# --- commands --------------------------------------------------------------------------------


def test_command_round_trip_and_apply_once(store: StateStore) -> None:
    before = pendulum.now("UTC")
    first = store.commands.submit("switch_to_batch", {"note": "reindex"}, issuer="alice")
    second = store.commands.submit("pause", issuer="bob")
    assert (first, second) == (1, 2)

    pending = store.commands.pending()
    assert [(c.id, c.kind, c.issuer, c.args) for c in pending] == [
        (1, "switch_to_batch", "alice", {"note": "reindex"}),
        (2, "pause", "bob", {}),
    ]
    assert_utc_between(pending[0].created_at, before, pendulum.now("UTC"))

    assert store.commands.apply(first, 3, {0: 120, 1: 98}) is True
    assert store.commands.apply(first, 4, {0: 130, 1: 99}) is False  # never applied twice
    assert store.commands.reject(first, "too late") is False

    applied = store.commands.get(first)
    assert (applied.status, applied.applied_epoch, applied.applied_offsets) == (
        "applied",
        3,
        {0: 120, 1: 98},
    )
    assert applied.reason is None
    assert applied.rejected_at is None
    assert_utc_between(applied.applied_at, applied.created_at, pendulum.now("UTC"))
    assert [c.id for c in store.commands.pending()] == [second]


def test_rejected_commands_keep_their_reason_and_are_never_applied(store: StateStore) -> None:
    command = store.commands.submit("resume", issuer="alice")

    assert store.commands.reject(command, "pipeline is not paused") is True
    assert store.commands.apply(command, 1, {0: 1}) is False

    rejected = store.commands.get(command)
    assert (rejected.status, rejected.reason, rejected.applied_epoch) == (
        "rejected",
        "pipeline is not paused",
        None,
    )
    assert rejected.rejected_at is not None
    assert store.commands.pending() == []
    assert [c.id for c in store.commands.list("rejected")] == [command]


def test_rewind_commands_carry_validated_offsets(store: StateStore) -> None:
    command = store.commands.submit("rewind", {"offsets": {1: 40, 0: 7}}, issuer="alice")
    assert store.commands.get(command).args == {"offsets": {"0": 7, "1": 40}}

    with pytest.raises(InvalidStateInputError, match="has no 'offsets'"):
        store.commands.submit("rewind", {}, issuer="alice")
    with pytest.raises(InvalidOffsetsError, match="rewind command offsets: offset -3"):
        store.commands.submit("rewind", {"offsets": {"0": -3}}, issuer="alice")


def test_commands_refuse_bad_input(store: StateStore) -> None:
    with pytest.raises(InvalidStateInputError, match="command kind: 'explode'"):
        store.commands.submit("explode", issuer="alice")  # type: ignore[arg-type]
    with pytest.raises(InvalidStateInputError, match="command issuer: ''"):
        store.commands.submit("pause", issuer="")
    with pytest.raises(InvalidStateInputError, match="pause command args: not JSON"):
        store.commands.submit("pause", {"when": object()}, issuer="alice")
    with pytest.raises(InvalidStateInputError, match="pause command args: \\[1\\]"):
        store.commands.submit("pause", [1], issuer="alice")  # type: ignore[arg-type]
    assert store.commands.list() == []

    command = store.commands.submit("pause", issuer="alice")
    with pytest.raises(StateRecordNotFoundError, match="command 9 does not exist"):
        store.commands.apply(9, 1, {0: 1})
    with pytest.raises(InvalidOffsetsError, match=f"offsets of command {command}"):
        store.commands.apply(command, 1, {0: "many"})
    with pytest.raises(InvalidStateInputError, match="applied epoch: 0"):
        store.commands.apply(command, 0, {0: 1})
    with pytest.raises(InvalidStateInputError, match="rejection reason"):
        store.commands.reject(command, "")
    assert store.commands.get(command).status == "pending"


# --- committed offsets -----------------------------------------------------------------------


def test_committed_offsets_come_from_the_sinks_log(store: StateStore) -> None:
    write_sink_commit(store.tables.sink_table_uri, sink_commit(1, 0, {0: 0, 1: 0}, {0: 10, 1: 4}))
    write_sink_commit(store.tables.sink_table_uri, sink_commit(1, 1, {0: 10, 1: 4}, {0: 25, 1: 9}))

    # Whatever the control tables say (here: nothing), the sink's log is the truth.
    assert store.progress.list() == []
    assert store.progress.committed_offsets() == {0: 25, 1: 9}


def test_backlog_finished_is_recorded_once_per_bucket_per_epoch(tmp_path) -> None:
    from modeswitch.errors import InvalidStateInputError
    from modeswitch.state import StateStore

    store = StateStore(str(tmp_path / "state"), str(tmp_path / "sink"), "fin")
    epoch = store.epochs.open("batch", "backlog", {0: 0, 1: 0}, {0: 10, 1: 20})
    assert store.ledger.record_finished(epoch, [0]) == 1
    assert store.ledger.record_finished(epoch, [0, 1]) == 1  # bucket 0 again: a no-op
    assert set(store.ledger.finished(epoch)) == {0, 1}
    with pytest.raises(InvalidStateInputError, match=r"buckets \[7\] are not in its boundary"):
        store.ledger.record_finished(epoch, [7])


def test_many_progress_rows_go_in_one_commit_and_recorded_ones_are_skipped(
    store: StateStore,
) -> None:
    store.progress.record(sink_commit(2, 0, {0: 0}, {0: 10}))
    version = DeltaTable(store.tables.uri("progress")).version()
    commits = [sink_commit(2, s, {0: 10 * s}, {0: 10 * s + 10}) for s in range(4)]

    assert store.progress.record_many(commits, recorded_by="stream") == 3
    assert DeltaTable(store.tables.uri("progress")).version() == version + 1
    assert [p.sequence for p in store.progress.list(epoch=2)] == [0, 1, 2, 3]
    assert store.progress.record_many(commits) == 0
    assert store.progress.record_many([]) == 0
    with pytest.raises(InvalidStateTransitionError, match="epoch 2 sequence 3 is recorded"):
        store.progress.record_many(
            [sink_commit(2, 4, {0: 40}, {0: 50}), sink_commit(2, 3, {0: 30}, {0: 41})]
        )
    assert [p.sequence for p in store.progress.list(epoch=2)] == [0, 1, 2, 3]


# --- bounded reads of a long history -----------------------------------------------------------


def test_decisions_pages_and_windows_read_like_the_whole_table(tmp_path: Path) -> None:
    store = warehouse_store(
        str(tmp_path / "wh"), PIPELINE, str(tmp_path / "sink"), compact_at_files=4
    )
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    # Out of order, with a tie, across compactions (every 4 files).
    seconds = [5, 1, 9, 3, 3, 7, 0, 8, 2, 6, 4, 11, 10]
    for i, s in enumerate(seconds):
        store.decisions.record("stream", f"d{i}", {"n": i}, at=t0 + timedelta(seconds=s))
    everything = sorted(
        ((t0 + timedelta(seconds=s), f"d{i}") for i, s in enumerate(seconds)), reverse=True
    )

    assert store.decisions.count() == len(seconds)
    assert [d.at for d in store.decisions.list()] == [at for at, _ in everything]
    assert [d.at for d in store.decisions.list(limit=4)] == [at for at, _ in everything[:4]]
    page = store.decisions.list(limit=3, offset=8)
    assert [d.at for d in page] == [at for at, _ in everything[8:11]]
    assert store.decisions.list(limit=100, offset=20) == []
    since = store.decisions.list(since=t0 + timedelta(seconds=8))
    assert [d.at.second for d in since] == [11, 10, 9, 8]
    until = store.decisions.list(limit=2, until=t0 + timedelta(seconds=3))
    assert [d.at.second for d in until] == [3, 3]
    assert store.decisions.latest().reason == "d11"
    assert store.decisions.list(limit=0) == []


def test_the_newest_decisions_are_found_over_any_span(tmp_path: Path) -> None:
    """The newest ``limit`` are read from a stretch back from the newest time, widened until
    it holds them: times spread over days, in bursts, give what a sort of all would."""
    import random

    store = warehouse_store(
        str(tmp_path / "wh"), PIPELINE, str(tmp_path / "sink"), compact_at_files=8
    )
    rng = random.Random(4)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    times = sorted(
        {t0 + timedelta(seconds=rng.choice([rng.uniform(0, 3 * 86400), rng.uniform(0, 30)]))
         for _ in range(60)}
    )  # fmt: skip
    for i, at in enumerate(rng.sample(times, len(times))):
        store.decisions.record("stream", f"d{i}", {}, at=at)
    newest_first = times[::-1]
    for limit, offset in [(1, 0), (5, 0), (10, 20), (59, 0), (60, 0), (70, 3)]:
        got = [d.at for d in store.decisions.list(limit=limit, offset=offset)]
        assert got == newest_first[offset : offset + limit], (limit, offset)
    until = newest_first[30]
    assert [d.at for d in store.decisions.list(limit=4, until=until)] == newest_first[30:34]


def test_max_event_times_read_every_commit_but_only_after_a_rewind(store: StateStore) -> None:
    def commit(epoch: int, sequence: int, times: dict[int, int]) -> None:
        end = {b: sequence + 1 for b in times}
        store.progress.record(
            sink_commit(epoch, sequence, {}, end, max_event_time_us=times), recorded_by="sink"
        )

    commit(1, 0, {0: 500, 1: 100})
    commit(1, 1, {0: 300, 2: 50})
    commit(2, 0, {1: 700})
    assert store.epochs.max_event_times() == {0: 500, 1: 700, 2: 50}
    # A rewind of bucket 0 after epoch 2: only commits after it count for bucket 0.
    command = store.commands.submit("rewind", {"offsets": {"0": 0}}, issuer="test")
    store.commands.apply(command, 2, {0: 0})
    assert store.epochs.max_event_times() == {1: 700, 2: 50}
    commit(3, 0, {0: 40})
    assert store.epochs.max_event_times() == {0: 40, 1: 700, 2: 50}


def test_recent_epochs_are_the_newest_and_those_that_ran_since(store: StateStore) -> None:
    first = store.epochs.open("batch", "one", {0: 0}, {0: 5})
    store.epochs.close(first, {0: 5}, reason="done")
    middle = pendulum.now("UTC")
    second = store.epochs.open("stream", "two", {0: 5})
    store.epochs.close(second, {0: 9}, reason="done")
    third = store.epochs.open("stream", "three", {0: 9})  # running: no end time

    assert [e.id for e in store.epochs.list()] == [first, second, third]
    assert [e.id for e in store.epochs.list(last=2)] == [second, third]
    assert [e.id for e in store.epochs.list(last=10)] == [first, second, third]
    assert [e.id for e in store.epochs.list(since=middle)] == [second, third]
    assert [e.id for e in store.epochs.list(since=pendulum.now("UTC"))] == [third]
    assert store.epochs.latest().id == third


def test_max_event_times_follow_new_commits_after_older_epochs_are_kept(
    store: StateStore,
) -> None:
    def commit(epoch: int, sequence: int, times: dict[int, int]) -> None:
        end = {b: 100 * epoch + sequence + 1 for b in times}
        store.progress.record(
            sink_commit(epoch, sequence, {}, end, max_event_time_us=times), recorded_by="sink"
        )

    for epoch in range(1, 6):
        commit(epoch, 0, {0: 10 * epoch, 1: 5})
    assert store.epochs.max_event_times() == {0: 50, 1: 5}
    commit(5, 1, {1: 70})
    commit(6, 0, {0: 60})
    assert store.epochs.max_event_times() == {0: 60, 1: 70}
    command = store.commands.submit("rewind", {"offsets": {"1": 0}}, issuer="test")
    store.commands.apply(command, 6, {1: 0})  # drops every commit of bucket 1 so far
    assert store.epochs.max_event_times() == {0: 60}
    # Another process reads the same.
    fresh = StateStore(store.tables.state_root, store.tables.sink_table_uri, store.tables.pipeline)
    assert fresh.epochs.max_event_times() == {0: 60}


def test_a_closed_epoch_keeps_its_max_event_times(store: StateStore) -> None:
    """Closing an epoch keeps its maxima with it: what the watermark reads of closed epochs
    comes from the epochs table, not from their progress rows."""
    first = store.epochs.open("stream", "live", {0: 0, 1: 0})
    for sequence, times in enumerate([{0: 10, 1: 30}, {0: 20}]):
        store.progress.record(
            sink_commit(first, sequence, {}, {0: sequence + 1, 1: 1}, max_event_time_us=times)
        )
    store.epochs.close(first, {0: 2, 1: 1})
    assert store.epochs.get(first).max_event_time_us == {0: 20, 1: 30}
    second = store.epochs.open("stream", "live", {0: 2, 1: 1})
    store.progress.record(sink_commit(second, 0, {0: 2}, {0: 3, 1: 1}, max_event_time_us={0: 25}))
    assert store.epochs.max_event_times() == {0: 25, 1: 30}
    # The closed epoch's rows are no longer read: gone from progress, nothing changes.
    from deltalake import DeltaTable

    DeltaTable(store.tables.uri("progress")).delete(f"epoch = {first}")
    assert store.epochs.max_event_times() == {0: 25, 1: 30}


def test_a_writer_compacts_only_the_tail_of_progress_and_decisions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer that takes progress or decisions to ``compact_at_files`` rewrites only the
    rows appended since the table's big files: its cost is the tail, not the table's age."""
    from deltalake import DeltaTable

    from modeswitch.state import tables

    store = warehouse_store(
        str(tmp_path / "wh"), PIPELINE, str(tmp_path / "sink"), compact_at_files=4
    )
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    store.progress.record_many([sink_commit(1, i, {0: i}, {0: i + 1}) for i in range(200)])
    for i in range(40):
        store.decisions.record("stream", f"d{i}", {"pad": "x" * 200}, at=t0 + timedelta(seconds=i))
    big = {}
    for name in TAIL_KEYS:  # the table so far, in one file bigger than any append
        store.tables.table(name).compact(at_files=2, whole=True)
        [big[name]] = DeltaTable(store.tables.uri(name)).file_uris()

    def big_is_not_small(name: str) -> None:
        actions = DeltaTable(store.tables.uri(name)).get_add_actions(flatten=True)
        monkeypatch.setattr(tables, "SMALL_FILE_BYTES", actions.column("size_bytes")[0].as_py())

    big_is_not_small("progress")
    for i in range(200, 204):  # epoch 2 for half of them: a tail that spans epochs
        store.progress.record(sink_commit(1 if i < 202 else 2, i, {0: i}, {0: i + 1}))
    big_is_not_small("decisions")
    for i in range(40, 44):
        store.decisions.record("stream", f"d{i}", {}, at=t0 + timedelta(seconds=i))

    for name in TAIL_KEYS:
        files = DeltaTable(store.tables.uri(name)).file_uris()
        # Compacted at the 4th file: the big one untouched, the 3 appends in one, then 1 more.
        assert big[name] in files and len(files) == 3, (name, files)
    keys = [(p.epoch, p.sequence) for p in store.progress.list()]
    assert keys == [(1, i) for i in range(202)] + [(2, 202), (2, 203)]
    assert [d.reason for d in store.decisions.list()] == [f"d{i}" for i in range(43, -1, -1)]


def test_commands_by_status_or_the_last_ones_read_like_all(store: StateStore) -> None:
    ids = [store.commands.submit("pause", {"note": str(i)}, issuer="t") for i in range(6)]
    store.commands.apply(ids[1], 1, {0: 0})
    store.commands.reject(ids[3], "no")
    everything = store.commands.list()

    for status in ("pending", "applied", "rejected"):
        assert store.commands.list(status) == [c for c in everything if c.status == status]
    assert store.commands.list(last=2) == everything[-2:]
    assert store.commands.list("pending", last=1) == [everything[-1]]
    assert store.commands.list(last=100) == everything
    assert store.commands.list("running") == []
