"""The optimistic commit loop every Delta writer shares (modeswitch.storage.retry_commit_races)."""

from __future__ import annotations

import pytest
from deltalake.exceptions import CommitFailedError

from modeswitch.errors import ModeswitchError, StateConflictError
from modeswitch.storage import CommitRaceLost, retry_commit_races


def test_a_lost_race_is_checked_and_committed_again_until_it_lands() -> None:
    calls = []

    def attempt(number: int) -> str:
        calls.append(number)
        if number == 1:
            raise CommitFailedError("version 7 already exists")
        if number == 2:
            raise CommitRaceLost("another writer created the table first")
        return "landed"

    assert retry_commit_races(attempt, attempts=5, what="sink s", backoff=0.001) == "landed"
    assert calls == [1, 2, 3]


def test_after_the_last_lost_race_the_error_names_what_gave_up() -> None:
    def attempt(number: int) -> None:
        raise CommitFailedError(f"lost {number}")

    with pytest.raises(StateConflictError, match="epochs table: gave up after 3") as raised:
        retry_commit_races(
            attempt, attempts=3, what="epochs table", error=StateConflictError, backoff=0.001
        )
    assert str(raised.value.__cause__) == "lost 3"


def test_anything_but_a_lost_race_propagates_at_once() -> None:
    calls = []

    def attempt(number: int) -> None:
        calls.append(number)
        raise ModeswitchError("fenced: a zombie")

    with pytest.raises(ModeswitchError, match="fenced"):
        retry_commit_races(attempt, attempts=5, what="sink s", backoff=0.001)
    assert calls == [1]


def test_a_first_commit_that_finds_the_table_created_meanwhile_lost_a_race(tmp_path) -> None:
    """Two writers saw no table; the second's create fails on the first's table: a lost race
    (retried on the new table), told by the table being there, not by the error's words."""
    import pyarrow as pa

    from modeswitch.sinks.committer import _create_or_append

    uri = str(tmp_path / "sink")
    shape = {"schema": pa.schema([("a", pa.int64())]), "partition_by": None}
    _create_or_append(None, uri, [], **shape, storage_options={}, properties=None)
    with pytest.raises(CommitRaceLost, match=f"created the table {uri} first"):
        _create_or_append(None, uri, [], **shape, storage_options={}, properties=None)
