"""Backfill runs on the shared Spark session: a reprocessed window is replaced once, a filled
window below a live pipeline's start is loaded once, and bad runs are refused before anything
is written (modeswitch.modes.backfill)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pendulum
import pytest
from deltalake import DeltaTable
from fault_tools import records_in_window

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import BackfillRefusedError
from modeswitch.modes.backfill import Window, plan_backfill
from modeswitch.modes.backfill_commits import backfill_commits
from modeswitch.modes.backfill_job import run_backfill
from modeswitch.modes.batch import run_batch_epoch
from modeswitch.modes.job import resolve_job
from modeswitch.modes.stream import run_stream_epoch
from modeswitch.ops.status import pipeline_status
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore
from modeswitch.transforms.payload import EVENT_VALUE_SCHEMA

pytestmark = pytest.mark.spark

HISTORY_END = pendulum.now("UTC").start_of("hour").subtract(hours=1)
GENERATOR = EventGenerator(
    seed=7, buckets=3, late_fraction=0.05, malformed_fraction=0.01, max_lateness=timedelta(hours=2)
)


def _settings(tmp_path: Path, **extra: str) -> PipelineSettings:
    return PipelineSettings.from_mapping(
        {
            "pipeline": "bf",
            "value_schema": EVENT_VALUE_SCHEMA,  # the demo's events, parsed: some quarantined
            "source": str(tmp_path / "log"),
            "warehouse": str(tmp_path / "warehouse"),
            "watermark_lag_threshold": "1h",
            "enter_threshold": "1h",
            "exit_threshold": "1h",
            **extra,
        }
    )


def _rows(settings: PipelineSettings) -> tuple[list[dict], list[dict]]:
    """The sink's and quarantine's rows, in position order."""
    out = []
    for uri in (settings.sink, settings.quarantine):
        table = DeltaTable(uri).to_pyarrow_table()
        out.append(table.sort_by([("bucket", "ascending"), ("offset", "ascending")]).to_pylist())
    return out[0], out[1]


def _in_window(settings: PipelineSettings, window: Window, below: dict[int, int]) -> int:
    return records_in_window(SegmentLog(settings.source), window.start, window.end, below)


def _assert_exact(settings: PipelineSettings, expected: int) -> None:
    report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
    totals = report.totals
    assert (totals.missing, totals.duplicated, totals.out_of_range) == (0, 0, 0), report
    assert not report.problems, report.problems
    assert totals.expected == expected


@pytest.fixture(scope="module")
def drained(spark, tmp_path_factory) -> PipelineSettings:
    """A pipeline whose batch epoch drained 30 000 records spread over 6 hours of event time
    (5 % up to 2 h late, 1 % malformed)."""
    settings = _settings(tmp_path_factory.mktemp("reprocess"))
    log = SegmentLog.create(settings.source, buckets=3)
    produce_backlog(
        log,
        GENERATOR,
        records=30_000,
        span=timedelta(hours=6),
        now=HISTORY_END,
        segment_records=4_000,
    )
    plan = decide(settings, force_mode="batch")
    run_batch_epoch(spark, resolve_job(settings, "batch"), plan.epoch)
    assert close_epoch(settings, plan.epoch)[0] == "completed"
    return settings


def test_reprocess_replaces_a_window_once_and_a_rerun_leaves_the_same_rows(
    spark, drained: PipelineSettings
) -> None:
    settings = drained
    before = _rows(settings)
    committed = SegmentLog(settings.source).latest_offsets()
    window = Window.parse(HISTORY_END.subtract(hours=4), HISTORY_END.subtract(hours=2))
    in_window = _in_window(settings, window, committed)
    assert 0 < in_window < 30_000

    first = plan_backfill(settings, window, "reprocess", run_id="reprocess-1", issuer="test")
    report = run_backfill(spark, resolve_job(settings, "backfill"), first.command)

    # Late records of the window sit above its main range; all of them are replaced.
    assert report.records + report.quarantined == in_window
    assert report.quarantined > 0
    assert _rows(settings) == before
    _assert_exact(settings, 30_000)
    history = DeltaTable(settings.sink).history(1)[0]
    assert history["operationParameters"]["mode"] == "Overwrite"
    assert history["operationMetrics"]["num_added_rows"] == report.records
    assert history["operationMetrics"]["num_removed_files"] > 0

    again = plan_backfill(settings, window, "reprocess", run_id="reprocess-2", issuer="test")
    assert again.command != first.command
    run_backfill(spark, resolve_job(settings, "backfill"), again.command)
    assert _rows(settings) == before
    _assert_exact(settings, 30_000)
    commits = backfill_commits(settings.sink, "bf")
    assert [(c.command, c.mode, c.window) for c in commits] == [
        (again.command, "reprocess", window),
        (first.command, "reprocess", window),
    ]
    store = StateStore.from_settings(settings)
    ran = [c for c in store.commands.list() if c.kind == "backfill"]
    assert [(c.status, c.args["run_id"], c.args["records"]) for c in ran] == [
        ("applied", "reprocess-1", report.records),
        ("applied", "reprocess-2", report.records),
    ]
    # The live pipeline sees none of it: its committed offsets and watermark stand.
    assert store.progress.committed_offsets() == committed
    # The operator's view lists the runs with what they did.
    shown = [c for c in pipeline_status(settings)["commands"] if c["kind"] == "backfill"]
    assert shown[0]["outcome"] == (
        f"reprocess [{window.start.isoformat()}, {window.end.isoformat()}): "
        f"{report.records:,} records, {report.quarantined:,} quarantined, sink version "
        f"{commits[0].table_version}"
    )


def test_a_retried_run_reattaches_and_an_overlapping_run_is_refused(
    spark, drained: PipelineSettings
) -> None:
    settings = drained
    window = Window.parse(HISTORY_END.subtract(hours=6), HISTORY_END.subtract(hours=5))
    held = plan_backfill(settings, window, "reprocess", run_id="holder", issuer="test")
    assert plan_backfill(settings, window, "reprocess", run_id="holder", issuer="t") == held
    overlapping = Window.parse(
        HISTORY_END.subtract(hours=5, minutes=30), HISTORY_END.subtract(hours=5)
    )
    with pytest.raises(BackfillRefusedError, match=r"run 'holder'.*overlaps"):
        plan_backfill(settings, overlapping, "reprocess", run_id="other", issuer="test")
    # Other buckets, or a window next to it, go ahead.
    beside = Window.parse(HISTORY_END.subtract(hours=5), HISTORY_END.subtract(hours=4))
    plan_backfill(settings, beside, "reprocess", run_id="beside", issuer="test")
    StateStore.from_settings(settings).commands.finish_backfill(
        held.command, error="test: given up"
    )
    plan_backfill(settings, overlapping, "fill", run_id="other", issuer="test")


def test_bad_runs_are_refused_before_anything_is_written(
    spark, drained: PipelineSettings, tmp_path: Path
) -> None:
    settings = drained
    version = DeltaTable(settings.sink).version()
    future = Window.parse(HISTORY_END, pendulum.now("UTC").add(hours=1))
    with pytest.raises(BackfillRefusedError, match="ends in the future"):
        plan_backfill(settings, future, "reprocess", run_id="future", issuer="test")
    past = Window.parse(HISTORY_END.subtract(hours=3), HISTORY_END.subtract(hours=2))
    with pytest.raises(BackfillRefusedError, match=r"buckets \[7\] are not buckets"):
        plan_backfill(settings, past, "fill", run_id="b7", buckets=[7], issuer="test")
    with pytest.raises(BackfillRefusedError, match="mode 'refill'"):
        plan_backfill(settings, past, "refill", run_id="m", issuer="test")
    missing = _settings(tmp_path, source=settings.source, pipeline="nobody")
    with pytest.raises(BackfillRefusedError, match="committed nothing"):
        plan_backfill(missing, past, "fill", run_id="nobody", issuer="test")
    assert DeltaTable(settings.sink).version() == version


def test_a_window_beyond_retention_is_refused(spark, tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    log = SegmentLog.create(settings.source, buckets=1)
    produce_backlog(
        log,
        EventGenerator(seed=1, buckets=1),
        records=4_000,
        span=timedelta(hours=4),
        now=HISTORY_END,
        segment_records=1_000,
    )
    plan = decide(settings, force_mode="batch")
    run_batch_epoch(spark, resolve_job(settings, "batch"), plan.epoch)
    close_epoch(settings, plan.epoch)
    log.drop_before({0: 2_000})
    gone = Window.parse(HISTORY_END.subtract(hours=4), HISTORY_END.subtract(hours=3))
    with pytest.raises(BackfillRefusedError, match="beyond retention in bucket 0"):
        plan_backfill(settings, gone, "reprocess", run_id="gone", issuer="test")
    kept = Window.parse(HISTORY_END.subtract(hours=1), HISTORY_END)
    assert plan_backfill(settings, kept, "reprocess", run_id="kept", issuer="test").ranges


def test_fill_loads_the_history_below_where_a_live_pipeline_started(spark, tmp_path: Path) -> None:
    settings = _settings(tmp_path, start_from="latest", stream_trigger="available_now")
    log = SegmentLog.create(settings.source, buckets=3)
    produce_backlog(
        log,
        GENERATOR,
        records=20_000,
        span=timedelta(hours=6),
        now=HISTORY_END,
        segment_records=4_000,
    )
    history_end = log.latest_offsets()
    live = decide(settings, force_mode="stream")
    assert live.start == history_end  # live at once, not from the earliest offsets
    produce_backlog(log, GENERATOR, records=3_000, first=20_000, now=HISTORY_END.add(minutes=30))
    run_stream_epoch(spark, resolve_job(settings, "stream"), live.epoch)
    close_epoch(settings, live.epoch)
    _assert_exact(settings, 3_000)

    window = Window.parse(HISTORY_END.subtract(hours=5), HISTORY_END.subtract(hours=2))
    plan = plan_backfill(settings, window, "fill", run_id="fill-1", issuer="test")
    assert {b: hi for b, (_, hi) in plan.ranges.items()} == history_end
    report = run_backfill(spark, resolve_job(settings, "backfill"), plan.command)
    in_window = _in_window(settings, window, history_end)
    assert report.records + report.quarantined == in_window
    _assert_exact(settings, 3_000 + in_window)
    # The next window of the schedule adds its own records, none twice.
    later = Window.parse(HISTORY_END.subtract(hours=2), HISTORY_END.add(minutes=30))
    run_backfill(
        spark,
        resolve_job(settings, "backfill"),
        plan_backfill(settings, later, "fill", run_id="fill-2", issuer="t").command,
    )
    _assert_exact(settings, 3_000 + in_window + _in_window(settings, later, history_end))


def test_the_cli_runs_a_backfill_as_a_job_of_its_own(
    spark, drained: PipelineSettings, tmp_path: Path, capsys
) -> None:
    from modeswitch.cli import main

    settings = drained
    config = tmp_path / "settings.json"
    config.write_text(
        json.dumps(
            {
                "pipeline": "bf",
                "source": settings.source,
                "warehouse": settings.warehouse,
                "value_schema": settings.value_schema,  # the same parse as the sink's
            }
        )
    )
    before = _rows(settings)
    window = Window.parse(HISTORY_END.subtract(hours=1), HISTORY_END)
    args = ["backfill", "--config", str(config), "--mode", "reprocess", "--buckets", "0,2"]
    code = main([*args, "--start", window.start.isoformat(), "--end", window.end.isoformat()])
    out = capsys.readouterr().out
    assert code == 0, out
    [commit] = [c for c in backfill_commits(settings.sink, "bf") if c.window == window]
    assert sorted(commit.ranges) == [0, 2]
    assert f"applied: {commit.records:,} records" in out
    assert _rows(settings) == before
    # Refused before anything is written, with the reason, and exit status 2.
    assert main([*args, "--start", window.start.isoformat(), "--end", "2999-01-01"]) == 2
    assert "ends in the future" in capsys.readouterr().err
