"""Backfills of a pipeline whose event time is a payload field (``event_time_field``): a
window of the payload's times is replaced or filled exactly, though the log's time index says
nothing of where those records sit, and a run that would lose or double records because the
tables' rows got their event time by another rule is refused with nothing written
(modeswitch.modes.backfill, modeswitch.modes.backfill_job)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pendulum
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import BackfillRefusedError
from modeswitch.modes.backfill import Window, plan_backfill
from modeswitch.modes.backfill_commits import backfill_commits
from modeswitch.modes.backfill_job import run_backfill
from modeswitch.modes.batch import run_batch_epoch
from modeswitch.modes.job import resolve_job
from modeswitch.modes.stream import run_stream_epoch
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.sinks.commits import event_time_from_micros
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore

pytestmark = pytest.mark.spark

HISTORY_END = pendulum.now("UTC").start_of("hour").subtract(hours=1)
START = HISTORY_END.subtract(hours=6)
PER_BUCKET = 600
BUCKETS = 3
VALUE_SCHEMA = "id BIGINT NOT NULL, at TIMESTAMP, note STRING"
WINDOW = Window.parse(HISTORY_END.subtract(hours=4), HISTORY_END.subtract(hours=2))
SHIFTS = (timedelta(hours=-3), timedelta(hours=-1), timedelta(0), timedelta(hours=1))
"""How far a record's payload time is from its log timestamp, by its id: records of the
window sit hours before and after the window's stretch of the log."""


def log_time(i: int) -> datetime:
    return START + timedelta(seconds=i * 6 * 3600 // (PER_BUCKET * BUCKETS))


def payload(i: int) -> tuple[str, datetime]:
    """Record ``i``'s value and its event time (the payload's, or the log's without one)."""
    at = min(log_time(i) + SHIFTS[i % 4], HISTORY_END)
    body = {"id": i, "at": at.isoformat(), "note": f"n{i % 5}"}
    if i % 10 == 3:
        del body["at"]  # no event time: the log's timestamp
        at = log_time(i)
    if i % 37 == 5:
        del body["id"]  # quarantined, with its payload's time
    if i % 50 == 7:
        return "{cut", log_time(i)  # not JSON: quarantined, with the log's time
    return json.dumps(body), at


def make_log(root: Path, ids: range) -> dict[int, datetime]:
    """The records ``ids`` appended round-robin over the buckets; their event times by id."""
    log = SegmentLog.create(str(root), buckets=BUCKETS) if not root.exists() else SegmentLog(root)
    times = {}
    for bucket in range(BUCKETS):
        mine = [i for i in ids if i % BUCKETS == bucket]
        values = []
        for i in mine:
            value, times[i] = payload(i)
            values.append(value)
        log.append(
            bucket,
            pa.table(
                {
                    "event_time": pa.array(
                        [log_time(i) for i in mine], pa.timestamp("us", tz="UTC")
                    ),
                    "key": [str(i) for i in mine],
                    "value": values,
                }
            ),
        )
    return times


def settings_of(root: Path, **extra: str) -> PipelineSettings:
    return PipelineSettings.from_mapping(
        {
            "pipeline": "payload-time",
            "source": str(root / "log"),
            "warehouse": str(root / "wh"),
            "value_schema": VALUE_SCHEMA,
            "event_time_field": "at",
            "watermark_lag_threshold": "1h",
            "enter_threshold": "1h",
            "exit_threshold": "1h",
            **extra,
        }
    )


def drain(spark, settings: PipelineSettings) -> None:
    plan = decide(settings, force_mode="batch")
    run_batch_epoch(spark, resolve_job(settings, "batch"), plan.epoch)
    assert close_epoch(settings, plan.epoch)[0] == "completed"


def rows(settings: PipelineSettings) -> list[tuple]:
    """Both tables' rows: (table, bucket, offset, event_time, key)."""
    out = []
    for name, uri in (("sink", settings.sink), ("quarantine", settings.quarantine)):
        table = DeltaTable(uri).to_pyarrow_table(columns=["bucket", "offset", "event_time", "key"])
        out += [(name, *row.values()) for row in table.to_pylist()]
    return sorted(out)


def assert_exact(settings: PipelineSettings, expected: int) -> None:
    report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
    totals = report.totals
    assert (totals.missing, totals.duplicated, totals.out_of_range) == (0, 0, 0), report
    assert not report.problems, report.problems
    assert totals.expected == expected


def in_window(times: dict[int, datetime]) -> int:
    return sum(WINDOW.start <= t < WINDOW.end for t in times.values())


def test_reprocess_of_a_window_of_payload_times_replaces_each_of_its_records_once(
    spark, tmp_path: Path
) -> None:
    settings = settings_of(tmp_path)
    times = make_log(tmp_path / "log", range(PER_BUCKET * BUCKETS))
    drain(spark, settings)
    before = rows(settings)
    by_key = {key: moment for *_, moment, key in before}
    assert by_key == {str(i): t for i, t in times.items()}  # the sink's event time, per record
    expected = in_window(times)
    log_times = sum(WINDOW.start <= log_time(i) < WINDOW.end for i in times)
    assert expected > 0 and expected != log_times  # the log's times would pick others

    plan = plan_backfill(settings, WINDOW, "reprocess", run_id="r1", issuer="test")
    assert {lo for lo, _ in plan.ranges.values()} == {0}  # not bounded by the log's index
    report = run_backfill(spark, resolve_job(settings, "backfill"), plan.command)
    assert_exact(settings, PER_BUCKET * BUCKETS)  # none lost, none twice
    assert rows(settings) == before
    assert report.records + report.quarantined == expected
    (commit,) = backfill_commits(settings.sink, settings.pipeline)
    assert commit.event_time is not None and commit.event_time.field == "at"


def test_fill_loads_a_window_of_payload_times_below_a_live_start_once(
    spark, tmp_path: Path
) -> None:
    settings = settings_of(tmp_path, start_from="latest", stream_trigger="available_now")
    history = make_log(tmp_path / "log", range(PER_BUCKET * BUCKETS))
    live = decide(settings, force_mode="stream")
    recent = make_log(tmp_path / "log", range(PER_BUCKET * BUCKETS, PER_BUCKET * BUCKETS + 300))
    run_stream_epoch(spark, resolve_job(settings, "stream"), live.epoch)
    close_epoch(settings, live.epoch)
    assert_exact(settings, 300)
    # The stream's commits record the payload's times, which the watermark is taken from.
    latest = {b: max(t for i, t in recent.items() if i % BUCKETS == b) for b in range(BUCKETS)}
    recorded = StateStore.from_settings(settings).epochs.max_event_times()
    assert {b: event_time_from_micros(us) for b, us in recorded.items()} == latest
    assert latest != {b: max(log_time(i) for i in recent if i % BUCKETS == b) for b in latest}

    plan = plan_backfill(settings, WINDOW, "fill", run_id="f1", issuer="test")
    report = run_backfill(spark, resolve_job(settings, "backfill"), plan.command)
    assert report.records + report.quarantined == in_window(history)
    # The audit matches the filled records to the window by the payload's time too.
    assert_exact(settings, 300 + in_window(history))
    later = Window.parse(WINDOW.end, HISTORY_END.add(minutes=1))
    plan = plan_backfill(settings, later, "fill", run_id="f2", issuer="test")
    run_backfill(spark, resolve_job(settings, "backfill"), plan.command)
    after = sum(later.start <= t < later.end for t in history.values())
    assert_exact(settings, 300 + in_window(history) + after)


@pytest.mark.parametrize(("written_with", "backfilled_with"), [("", "at"), ("at", "")])
def test_a_backfill_across_a_change_of_event_time_field_is_refused_nothing_lost(
    spark, tmp_path: Path, written_with: str, backfilled_with: str
) -> None:
    written = settings_of(tmp_path, event_time_field=written_with)
    make_log(tmp_path / "log", range(PER_BUCKET * BUCKETS))
    drain(spark, written)
    before = rows(written)
    version = DeltaTable(written.sink).version()
    changed = settings_of(tmp_path, event_time_field=backfilled_with)
    plan = plan_backfill(changed, WINDOW, "reprocess", run_id="changed", issuer="test")
    with pytest.raises(BackfillRefusedError, match=r"nothing written: it would delete \d+ rec"):
        run_backfill(spark, resolve_job(changed, "backfill"), plan.command)
    assert DeltaTable(written.sink).version() == version
    assert rows(written) == before
    assert_exact(written, PER_BUCKET * BUCKETS)


def test_a_run_planned_under_another_event_time_field_is_refused(spark, tmp_path: Path) -> None:
    settings = settings_of(tmp_path)
    make_log(tmp_path / "log", range(300))
    drain(spark, settings)
    plan = plan_backfill(settings, WINDOW, "reprocess", run_id="p", issuer="test")
    cleared = settings_of(tmp_path, event_time_field="")
    with pytest.raises(BackfillRefusedError, match=r"event_time_field changed between the plan"):
        run_backfill(spark, resolve_job(cleared, "backfill"), plan.command)
