"""Which offsets a backfill window reads, and what its replace-where commit deletes
(modeswitch.modes.backfill): the log's time index bounds the read below, late records above it
are kept, empty buckets are left out, and the predicate names the window and the ranges."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from modeswitch.errors import BackfillRefusedError
from modeswitch.modes.backfill import Window, window_predicate, window_ranges
from modeswitch.modes.backfill_commits import BackfillCommit, backfilled_positions
from modeswitch.sources.segments import SegmentLog

T0 = datetime(2026, 11, 20, tzinfo=UTC)


def _append(log: SegmentLog, bucket: int, hours: list[float]) -> None:
    """One closed segment of records with these event times (hours after T0)."""
    times = [T0 + timedelta(hours=h) for h in hours]
    log.append(
        bucket,
        pa.table(
            {
                "event_time": pa.array(times, pa.timestamp("us", "UTC")),
                "key": pa.array([f"k{i}" for i in range(len(hours))]),
                "value": pa.array(["{}"] * len(hours)),
            }
        ),
        close=True,
    )


@pytest.fixture
def log(tmp_path: Path) -> SegmentLog:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=3)
    _append(log, 0, [0, 1, 2, 3])  # offsets 0-3
    _append(log, 0, [4, 5, 2.5, 6])  # offset 6: a late record of hour 2
    _append(log, 1, [0, 0.5])  # nothing from hour 2 on
    return log  # bucket 2 holds nothing


def test_a_window_reads_from_its_first_record_to_the_bound_for_late_records(log) -> None:
    window = Window(T0 + timedelta(hours=2), T0 + timedelta(hours=3))
    ranges = window_ranges(log, window, {0: 8, 1: 2, 2: 0})
    # Bucket 0 from offset 2 (hour 2) up to the bound, which holds the late record at 6;
    # bucket 1 has no record at or after hour 2, bucket 2 none at all: both left out.
    assert ranges == {0: (2, 8)}
    assert window_ranges(log, window, {0: 5}) == {0: (2, 5)}  # the bound caps the read
    assert window_ranges(log, window, {0: 8}, buckets=[1]) == {}
    assert window_ranges(log, window, {0: 8}, indexed=False) == {0: (0, 8)}


def test_a_window_below_retention_starts_at_the_earliest_retained_offset(log) -> None:
    log.drop_before({0: 4})
    window = Window(T0, T0 + timedelta(hours=3))
    assert window_ranges(log, window, {0: 8}) == {0: (4, 8)}


def test_the_predicate_is_the_window_within_each_range() -> None:
    window = Window(T0, T0 + timedelta(days=1))
    assert window_predicate(window, {1: (5, 9), 0: (0, 3)}) == (
        "event_time >= '2026-11-20T00:00:00.000000Z' AND event_time < "
        '\'2026-11-21T00:00:00.000000Z\' AND ((bucket = 0 AND "offset" >= 0 AND "offset" < 3)'
        ' OR (bucket = 1 AND "offset" >= 5 AND "offset" < 9))'
    )
    assert window_predicate(window, {}) == "false"


def test_windows_are_parsed_and_checked() -> None:
    window = Window.parse("2026-11-19T23:00:00-01:00", "2026-11-20T02:00:00+01:00")
    assert (window.start, window.end) == (T0, T0 + timedelta(hours=1))
    assert not window.overlaps(Window(T0 + timedelta(hours=1), T0 + timedelta(hours=2)))
    with pytest.raises(BackfillRefusedError, match="start is not before the end"):
        Window.parse("2026-11-20T02:00:00Z", "2026-11-20T01:00:00Z")
    with pytest.raises(BackfillRefusedError, match="window end 'soon'"):
        Window.parse("2026-11-20T00:00:00Z", "soon")


def _filled(window: Window, ranges: dict[int, tuple[int, int]]) -> BackfillCommit:
    return BackfillCommit(
        pipeline="p",
        command=1,
        run_id="r",
        mode="fill",
        window=window,
        ranges=ranges,
        records=0,
        quarantined=0,
    )


def test_verify_expects_each_filled_window_s_records_below_the_live_start(log) -> None:
    hour = timedelta(hours=1)
    second, first = Window(T0 + 2 * hour, T0 + 3 * hour), Window(T0, T0 + hour)
    commits = [_filled(second, {0: (2, 8)}), _filled(first, {0: (0, 8), 1: (0, 2)})]
    found = backfilled_positions(log, commits, below={0: 5, 1: 2})
    # Bucket 0 below its live start 5: hour 0 at offset 0, hour 2 at offset 2 (the late
    # record of hour 2, at offset 6, is the live pipeline's).
    assert {b: o.tolist() for b, o in found.items()} == {0: [0, 2], 1: [0, 1]}
    # Overlapping windows (another schedule) are matched window by window.
    wider = _filled(Window(T0 + 2 * hour, T0 + 5 * hour), {0: (2, 8)})
    found = backfilled_positions(log, [*commits, wider], below={0: 8, 1: 2})
    assert found[0].tolist() == [0, 2, 3, 4, 6]
