"""A stream epoch whose query fails (modeswitch.modes.stream.run_stream_epoch) raises
StreamQueryError naming the epoch, with the query's own exception as its cause, after
stopping the query: a job reports it as a modeswitch error (exit 1 with the message). The
message's first line names the source (a Kafka source with its brokers: the Java client's
errors name a partition, not where it was looked for), before Spark's error, whose text runs
on over many lines (the query's plan): the first line is what a runner reports of a failed job
(``modeswitch.runners.local.job_failure``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import StreamQueryError
from modeswitch.modes.job import resolve_job
from modeswitch.modes.stream import run_stream_epoch
from modeswitch.runners.lifecycle import decide
from modeswitch.sources.kafka import KafkaLog
from modeswitch.sources.segments import SegmentLog

pytestmark = pytest.mark.spark


def test_a_failed_query_is_a_stream_query_error_naming_the_epoch(spark, tmp_path: Path) -> None:
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "broken",
            "source": str(tmp_path / "log"),
            "warehouse": str(tmp_path / "warehouse"),
            "stream_trigger": "available_now",
        }
    )
    log = SegmentLog.create(settings.source, buckets=1)
    plan = decide(settings, force_mode="stream")
    produce_backlog(log, EventGenerator(seed=3, buckets=1), records=200)
    segments = sorted(Path(settings.source).rglob("*.parquet"))
    assert segments
    for segment in segments:  # unreadable: the query's first micro-batch fails
        segment.write_bytes(b"not parquet")

    with pytest.raises(StreamQueryError, match=f"stream epoch {plan.epoch}: the query") as raised:
        run_stream_epoch(spark, resolve_job(settings, "stream"), plan.epoch)
    assert isinstance(raised.value.__cause__, StreamingQueryException)
    first_line = str(raised.value).splitlines()[0]
    assert f"the query reading {settings.source} " in first_line, first_line
    assert len(str(raised.value).splitlines()) > 1  # Spark's error follows, plan and all
    assert spark.streams.active == []


def test_a_kafka_source_is_named_with_its_brokers() -> None:
    log = KafkaLog("kafka://events", {"bootstrap.servers": "broker-a:9092,broker-b:9092"})
    assert str(log) == "kafka://events at broker-a:9092,broker-b:9092"
