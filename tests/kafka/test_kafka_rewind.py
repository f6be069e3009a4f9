"""A rewind to an event time on a Kafka topic, through the pipeline: the control command asks
Kafka's time index (``offsets_for_times``, which librdkafka's mock cluster answers with -1) for
each partition's first offset at that time, ``decide`` applies the rewind and opens the next
epoch there, and that epoch reads the range again: exactly once in the end."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from unittest import mock

import pendulum
import pytest

from modeswitch.airflow.tasks import submit_control_command
from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.modes.batch import run_batch_epoch
from modeswitch.modes.job import resolve_job
from modeswitch.modes.stream import run_stream_epoch
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.sinks.commits import sink_commits
from modeswitch.sources import open_log
from modeswitch.state import StateStore
from modeswitch.transforms.payload import EVENT_VALUE_SCHEMA

REWIND_TO = pendulum.now("UTC").start_of("hour").subtract(hours=3)


def _run(spark, settings: PipelineSettings) -> int:
    """Decide, run the epoch to the log's end and close it; its id."""
    plan = decide(settings, decided_by="test")
    if plan.mode == "batch":
        run_batch_epoch(spark, resolve_job(settings, "batch"), plan.epoch)
    else:
        run_stream_epoch(spark, resolve_job(settings, "stream"), plan.epoch)
    assert close_epoch(settings, plan.epoch)[0] == "completed"
    return plan.epoch


def test_a_rewind_to_an_event_time_rereads_the_topic_from_kafkas_time_index(
    spark,
    kafka_cluster: KafkaBroker,
    new_topic: Callable[[int], str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    source = new_topic(4)
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "kafka_rewind",
            "source": source,
            "warehouse": str(tmp_path / "warehouse"),
            "value_schema": EVENT_VALUE_SCHEMA,  # the demo's events, parsed: some quarantined
            "stream_trigger": "available_now",  # a stream epoch reads what is there and ends
            "watermark_lag_threshold": "1h",
            "enter_threshold": "1h",
            "exit_threshold": "1h",
        }
    )
    log = open_log(source)
    request.addfinalizer(log.close)  # its producer, before the session's broker stops
    generator = EventGenerator(seed=9, buckets=4, malformed_fraction=0.01)
    # Two hours before the rewind's time, then two hours from it: message timestamps are the
    # events' times, so the first offsets at REWIND_TO are where the first part ended.
    before = REWIND_TO - timedelta(minutes=1)
    produce_backlog(log, generator, records=6_000, span=timedelta(hours=2), now=before)
    expected = log.latest_offsets()
    produce_backlog(
        log,
        generator,
        records=6_000,
        first=6_000,
        span=timedelta(hours=2) - timedelta(minutes=1),
        now=REWIND_TO + timedelta(hours=2),
    )
    assert all(log.latest_offsets()[b] > expected[b] > 0 for b in expected)
    first = _run(spark, settings)
    store = StateStore.from_settings(settings)
    drained = store.progress.committed_offsets()
    assert drained == log.latest_offsets()

    # As the control DAG queues it: the topic's client configuration from Airflow's connection.
    connection = json.dumps({"conn_type": "kafka", "extra": kafka_cluster.config})
    with mock.patch.dict(os.environ, {"AIRFLOW_CONN_KAFKA_DEFAULT": connection}):
        queued = submit_control_command(
            {"command": "rewind", "event_time": REWIND_TO.isoformat()}, settings=settings
        )
    assert {int(b): o for b, o in queued["args"]["offsets"].items()} == expected

    again = _run(spark, settings)
    epoch = store.epochs.get(again)
    assert epoch.start == expected  # the next epoch began at the time index's offsets
    assert epoch.end == drained
    [rewind] = [c for c in sink_commits(settings.sink, settings.pipeline) if c.is_rewind]
    assert (rewind.command, rewind.epoch, dict(rewind.end)) == (queued["command"], first, expected)
    report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
    assert report.ok, report
    assert (report.totals.missing, report.totals.duplicated) == (0, 0)
    assert report.totals.expected == 12_000
    assert report.totals.in_sink + report.totals.in_quarantine == 12_000
