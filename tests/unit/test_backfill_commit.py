"""A backfill's replace-where commit beside concurrent writers (modeswitch.modes.backfill_job):
a commit that loses its race is checked again on the new snapshot and lands once; a later run
of the same window that committed meanwhile fences it out. deltalake only, no Spark."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction

from modeswitch.errors import FencedError
from modeswitch.modes.backfill import BackfillPlan, Window, backfill_app_id
from modeswitch.modes.backfill_commits import BackfillCommit, backfill_commits
from modeswitch.modes.backfill_job import _replace

WRITE = deltalake.write_deltalake  # the rivals' own writes, not the patched one
T0 = datetime(2026, 11, 20, tzinfo=UTC)
PLAN = BackfillPlan(
    pipeline="p",
    command=3,
    run_id="r3",
    mode="reprocess",
    window=Window(T0, T0 + timedelta(hours=1)),
    ranges={0: (0, 10)},
)
COMMIT = BackfillCommit(
    pipeline=PLAN.pipeline,
    command=PLAN.command,
    run_id=PLAN.run_id,
    mode=PLAN.mode,
    window=PLAN.window,
    ranges=PLAN.ranges,
    records=4,
    quarantined=0,
)


def _rows(offsets: list[int], hours: list[float], value: str) -> pa.Table:
    return pa.table(
        {
            "bucket": pa.array([0] * len(offsets), pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
            "event_time": pa.array(
                [T0 + timedelta(hours=h) for h in hours], pa.timestamp("us", "UTC")
            ),
            "value": pa.array([value] * len(offsets)),
        }
    )


@pytest.fixture
def sink(tmp_path: Path) -> str:
    """A sink holding the window's first three records as first processed, and two live
    records five hours later."""
    uri = str(tmp_path / "sink")
    WRITE(uri, _rows([0, 1, 2], [0.1, 0.2, 0.3], "old"))
    WRITE(uri, _rows([100, 101], [5, 5.1], "live"), mode="append")
    return uri


def _racing(monkeypatch: pytest.MonkeyPatch, rival: Any) -> list[str]:
    """Make ``rival()`` commit between the backfill's check of its snapshot and its first
    commit; returns the modes of the backfill's write attempts."""
    attempts: list[str] = []

    def write(table: Any, data: Any, **kwargs: Any) -> None:
        attempts.append(kwargs["mode"])
        if len(attempts) == 1:
            rival()
        WRITE(table, data, **kwargs)

    monkeypatch.setattr(deltalake, "write_deltalake", write)
    return attempts


def _backfill_rows() -> pa.RecordBatchReader:
    return _rows([0, 1, 2, 3], [0.1, 0.2, 0.3, 0.4], "backfilled").to_reader()


def _values(uri: str) -> list[tuple[int, str]]:
    table = DeltaTable(uri).to_pyarrow_table().sort_by("offset")
    return list(zip(table["offset"].to_pylist(), table["value"].to_pylist(), strict=True))


def test_a_replace_that_loses_its_race_is_made_again_on_the_new_snapshot_and_lands_once(
    sink, monkeypatch
) -> None:
    def live_late_record() -> None:  # the live sink appends a late record of the window
        WRITE(sink, _rows([3], [0.4], "live"), mode="append")

    attempts = _racing(monkeypatch, live_late_record)
    version = _replace(sink, _backfill_rows, PLAN, COMMIT, {}, create=False)

    assert attempts == ["overwrite", "overwrite"]  # refused on the stale snapshot, then again
    assert version == DeltaTable(sink).version() == 3
    assert _values(sink) == [
        (0, "backfilled"),
        (1, "backfilled"),
        (2, "backfilled"),
        (3, "backfilled"),
        (100, "live"),
        (101, "live"),
    ]
    assert [c.command for c in backfill_commits(sink, "p")] == [3]
    assert DeltaTable(sink).transaction_version(backfill_app_id("p", PLAN.window)) == 3


def test_a_later_run_of_the_window_committing_meanwhile_fences_the_retry_out(
    sink, monkeypatch
) -> None:
    def later_run() -> None:
        WRITE(
            sink,
            _rows([0, 1, 2], [0.1, 0.2, 0.3], "later run"),
            mode="overwrite",
            predicate=PLAN.predicate(),
            commit_properties=CommitProperties(
                app_transactions=[Transaction(backfill_app_id("p", PLAN.window), 4)]
            ),
        )

    _racing(monkeypatch, later_run)
    with pytest.raises(FencedError, match=r"a later run of window .* \(command 4\) has committed"):
        _replace(sink, _backfill_rows, PLAN, COMMIT, {}, create=False)
    assert [value for _, value in _values(sink)] == ["later run"] * 3 + ["live"] * 2


def test_a_missing_table_is_created_only_when_asked(tmp_path) -> None:
    uri = str(tmp_path / "quarantine")
    assert _replace(uri, _backfill_rows, PLAN, COMMIT, {}, create=False) is None
    assert _replace(uri, _backfill_rows, PLAN, COMMIT, {}, create=True) == 0
    assert [c.command for c in backfill_commits(uri, "p")] == [3]


def test_a_backfill_commit_says_its_window_in_user_metadata(sink: str) -> None:
    version = _replace(sink, _backfill_rows, PLAN, COMMIT, {}, create=False)
    [info] = [c for c in DeltaTable(sink).history() if c["version"] == version]
    assert json.loads(info["userMetadata"]) == {
        "writer": "modeswitch",
        "pipeline": "p",
        "kind": "backfill",
        "command": 3,
        "mode": "reprocess",
        "window": ["2026-11-20T00:00:00+00:00", "2026-11-20T01:00:00+00:00"],
        "records": 4,
    }
