"""Rows another writer removed (a user's DELETE) are told from lost ones, read from the Delta
log with delta-rs as that writer: exact positions, and a loud problem once VACUUM has taken
the files that would say which rows went."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake

from modeswitch.ops.audit_counts import count_positions
from modeswitch.sinks.erasures import Erasure, erased_positions, read_erasures
from modeswitch.sinks.history import LogSummary, join_summaries


def _rows(bucket: int, lo: int, hi: int) -> pa.Table:
    offsets = list(range(lo, hi))
    return pa.table(
        {
            "bucket": pa.array([bucket] * len(offsets), pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
            "user_id": pa.array([o % 5 for o in offsets], pa.int64()),
        }
    )


def _ours(rows: pa.Table, uri: str) -> None:
    """A commit as the pipeline makes it: a ``modeswitch`` key in its commitInfo."""
    marker = CommitProperties(custom_metadata={"modeswitch": json.dumps({"pipeline": "p"})})
    write_deltalake(uri, rows, mode="append", commit_properties=marker)


@pytest.fixture
def table(tmp_path: Path) -> str:
    uri = str(tmp_path / "sink")
    _ours(_rows(0, 0, 50), uri)
    _ours(_rows(1, 0, 50), uri)
    _ours(_rows(0, 50, 100), uri)
    return uri


def test_a_delete_by_another_writer_is_read_as_the_positions_it_removed(table: str) -> None:
    DeltaTable(table).delete("user_id = 3")
    [erasure], problems = read_erasures("sink", table, after=-1)
    assert problems == []
    assert (erasure.table, erasure.version, erasure.operation) == ("sink", 3, "DELETE")
    assert {b: o.tolist() for b, o in erasure.offsets.items()} == {
        0: [o for o in range(100) if o % 5 == 3],
        1: [o for o in range(50) if o % 5 == 3],
    }
    assert erasure.records == 30


def test_updates_compactions_and_our_own_commits_erase_nothing(table: str) -> None:
    DeltaTable(table).update(predicate="user_id = 2", updates={"user_id": "7"})  # version 3
    _ours(_rows(1, 50, 60), table)  # version 4
    assert DeltaTable(table).optimize.compact()["numFilesRemoved"] == 2  # version 5
    assert read_erasures("sink", table, after=-1) == ([], [])
    # A compaction changes no data: its removed files are not even read (gone is fine).
    DeltaTable(table).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert read_erasures("sink", table, after=4) == ([], [])


def test_only_versions_above_after_and_up_to_through_are_read(table: str) -> None:
    DeltaTable(table).delete("user_id = 3")  # version 3
    DeltaTable(table).delete("user_id = 4")  # version 4
    assert [e.version for e in read_erasures("sink", table, after=3)[0]] == [4]
    assert [e.version for e in read_erasures("sink", table, after=-1, through=3)[0]] == [3]


def test_an_erasure_whose_files_were_vacuumed_is_a_problem_naming_it(table: str) -> None:
    DeltaTable(table).delete("user_id = 3")
    DeltaTable(table).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    erasures, [problem] = read_erasures("sink", table, after=-1)
    assert erasures == []
    assert problem.startswith("sink version 3 (DELETE) removed files that are gone")
    assert "cannot be told from lost ones" in problem


def test_erased_offsets_count_as_erased_not_missing() -> None:
    erased = {0: np.array([2, 3, 7, 20], np.int64)}  # 20: outside the range
    sink = (np.array([0, 0, 0, 0, 0, 0, 0], np.int64), np.array([0, 1, 4, 5, 6, 8, 9], np.int64))
    empty = (np.empty(0, np.int64), np.empty(0, np.int64))
    [row] = count_positions(sink, empty, starts={0: 0}, committed={0: 10}, erased=erased)
    assert (row.expected, row.erased, row.missing) == (10, 3, 0)
    assert row.ok
    # A lost record beside an erasure is still missing, and its range names it alone.
    lost = (sink[0][1:], sink[1][1:])
    [row] = count_positions(lost, empty, starts={0: 0}, committed={0: 10}, erased=erased)
    assert (row.erased, row.missing, row.missing_ranges) == (3, 1, ((0, 1),))
    # An erased offset that is back (a rewind reprocessed it) is present, not erased.
    back = (np.zeros(8, np.int64), np.array([0, 1, 2, 4, 5, 6, 8, 9], np.int64))
    [row] = count_positions(back, empty, starts={0: 0}, committed={0: 10}, erased=erased)
    assert (row.erased, row.missing) == (2, 0)


def test_erasures_travel_in_log_summaries_as_ranges() -> None:
    erasure = Erasure("sink", 4, "DELETE", 1_000, {0: np.array([1, 2, 3, 9], np.int64)})
    assert erasure.to_dict()["ranges"] == {"0": [[1, 4], [9, 10]]}
    first = LogSummary(after=-1, through=5, erasures=(erasure.to_dict(),), quarantine_through=2)
    later = Erasure("quarantine", 3, "DELETE", None, {1: np.array([5], np.int64)})
    second = LogSummary(after=5, through=9, erasures=(later.to_dict(),), quarantine_through=3)
    joined, problems = join_summaries(
        [LogSummary.from_dict(json.loads(json.dumps(s.to_dict()))) for s in (second, first)]
    )
    assert problems == []
    assert joined is not None and joined.quarantine_through == 3
    merged = erased_positions(joined.erasure_list())
    assert {b: o.tolist() for b, o in merged.items()} == {0: [1, 2, 3, 9], 1: [5]}
    old = first.to_dict()
    del old["erasures"], old["quarantine_through"]  # kept before erasures were read
    assert LogSummary.from_dict(old).erasures == ()
