"""Incremental reconcile: reading the sink's log only above the mark ``progress`` carries
repairs exactly what a read of the whole log repairs, on random histories of commits, lost
state writes (a crash between the sink commit and the state write), stream jobs that move the
mark as they record, other pipelines' commits and compactions of the sink."""

from __future__ import annotations

import contextlib
import itertools
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from fault_tools import commit_to_sink
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from state_tools import warehouse_store
from test_state_reconcile import PIPELINE, Split, Wave

from modeswitch.sinks.commits import commits_after, sink_commits
from modeswitch.state import StateStore, reconcile

pytestmark = pytest.mark.unit

STEPS = st.lists(
    st.sampled_from(
        [
            "commit",  # the job commits and records it
            "commit",
            "commit-lost",  # the job commits and dies before its state write
            "reconcile",  # decide or close_epoch
            "new-epoch",
            "neighbour",  # another pipeline commits to the shared sink
            "compact",  # maintenance rewrites the sink's files (no pipeline commit)
        ]
    ),
    min_size=1,
    max_size=14,
)


@dataclass
class History:
    """One pipeline's history, played against real Delta tables the way its jobs write."""

    store: StateStore
    epoch: int = 0
    mode: str = "batch"
    end: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0})
    sequence: itertools.count = field(default_factory=itertools.count)
    following: int | None = None  # a stream job's supervisor: the version it has read to
    unrecorded: list = field(default_factory=list)

    def new_epoch(self) -> None:
        if self.epoch:
            self.store.epochs.close(self.epoch, self.end)
        self.mode = "stream" if self.mode == "batch" else "batch"
        boundary = {b: o + 20 for b, o in self.end.items()} if self.mode == "batch" else None
        self.epoch = self.store.epochs.open(self.mode, "test", self.end, boundary)  # type: ignore[arg-type]
        self.sequence = itertools.count()
        if self.mode == "batch":
            waves = [
                Wave(w, tuple(Split(b, o + 10 * w, o + 10 * w + 10) for b, o in self.end.items()))
                for w in range(2)
            ]
            self.store.ledger.record(self.epoch, waves)
        else:  # the stream job reconciles, then follows the log from the mark
            reconcile(self.store)
            self.following = self.store.progress.reconciled_through()

    def commit(self, *, lost: bool) -> None:
        start = dict(self.end)
        self.end = {b: o + 10 for b, o in start.items()}
        commit = commit_to_sink(
            self.store.tables.sink_table_uri, self.epoch, next(self.sequence), start, self.end,
            mode=self.mode,
        )  # fmt: skip
        if self.mode == "batch":
            if not lost:
                self.store.progress.record(commit, recorded_by="backlog_batch")
                pending = self.store.ledger.splits(self.epoch, "pending")
                done = [s for s in pending if s.end <= self.end[s.bucket]]
                self.store.ledger.mark(self.epoch, done, "committed")
            return
        # The supervisor reads the new commit files, then records them with its mark.
        found, self.following = commits_after(
            self.store.tables.sink_table_uri, PIPELINE, self.following
        )
        self.unrecorded += [c for c in found if c.epoch == self.epoch]
        if lost:  # the stream job dies; its rerun reconciles and follows from the mark
            self.unrecorded = []
            reconcile(self.store)
            self.following = self.store.progress.reconciled_through()
            return
        self.store.progress.record_many(
            self.unrecorded, recorded_by="stream", through=self.following
        )
        self.unrecorded = []


def play(root: Path, steps: list[str]) -> StateStore:
    store = warehouse_store(str(root / "warehouse"), PIPELINE, str(root / "sink"))
    history = History(store)
    history.new_epoch()
    for step in steps:
        if step in ("commit", "commit-lost"):
            history.commit(lost=step == "commit-lost")
        elif step == "reconcile":
            reconcile(store)
        elif step == "new-epoch":
            history.new_epoch()
        elif step == "neighbour":
            commit_to_sink(store.tables.sink_table_uri, 1, 0, {0: 0}, {0: 1}, pipeline="payments")
        elif step == "compact":
            with contextlib.suppress(TableNotFoundError):  # no sink yet: nothing to compact
                DeltaTable(store.tables.sink_table_uri).optimize.compact()
    return store


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=STEPS)
def test_incremental_reconcile_repairs_what_a_full_reconcile_would(steps: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = play(Path(tmp), steps)

        reconcile(store)

        # Nothing is left for a read of the whole log to repair...
        assert not reconcile(store, full=True).repaired
        # ... and the state holds every commit of the pipeline, once, with its splits.
        commits = [
            c for c in sink_commits(store.tables.sink_table_uri, PIPELINE) if not c.is_rewind
        ]
        in_sink = sorted((c.epoch, c.sequence) for c in commits)
        assert [(p.epoch, p.sequence) for p in store.progress.list()] == in_sink
        for epoch in store.epochs.list():
            ends = [c.end for c in commits if c.epoch == epoch.id]  # newest first
            for split in store.ledger.splits(epoch.id, "pending") if ends else ():
                assert split.end > ends[0][split.bucket]


def test_the_mark_bounds_what_reconcile_reads(tmp_path: Path) -> None:
    """After a reconcile, the next one reads only the log above the newest version."""
    store = play(tmp_path, ["commit"] * 3 + ["commit-lost"])
    reconcile(store)
    newest = DeltaTable(store.tables.sink_table_uri).version()
    assert store.progress.reconciled_through() == newest

    # The log below the mark is gone (as after log cleanup): reconcile does not need it.
    DeltaTable(store.tables.sink_table_uri).create_checkpoint()
    for path in (tmp_path / "sink" / "_delta_log").glob("*.json"):
        if int(path.stem) < newest:
            path.unlink()
    history_left = History(store, epoch=store.epochs.latest().id, mode="batch", end={0: 40, 1: 40})
    history_left.sequence = itertools.count(4)
    history_left.commit(lost=True)

    repaired = reconcile(store)

    assert repaired.progress == ((store.epochs.latest().id, 4),)
    assert store.progress.reconciled_through() == newest + 1
