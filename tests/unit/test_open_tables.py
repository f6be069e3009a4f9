"""Delta tables kept open per thread (:func:`modeswitch.storage.open_delta_table`): as current
as a fresh load, one object per thread, and a table deleted or made again under an open
snapshot loaded afresh. Real Delta tables on the local filesystem."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from modeswitch import storage
from modeswitch.storage import open_delta_table


def append(path: Path, *values: int) -> None:
    write_deltalake(str(path), pa.table({"a": list(values)}), mode="append")


def rows(table: DeltaTable) -> list[int]:
    return sorted(table.to_pyarrow_table()["a"].to_pylist())


def test_a_table_opened_again_in_a_thread_is_the_same_object_with_what_others_committed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t"
    assert open_delta_table(str(path), {}) is None  # no table yet
    append(path, 1)
    first = open_delta_table(str(path), {})
    append(path, 2)  # another writer's commit
    again = open_delta_table(str(path), {})
    assert again is first
    assert again.version() == 1 and rows(again) == [1, 2]


def test_a_local_table_with_no_entry_since_is_not_listed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``update_incremental`` lists the table's log; a local table whose next entry's file is
    not there is as current as it gets without it."""
    path = tmp_path / "t"
    append(path, 1)
    table = open_delta_table(str(path), {})
    updates: list[int] = []
    real = DeltaTable.update_incremental
    monkeypatch.setattr(
        DeltaTable, "update_incremental", lambda self: updates.append(1) or real(self)
    )
    assert open_delta_table(str(path), {}) is table and updates == []
    append(path, 2)
    assert open_delta_table(str(path), {}) is table and updates == [1]
    assert rows(table) == [1, 2]


def test_each_thread_opens_its_own_table(tmp_path: Path) -> None:
    path = tmp_path / "t"
    append(path, 1)
    mine = open_delta_table(str(path), {})
    theirs: list[DeltaTable] = []
    thread = threading.Thread(target=lambda: theirs.append(open_delta_table(str(path), {})))
    thread.start()
    thread.join()
    assert theirs[0] is not mine and theirs[0].version() == mine.version()


def test_a_commit_made_through_the_open_table_is_kept_open(tmp_path: Path) -> None:
    path = tmp_path / "t"
    append(path, 1)
    table = open_delta_table(str(path), {})
    write_deltalake(table, pa.table({"a": [2]}), mode="append")
    assert open_delta_table(str(path), {}) is table
    assert rows(table) == [1, 2]


@pytest.mark.parametrize("made_again", [0, 1, 4], ids=["deleted", "fewer", "more"])
def test_a_table_deleted_or_made_again_under_an_open_snapshot_is_loaded_afresh(
    tmp_path: Path, made_again: int
) -> None:
    """delta-rs's ``update_incremental`` keeps a deleted table's snapshot, and mixes a table
    made again at the same path with the old one: the log entry's file tells them apart."""
    path = tmp_path / "t"
    for value in (1, 2, 3):
        append(path, value)
    held = open_delta_table(str(path), {})
    assert held.version() == 2
    shutil.rmtree(path)
    for value in range(made_again):
        append(path, 10 + value)
    opened = open_delta_table(str(path), {})
    if not made_again:
        assert opened is None
        return
    assert opened is not held
    assert rows(opened) == [10 + v for v in range(made_again)]
    assert opened.version() == made_again - 1


def test_a_thread_keeps_at_most_so_many_tables_the_least_recently_used_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "OPEN_TABLES_KEPT", 2)
    paths = [tmp_path / name for name in "abc"]
    for path in paths:
        append(path, 1)
    a, b = (open_delta_table(str(p), {}) for p in paths[:2])
    assert open_delta_table(str(paths[0]), {}) is a  # a is now the most recently used
    open_delta_table(str(paths[2]), {})  # b is dropped
    assert open_delta_table(str(paths[0]), {}) is a
    assert open_delta_table(str(paths[1]), {}) is not b
