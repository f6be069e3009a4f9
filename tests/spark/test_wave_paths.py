"""Batch epochs and backfills run the path the wave seam chooses (modeswitch.modes.wave_path),
and every path leaves the sink exactly once."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pendulum
import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.modes.backfill import Window, plan_backfill
from modeswitch.modes.backfill_job import run_backfill
from modeswitch.modes.batch import run_batch_epoch
from modeswitch.modes.job import resolve_job
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.sources.segments import SegmentLog

RECORDS = 4_000
HISTORY_END = pendulum.now("UTC").start_of("hour").subtract(hours=1)


def _drained(spark, root: Path, **extra: str) -> PipelineSettings:
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "paths",
            "source": str(root / "log"),
            "warehouse": str(root / "warehouse"),
            "watermark_lag_threshold": "1h",
            "enter_threshold": "1h",
            "exit_threshold": "1h",
            **extra,
        }
    )
    log = SegmentLog.create(settings.source, buckets=2)
    generator = EventGenerator(seed=3, buckets=2, malformed_fraction=0.02)
    produce_backlog(
        log, generator, records=RECORDS, span=timedelta(hours=2), now=HISTORY_END, chunk=1_000
    )
    plan = decide(settings, force_mode="batch")
    run_batch_epoch(spark, resolve_job(settings, "batch"), plan.epoch)
    assert close_epoch(settings, plan.epoch)[0] == "completed"
    return settings


def _assert_exact(settings: PipelineSettings) -> None:
    report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
    totals = report.totals
    assert (totals.missing, totals.duplicated, totals.out_of_range) == (0, 0, 0), report
    assert not report.problems and totals.expected == RECORDS


@pytest.fixture
def calls(monkeypatch) -> list[tuple]:
    """What the batch job and the backfill called to read and write: (reader or writer, the
    writer asked, whether a record count was expected)."""
    import modeswitch.modes.waves as waves

    seen: list[tuple] = []

    def spy(name, function):
        def called(*args, **kwargs):
            seen.append((name, kwargs.get("writer"), "expectedRecords" in kwargs))
            return function(*args, **kwargs)

        return called

    monkeypatch.setattr(waves, "read_segments", spy("read_segments", waves.read_segments))
    monkeypatch.setattr(waves, "write_batch", spy("write_batch", waves.write_batch))
    monkeypatch.setattr(
        waves.arrow_wave, "write_wave", spy("write_wave", waves.arrow_wave.write_wave)
    )
    return seen


@pytest.mark.parametrize(
    ("settings", "chosen"),
    [
        ({}, [("write_wave", None, True)]),
        (
            {"batch_reader": "native"},
            [("read_segments", None, False), ("write_batch", "native", True)],
        ),
        ({"batch_reader": "native", "batch_writer": "python"}, [("write_batch", "python", False)]),
        (
            {"batch_reader": "bucketlog", "transform": "modeswitch.transforms:parse_events"},
            [("write_batch", "native", False)],
        ),
    ],
)
def test_a_batch_epoch_runs_the_chosen_path_exactly_once(
    spark, tmp_path: Path, calls: list[tuple], settings: dict[str, str], chosen: list[tuple]
) -> None:
    drained = _drained(spark, tmp_path, **settings)
    assert set(calls) == set(chosen)  # every wave, the same path
    _assert_exact(drained)


def test_a_backfill_reads_the_segment_log_natively_with_batch_reader_native(
    spark, tmp_path: Path, calls: list[tuple]
) -> None:
    settings = _drained(spark, tmp_path, batch_reader="native")
    calls.clear()
    window = Window.parse(HISTORY_END.subtract(hours=1), HISTORY_END)
    plan = plan_backfill(settings, window, "reprocess", run_id="native-1", issuer="test")
    report = run_backfill(spark, resolve_job(settings, "backfill"), plan.command)
    assert calls == [("read_segments", None, False)]
    assert report.records + report.quarantined > 0
    _assert_exact(settings)
