"""Reconcile: after a crash between a sink commit and the state write, the control tables are
repaired from the sink's Delta log, and a second reconcile finds nothing left to repair."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from fault_tools import commit_to_sink
from state_tools import warehouse_store

from modeswitch.state import StateStore, reconcile

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


PLAN = [
    Wave(0, (Split(0, 0, 50), Split(1, 0, 30))),
    Wave(1, (Split(0, 50, 100), Split(1, 30, 60))),
]


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    return warehouse_store(str(tmp_path / "warehouse"), PIPELINE, str(tmp_path / "sink"))


def test_reconcile_repairs_a_crash_between_sink_commit_and_state_write(
    store: StateStore,
) -> None:
    epoch = store.epochs.open("batch", "backlog", {0: 0, 1: 0}, {0: 100, 1: 60})
    store.ledger.record(epoch, PLAN)

    # Wave 0: the sink commits, then the writer records progress and its splits.
    first = commit_to_sink(store.tables.sink_table_uri, epoch, 0, {0: 0, 1: 0}, {0: 50, 1: 30})
    store.progress.record(first)
    store.ledger.mark(epoch, PLAN[0].splits, "committed")
    # Wave 1: the sink commits, and the writer dies before writing any state.
    second = commit_to_sink(store.tables.sink_table_uri, epoch, 1, {0: 50, 1: 30}, {0: 100, 1: 60})

    assert [p.sequence for p in store.progress.list()] == [0]
    assert len(store.ledger.splits(epoch, "pending")) == 2

    repaired = reconcile(store)

    assert repaired.repaired
    assert repaired.progress == ((epoch, 1),)
    assert sorted(s.key for s in repaired.splits) == [(0, 50, 100), (1, 30, 60)]
    assert {s.status for s in repaired.splits} == {"committed"}

    rows = store.progress.list()
    assert [(p.epoch, p.sequence, p.recorded_by) for p in rows] == [
        (epoch, 0, "sink"),
        (epoch, 1, "reconcile"),
    ]
    recovered = rows[1]
    assert (recovered.start, recovered.end, recovered.records) == (
        {0: 50, 1: 30},
        {0: 100, 1: 60},
        80,
    )
    assert recovered.sink_version == second.table_version
    assert recovered.max_event_time_us == second.max_event_time_us
    assert recovered.committed_at is not None
    assert recovered.watermark is None
    assert store.ledger.splits(epoch, "pending") == []
    assert {s.status for s in store.ledger.splits(epoch)} == {"committed"}
    assert store.progress.committed_offsets() == {0: 100, 1: 60}

    again = reconcile(store)
    assert not again.repaired
    assert len(store.progress.list()) == 2


def test_reconcile_fills_gaps_and_ignores_other_pipelines(store: StateStore) -> None:
    epoch = store.epochs.open("stream", "live", {0: 0})
    commits = [
        commit_to_sink(store.tables.sink_table_uri, epoch, seq, {0: 10 * seq}, {0: 10 * seq + 10})
        for seq in range(4)
    ]
    # A neighbour pipeline shares the sink table; its commits are none of our business.
    commit_to_sink(store.tables.sink_table_uri, 9, 0, {0: 0}, {0: 5}, pipeline="payments")
    # Micro-batch 1 lost its state write, but later ones were recorded: a gap, not a tail.
    for commit in (commits[0], commits[2], commits[3]):
        store.progress.record(commit)

    repaired = reconcile(store)

    assert repaired.progress == ((epoch, 1),)
    assert repaired.splits == ()
    assert [(p.epoch, p.sequence) for p in store.progress.list()] == [(epoch, s) for s in range(4)]
    assert not reconcile(store).repaired


def test_reconcile_marks_splits_when_only_the_ledger_write_was_lost(store: StateStore) -> None:
    epoch = store.epochs.open("batch", "backlog", {0: 0, 1: 0}, {0: 100, 1: 60})
    store.ledger.record(epoch, PLAN)
    first = commit_to_sink(store.tables.sink_table_uri, epoch, 0, {0: 0, 1: 0}, {0: 50, 1: 30})
    store.progress.record(first)  # ... and the writer dies before marking its splits

    repaired = reconcile(store)

    assert repaired.progress == ()
    assert sorted(s.key for s in repaired.splits) == [(0, 0, 50), (1, 0, 30)]
    assert sorted(s.key for s in store.ledger.splits(epoch, "pending")) == [
        (0, 50, 100),
        (1, 30, 60),
    ]


def test_reconcile_of_an_empty_or_missing_sink_repairs_nothing(store: StateStore) -> None:
    epoch = store.epochs.open("batch", "backlog", {0: 0}, {0: 10})
    store.ledger.record(epoch, [Wave(0, (Split(0, 0, 10),))])

    assert not reconcile(store).repaired
    assert len(store.ledger.splits(epoch, "pending")) == 1
