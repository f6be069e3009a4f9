"""Maintenance while a stream commits, on real Spark and real Delta tables: the sink is
compacted, its log checkpointed and cleaned and its old files vacuumed between micro-batches;
no row is lost or doubled, every micro-batch is committed and recorded once, and a zombie of an
ended epoch is still fenced out after compaction and log cleanup."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import FencedError
from modeswitch.offsets import offsets_to_json
from modeswitch.ops.maintenance import maintain
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import run_job_process
from modeswitch.sinks.commits import committed_offsets, sink_commits
from modeswitch.sinks.native import write_batch
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore, reconcile

PIPELINE = "tended"
GENERATOR = EventGenerator(seed=11, buckets=2, malformed_fraction=0.02)


def _wait_for(condition, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def test_maintenance_runs_beside_a_committing_stream(spark, tmp_path: Path) -> None:
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": PIPELINE,
            "source": str(tmp_path / "log"),
            "warehouse": str(tmp_path / "wh"),
            "trigger_interval": "200ms",
            "max_records_per_trigger": "300",
            "max_stream_runtime": "10m",
            "min_time_in_stream": "0s",
            "exit_threshold": "1h",
            "enter_threshold": "2h",
            "watermark_lag_threshold": "2h",
            "log_retention": "none",  # the test sets the sink's own, in seconds
        }
    )
    log = SegmentLog.create(settings.source, buckets=2)
    produce_backlog(log, GENERATOR, records=2_000)
    store = StateStore.from_settings(settings)
    # An epoch before the stream's: its jobs are the zombies fenced out at the end.
    old = store.epochs.open("batch", "backlog", {0: 0, 1: 0}, {0: 0, 1: 0})
    store.epochs.close(old, {0: 0, 1: 0})
    live = decide(settings, force_mode="stream")
    assert live.epoch == old + 1

    stop_feeding = threading.Event()

    def feed() -> None:
        first = 2_000
        while not stop_feeding.wait(0.3):
            produce_backlog(log, GENERATOR, records=60, first=first)
            first += 60

    stream = threading.Thread(
        target=run_job_process, args=("stream", settings, live.epoch), kwargs={"timeout": 600}
    )
    feeder = threading.Thread(target=feed, daemon=True)
    stream.start()
    feeder.start()
    reports = []
    try:
        _wait_for(lambda: len(list(sink_commits(settings.sink, PIPELINE))) >= 5, "commits")
        # Log files expire after 15 s: what a month of age does with the default 30 days (an
        # operator's property change: a metadata commit among the stream's). Only maintenance
        # cleans the log here, each run after its summary: the stream's own Delta commits
        # would clean it too, and a run slower than the retention (ci63: a machine three
        # times slower than usual) then lost commits no summary had read. With 30 days and a
        # daily run that race is a month wide; here it would be seconds. Runs 2 s apart go on
        # until the log has been cleaned.
        DeltaTable(settings.sink).alter.set_table_properties(
            {
                "delta.logRetentionDuration": "interval 15 seconds",
                "delta.enableExpiredLogCleanup": "false",  # delta-spark's; delta-rs's ignores it
            }
        )
        first_log_file = Path(settings.sink) / "_delta_log" / "00000000000000000000.json"
        deadline = time.monotonic() + 240
        while len(reports) < 6 or first_log_file.exists():
            assert time.monotonic() < deadline, "the sink's log was never cleaned"
            time.sleep(2)
            reports.append(maintain(settings, store=store))
        # Files compacted away, vacuumed at once (the setting never goes below an hour).
        vacuumed = DeltaTable(settings.sink).vacuum(
            0, dry_run=False, enforce_retention_duration=False
        )
    finally:
        stop_feeding.set()
        feeder.join(timeout=10)
        _wait_for(
            lambda: committed_offsets(settings.sink, PIPELINE) == log.latest_offsets(),
            "the stream to catch up",
        )
        store.commands.submit("pause", {"note": "test over"}, issuer="test")
        stream.join(timeout=300)
    assert not stream.is_alive()
    close_epoch(settings, live.epoch)

    compacted = [next(t for t in r.tables if t.table == "sink") for r in reports]
    assert all(t.files_before > 1 for t in compacted), compacted  # the stream added files
    assert vacuumed
    log_files = sorted((Path(settings.sink) / "_delta_log").glob("*.json"))
    assert log_files[0].name != "00000000000000000000.json"  # the log was cleaned

    # Every record once: the audit reads the summaries in place of the cleaned commits.
    summaries = store.commands.log_summaries()
    report = audit(
        settings.source, settings.sink, settings.quarantine, PIPELINE, summaries=summaries
    )
    assert report.ok, report
    assert report.totals.expected == sum(log.latest_offsets().values())
    # Every micro-batch committed once and recorded once, in order.
    progress = store.progress.list(live.epoch)
    assert [p.sequence for p in progress] == list(range(len(progress)))
    assert report.sink_commits == len(progress) > 20
    assert not reconcile(store).repaired

    # A zombie of the ended epoch before: refused, even with the log cleaned and compacted.
    end = committed_offsets(settings.sink, PIPELINE)
    with pytest.raises(FencedError):
        write_batch(
            spark.read.format("bucketlog")
            .option("startingOffsets", offsets_to_json(end))
            .option("endingOffsets", offsets_to_json(end))
            .load(settings.source),
            settings.sink,
            pipeline=PIPELINE,
            epoch=str(old),
            sequence="0",
            offsetsStart=offsets_to_json(end),
            offsetsEnd=offsets_to_json(end),
        )
