"""Spark's own Kafka source (``format("kafka")``) as the pipeline reads a topic with it: row for
row what our Kafka log reads from the same range, across transaction gaps, undecodable bytes
and every kind of event-time field; and a stream of it into the sink, exactly once."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from datetime import UTC, datetime

import pyarrow as pa
from confluent_kafka import Producer

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.modes.warmup import kafka_tail, start_warm_up, warm_up
from modeswitch.sinks.stream_offsets import offsets_log_entry
from modeswitch.sources.kafka import NOT_UTF8_PREFIX, KafkaLocation, KafkaLog
from modeswitch.sources.spark_kafka import read_batch, read_stream

BASE_MS = 1_700_000_000_000  # as in conftest

FIELD_VALUES = [
    {"ts": BASE_MS + 5_000},  # epoch milliseconds
    {"ts": (BASE_MS + 6_500) / 1000 * 1000 + 0.25},  # a fraction of a millisecond
    {"ts": "2026-11-26T10:00:00Z"},  # ISO-8601, UTC
    {"ts": "2026-11-26T10:00:00.123+02:00"},  # ISO-8601 with an offset
    {"ts": "2026-11-26T10:00:00"},  # no zone: the message timestamp
    {"ts": True},  # not a time: the message timestamp
    {"ts": None},
    {"ts": {"nested": 1}},
    {"other": 1},  # no field
]


HEADERS = [("trace", b"abc"), ("trace", b"def"), ("raw", b"\xff\x00"), ("none", None)]
"""A record's headers: a key twice, a value not UTF-8, a null value; in this order."""


def _records(table: pa.Table) -> list[tuple]:
    """(bucket, offset, event time in µs, key, value[, headers]), in bucket and offset
    order."""
    names = ["bucket", "offset", "event_time", "key", "value"]
    names += [n for n in ("headers",) if n in table.schema.names]
    table = table.select(names).set_column(2, "event_time", table["event_time"].cast(pa.int64()))
    return sorted(zip(*(table.column(n).to_pylist() for n in names), strict=True))


def test_spark_reads_a_range_as_our_log_reads_it(
    spark,
    kafka_cluster: KafkaBroker,
    new_topic: Callable[[int], str],
    transactions: Callable[..., None],
) -> None:
    source = new_topic(2)
    topic = KafkaLocation.parse(source).topic
    transactions(topic, partitions=2, transactions=30, seed=5)
    producer = Producer(kafka_cluster.config)
    for i, value in enumerate(FIELD_VALUES):
        producer.produce(
            topic,
            json.dumps(value).encode(),
            key=b"f%d" % i,
            partition=i % 2,
            timestamp=BASE_MS + 900_000 + i,
        )
    producer.produce(topic, b"\xff\xfe not utf-8", key=b"\xc3", partition=0, timestamp=BASE_MS)
    producer.produce(topic, b"not json", key=None, partition=1, timestamp=BASE_MS)
    producer.produce(topic, None, key=b"tombstone", partition=1, timestamp=BASE_MS)
    producer.produce(topic, b"{}", key=b"h", partition=0, timestamp=BASE_MS, headers=HEADERS)
    assert producer.flush(10) == 0
    del producer  # its client threads end with it, before the session stops the broker

    for setting in (source, f"{source}?event_time=ts", f"{source}?headers=true"):
        log = KafkaLog(setting)
        end = log.latest_offsets()
        start = {b: 0 for b in end}
        ours = pa.Table.from_batches([batch for b in end for batch in log.read(b, 0, end[b])])
        spark_rows = read_batch(spark, setting, start, end).toArrow()
        assert _records(spark_rows) == _records(ours), setting
        # and a range inside: end exclusive
        inner = {b: max(0, end[b] - 7) for b in end}
        ours = pa.Table.from_batches(
            [batch for b in end for batch in log.read(b, 3, inner[b])] or [], schema=ours.schema
        )
        spark_rows = read_batch(spark, setting, {b: 3 for b in end}, inner).toArrow()
        assert _records(spark_rows) == _records(ours), setting
        log.close()
    # What the rows hold: aborted records gone, the field's kinds as documented.
    by_field = _records(read_batch(spark, f"{source}?event_time=ts", start, end).toArrow())
    values = {r[3]: r for r in by_field if r[3] and r[3].startswith("f")}
    assert values["f0"][2] == (BASE_MS + 5_000) * 1000
    ten = int(datetime(2026, 11, 26, 10, tzinfo=UTC).timestamp()) * 1_000_000
    assert values["f1"][2] == (BASE_MS + 6_500) * 1000 + 250
    assert values["f2"][2] == ten
    assert values["f3"][2] == ten + 123_000 - 2 * 3_600_000_000
    for plain in ("f4", "f5", "f6", "f7", "f8"):  # the message timestamp
        assert values[plain][2] == (BASE_MS + 900_000 + int(plain[1:])) * 1000
    [undecodable] = [r for r in by_field if r[4] and r[4].startswith(NOT_UTF8_PREFIX)]
    assert undecodable[3].startswith(NOT_UTF8_PREFIX)
    # The headers, read only where the source asks: in order, as bytes; null where none.
    assert "headers" not in read_batch(spark, source, start, end).columns
    with_headers = _records(read_batch(spark, f"{source}?headers=true", start, end).toArrow())
    kept = {r[3]: r[5] for r in with_headers}
    assert kept["h"] == [{"key": k, "value": v} for k, v in HEADERS]
    assert kept["f0"] is None


def test_a_stream_reads_from_exact_offsets_with_a_limit_per_micro_batch(
    spark, new_topic: Callable[[int], str], transactions: Callable[..., None], tmp_path
) -> None:
    source = new_topic(3)
    topic = KafkaLocation.parse(source).topic
    transactions(topic, partitions=3, transactions=40, seed=9)
    log = KafkaLog(source)
    end = log.latest_offsets()
    start = {b: min(4, end[b]) for b in end}
    expected = _records(
        pa.Table.from_batches([x for b in end for x in log.read(b, start[b], end[b])])
    )
    log.close()
    frame = read_stream(spark, source, start, max_records_per_trigger=25, tasks=2)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        frame.explain(extended=True)
    # A live micro-batch never waits at the broker for records it does not read.
    assert "kafka.fetch.max.wait.ms=0" in printed.getvalue()
    # Nor does stopping it wait a minute for a request to a broker that is gone.
    assert "kafka.default.api.timeout.ms=20000" in printed.getvalue()
    batches: list[pa.Table] = []
    tasks: list[int] = []

    def keep(batch, _batch_id: int) -> None:
        tasks.append(batch.rdd.getNumPartitions())
        batches.append(batch.toArrow())

    query = (
        frame.writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    got = _records(pa.concat_tables(batches))
    assert got == expected
    # Three partitions, read in two tasks a micro-batch.
    assert tasks and max(tasks) == 2, tasks
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    assert len(progress) > 1  # the limit cut the range into micro-batches
    # The offsets log, as the sink reads it: the topic's partitions, ending where the log ends.
    last = max(int(p["batchId"]) for p in query.recentProgress)
    assert offsets_log_entry(str(tmp_path / "checkpoint"), last) == end


def test_the_sasl_password_never_shows_in_a_plan(
    spark, kafka_cluster: KafkaBroker, new_topic: Callable[[int], str]
) -> None:
    source = new_topic(2)
    marker = "plan-marker-s3cr3t"
    config = {**kafka_cluster.config, "sasl.username": "svc", "sasl.password": marker}
    frames = {
        "stream": read_stream(spark, source, {0: 0, 1: 0}, config=config),
        "batch": read_batch(spark, source, {0: 0, 1: 0}, {0: 0, 1: 0}, config=config),
    }
    for kind, frame in frames.items():
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            frame.explain(extended=True)
        plan = printed.getvalue()
        assert marker not in plan, kind
        if kind == "stream":  # its plan lists the options: the login is there, redacted
            assert "kafka.sasl.jaas.config=*********(redacted)" in plan


def test_the_warm_up_of_a_topic_reads_its_tail_through_the_kafka_source(
    spark, kafka_cluster: KafkaBroker, new_topic: Callable[[int], str], tmp_path
) -> None:
    source = new_topic(3)
    topic = KafkaLocation.parse(source).topic
    settings = PipelineSettings.from_mapping(
        {"source": source, "warehouse": str(tmp_path / "warehouse")}
    )
    # A topic not created yet, or empty: nothing to read there.
    assert kafka_tail(f"{source}-not-created", 60) is None
    assert kafka_tail(source, 60) is None
    # The generated events stand in for it, the Kafka source left cold; or, asked not to
    # stand in, nothing starts.
    warmed = warm_up(spark, settings, records=60)
    assert warmed is not None and warmed.records == 60 and warmed.stand_in
    assert start_warm_up(spark, settings, records=60, stand_in=False) is None
    producer = Producer(kafka_cluster.config)
    for partition, count in enumerate((5, 40, 40)):
        for i in range(count):
            producer.produce(topic, json.dumps({"event_id": i}).encode(), partition=partition)
    producer.flush(30)
    # Each partition's share of 60 (20), never below its earliest offset: 5 + 20 + 20.
    assert kafka_tail(source, 60) == {0: 0, 1: 20, 2: 20}
    warmed = warm_up(spark, settings, records=60)
    assert warmed is not None and warmed.records == 45 and not warmed.stand_in
    assert list((tmp_path / "warehouse").rglob("warm-up/*")) == []  # nothing left behind
