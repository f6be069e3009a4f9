"""A backfill of a pipeline whose event time is a payload field, without Spark
(modeswitch.modes.backfill): the rule each plan and commit records, and the audit's matching
of filled records to windows by the payload's time (the Spark runs are in
tests/spark/test_event_time_backfill.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.modes.backfill import PayloadEventTime, Window
from modeswitch.modes.backfill_commits import BackfillCommit, backfilled_positions
from modeswitch.sinks.history import BACKFILL_KEY
from modeswitch.sources.segments import SegmentLog

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 20, tzinfo=UTC)
HOUR = timedelta(hours=1)


def test_the_rule_is_the_settings_and_travels_with_each_commit() -> None:
    assert PayloadEventTime.of(PipelineSettings()) is None
    assert PayloadEventTime.of(PipelineSettings(value_schema="at TIMESTAMP")) is None
    timed = PipelineSettings(value_schema="id BIGINT, At TIMESTAMP", event_time_field="at")
    assert PayloadEventTime.of(timed) == PayloadEventTime("At", "timestamp")
    millis = PipelineSettings(value_schema="ms BIGINT NOT NULL", event_time_field="ms")
    rule = PayloadEventTime.of(millis)
    assert rule == PayloadEventTime("ms", "long")
    commit = BackfillCommit(
        pipeline="p",
        command=3,
        run_id="r",
        mode="fill",
        window=Window(T0, T0 + HOUR),
        ranges={0: (0, 9)},
        records=4,
        quarantined=1,
        event_time=rule,
    )
    assert BackfillCommit.from_commit_info(commit.to_metadata()) == commit
    plain = BackfillCommit(**{**commit.__dict__, "event_time": None})
    assert "event_time" not in plain.to_metadata()[BACKFILL_KEY]
    assert BackfillCommit.from_commit_info(plain.to_metadata()) == plain


def test_verify_matches_filled_records_to_windows_by_the_rule_each_fill_recorded(
    tmp_path: Path,
) -> None:
    """Log timestamps in hour 0; payload times in hours 0 to 3, or none."""
    log = SegmentLog.create(str(tmp_path / "log"), buckets=1)
    payload_hours = [3, 1, None, 2, 0, 1]
    values = [
        json.dumps({"at": (T0 + h * HOUR).isoformat()} if h is not None else {})
        for h in payload_hours
    ]
    log.append(
        0,
        pa.table(
            {
                "event_time": pa.array(
                    [T0 + timedelta(minutes=i) for i in range(6)], pa.timestamp("us", "UTC")
                ),
                "key": pa.array([str(i) for i in range(6)]),
                "value": pa.array(values),
            }
        ),
    )
    rule = PayloadEventTime("at", "timestamp")

    def filled(start: int, end: int, event_time: PayloadEventTime | None) -> BackfillCommit:
        window = Window(T0 + start * HOUR, T0 + end * HOUR)
        return BackfillCommit("p", 1, "r", "fill", window, {0: (0, 6)}, 0, 0, event_time=event_time)

    def found(*commits: BackfillCommit) -> list[int]:
        return backfilled_positions(log, commits, below={0: 6}).get(0, []).tolist()

    assert found(filled(1, 2, rule)) == [1, 5]
    assert found(filled(0, 1, rule)) == [2, 4]  # offset 2 holds no time: the log's
    assert found(filled(0, 1, rule), filled(2, 4, rule)) == [0, 2, 3, 4]
    # A fill recorded without a rule went by the log's timestamps: all of hour 0.
    by_log = BackfillCommit("p", 1, "r", "fill", Window(T0, T0 + HOUR), {0: (0, 6)}, 0, 0)
    assert found(by_log) == [0, 1, 2, 3, 4, 5]
    assert found(by_log, filled(1, 2, rule)) == [0, 1, 2, 3, 4, 5]
