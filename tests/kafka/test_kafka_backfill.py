"""A backfill on a Kafka topic: the window's first offsets come from Kafka's time index
(``offsets_for_times``), the read goes through the ``bucketlog`` data source (a topic has no
files) or, with ``batch_reader = native``, Spark's own Kafka source; aborted transactions and
their markers leave gaps, and the window is still replaced exactly once."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pendulum
import pytest
from deltalake import DeltaTable
from fault_tools import records_in_window

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.modes.backfill import Window, plan_backfill
from modeswitch.modes.backfill_job import run_backfill
from modeswitch.modes.batch import run_batch_epoch
from modeswitch.modes.job import resolve_job
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.sources import open_log
from modeswitch.sources.kafka import KafkaLocation
from modeswitch.transforms.payload import EVENT_VALUE_SCHEMA

HISTORY_END = pendulum.now("UTC").start_of("hour").subtract(hours=1)


def _rows(uri: str) -> list[dict]:
    table = DeltaTable(uri).to_pyarrow_table()
    return table.sort_by([("bucket", "ascending"), ("offset", "ascending")]).to_pylist()


@pytest.mark.parametrize(
    ("batch_reader", "read_by"),
    [("arrow", "bucketlog"), ("native", "kafka")],
    ids=["python-consumer", "sparks-kafka-source"],
)
def test_a_window_of_a_topic_with_aborted_transactions_is_reprocessed_once(
    spark,
    new_topic: Callable[[int], str],
    transactions,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
    batch_reader: str,
    read_by: str,
) -> None:
    source = new_topic(4)
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "kafka_backfill",
            "batch_reader": batch_reader,
            "source": source,
            "warehouse": str(tmp_path / "warehouse"),
            "watermark_lag_threshold": "1h",
            "enter_threshold": "1h",
            "exit_threshold": "1h",
            "value_schema": EVENT_VALUE_SCHEMA,  # the demo's events, parsed: some quarantined
        }
    )
    log = open_log(source)
    request.addfinalizer(log.close)  # its producer, before the session's broker stops
    produce_backlog(
        log,
        EventGenerator(seed=4, buckets=4, late_fraction=0.05, malformed_fraction=0.01),
        records=20_000,
        span=timedelta(hours=6),
        now=HISTORY_END,
    )
    transactions(
        KafkaLocation.parse(source).topic,
        partitions=4,
        transactions=30,
        base_ms=int(HISTORY_END.subtract(hours=3).timestamp() * 1000),
    )
    plan = decide(settings, force_mode="batch")
    run_batch_epoch(spark, resolve_job(settings, "batch"), plan.epoch)
    assert close_epoch(settings, plan.epoch)[0] == "completed"
    before = (_rows(settings.sink), _rows(settings.quarantine))

    window = Window.parse(HISTORY_END.subtract(hours=3), HISTORY_END.subtract(hours=2))
    claimed = plan_backfill(settings, window, "reprocess", run_id="kafka-1", issuer="test")
    # The time index bounds the read below: no bucket is read from its first offset.
    assert all(lo > 0 for lo, _ in claimed.ranges.values())
    with caplog.at_level(logging.INFO, logger="modeswitch.modes.backfill_job"):
        report = run_backfill(spark, resolve_job(settings, "backfill"), claimed.command)
    assert f"read by {read_by} (" in caplog.text

    in_window = records_in_window(log, window.start, window.end, log.latest_offsets())
    assert report.records + report.quarantined == in_window > 0
    assert (_rows(settings.sink), _rows(settings.quarantine)) == before
    totals = audit(settings.source, settings.sink, settings.quarantine, "kafka_backfill").totals
    assert (totals.missing, totals.duplicated, totals.out_of_range) == (0, 0, 0), totals
