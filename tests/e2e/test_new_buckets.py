"""Buckets added under a running pipeline (a partition added to a Kafka topic) are picked up,
never lost: by the next epoch when the running one is a batch epoch (its boundary is fixed),
and by the running stream itself otherwise, from the new bucket's earliest offset.

On the embedded log (``SegmentLog.add_buckets``); tests/kafka/test_kafka_pipeline.py adds
partitions to a topic under a running stream on the real broker.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from fault_tools import assert_exactly_once

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, append_events, produce_backlog
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import run_job_process
from modeswitch.sinks.commits import committed_offsets, sink_commits
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore


def _fill(log: SegmentLog, bucket: int, records: int, first: int) -> None:
    """``records`` events in ``bucket`` only."""
    events = EventGenerator(seed=bucket, buckets=1).generate(first, records, [0] * records)
    bucket_column = pa.array([bucket] * records, pa.int32())
    append_events(log, events.set_column(0, "bucket", bucket_column))


def test_buckets_added_under_a_running_pipeline_are_read_exactly_once(tmp_path: Path) -> None:
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "grow",
            "source": str(tmp_path / "log"),
            "warehouse": str(tmp_path / "warehouse"),
            "max_records_per_trigger": "5000",
            "trigger_interval": "200ms",
            "watermark_lag_threshold": "1h",
            "enter_threshold": "1h",
            "exit_threshold": "1h",
        }
    )
    log = SegmentLog.create(settings.source, buckets=4)
    generator = EventGenerator(seed=1, buckets=4)
    produce_backlog(log, generator, records=40_000, span=timedelta(minutes=5))
    batch = decide(settings)
    assert batch.mode == "batch" and set(batch.boundary) == {0, 1, 2, 3}
    assert log.add_buckets(1) == [4]  # after the boundary was fixed
    _fill(log, 4, 3_000, first=100_000)
    run_job_process("batch", settings, batch.epoch, timeout=600)
    assert close_epoch(settings, batch.epoch) == ("completed", batch.boundary)

    stream = decide(settings, force_mode="stream")
    assert stream.start == {**batch.boundary, 4: 0}  # the new bucket, from its earliest offset
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    done = threading.Event()
    grown: dict[int, int] = {}

    def grow_then_pause() -> None:
        while not done.wait(0.2):  # once the stream has committed, add a bucket under it
            if any(c.epoch == stream.epoch for c in sink_commits(settings.sink, "grow")):
                break
        assert log.add_buckets(1) == [5]
        _fill(log, 5, 2_000, first=200_000)
        grown.update(log.latest_offsets())
        while not done.wait(0.5):
            if committed_offsets(settings.sink, "grow") == grown:
                store.commands.submit("pause", {"note": "caught up"}, issuer="test")
                return

    watcher = threading.Thread(target=grow_then_pause, daemon=True)
    watcher.start()
    try:
        run_job_process("stream", settings, stream.epoch, timeout=600)
    finally:
        done.set()
        watcher.join(timeout=30)
    status, end = close_epoch(settings, stream.epoch)
    assert status == "completed"
    assert end == grown and end[5] == 2_000
    assert_exactly_once(settings)
    # Every record of the new bucket is in the sink: the audit counts from where the sink's
    # commits say a bucket starts, so a commit that claimed an empty range for it would pass.
    held = DeltaTable(settings.sink).to_pyarrow_table(columns=["bucket"]).column("bucket")
    assert pc.sum(pc.equal(held, 5)).as_py() == 2_000
    [first] = [c for c in sink_commits(settings.sink, "grow") if 5 in c.start][:1]
    assert first.start[5] == 0
