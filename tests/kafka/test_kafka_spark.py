"""Spark reads a Kafka topic through the ``bucketlog`` data source, batch and streaming.

The consumers run in Spark's Python workers (created inside ``read()``); they find the broker
through ``MODESWITCH_KAFKA_CONFIG`` in the environment they inherit, never through an option.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.sources import open_log
from modeswitch.sources.kafka import KafkaLocation
from modeswitch.sources.spark import register
from modeswitch.transforms import QUARANTINE_REASON, parse_events


@pytest.fixture(scope="module")
def gapped_topic(new_topic: Callable[[int], str], transactions) -> str:
    source = new_topic(4)
    transactions(KafkaLocation.parse(source).topic, partitions=4, transactions=60, seed=3)
    return source


def _held(source: str) -> set[tuple[int, int]]:
    log = open_log(source)
    latest = log.latest_offsets()
    return {(b, int(o)) for b in latest for o in log.held_offsets(b, 0, latest[b])}


def test_batch_read_is_exactly_what_the_topic_holds(spark, gapped_topic: str) -> None:
    register(spark)
    frame = (
        spark.read.format("bucketlog")
        .option("maxRecordsPerPartition", "50")
        .load(gapped_topic)
        .select("bucket", "offset")
    )
    rows = [(r.bucket, r.offset) for r in frame.collect()]
    assert len(rows) == len(set(rows))
    expected = _held(gapped_topic)
    assert set(rows) == expected
    latest = open_log(gapped_topic).latest_offsets()
    assert len(expected) < sum(latest.values()), "the topic's offsets must have gaps"


def test_stream_reads_everything_once_within_max_records_per_trigger(
    spark, gapped_topic: str, tmp_path
) -> None:
    register(spark)
    batches: list[list[tuple[int, int]]] = []

    def collect(frame, _batch_id: int) -> None:
        batches.append([(r.bucket, r.offset) for r in frame.select("bucket", "offset").collect()])

    query = (
        spark.readStream.format("bucketlog")
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "100")
        .load(gapped_topic)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    rows = [row for batch in batches for row in batch]
    assert sorted(rows) == sorted(_held(gapped_topic))
    assert len(batches) >= 3
    assert all(len(batch) <= 100 for batch in batches)


def test_undecodable_and_malformed_payloads_are_quarantined_not_dropped(
    spark, kafka_cluster: KafkaBroker, new_topic: Callable[[int], str]
) -> None:
    register(spark)
    source = new_topic(1)
    producer = Producer(kafka_cluster.config)
    payloads = [
        b'{"event_id": 1, "user_id": 2, "action": "view", "amount": 1.5, "country": "DE"}',
        b"\xff\xfe not utf-8",
        b'{"event_id": 1',
        None,
    ]
    for value in payloads:
        producer.produce(KafkaLocation.parse(source).topic, value, partition=0)
    producer.flush(10)
    rows = parse_events(spark.read.format("bucketlog").load(source)).orderBy("offset").collect()
    assert [r[QUARANTINE_REASON] for r in rows] == [
        None,
        "value is not UTF-8",
        "value is not valid JSON",
        "value is null",
    ]


def test_an_option_error_names_the_option(spark, gapped_topic: str) -> None:
    register(spark)
    with pytest.raises(Exception, match="option source='segments': does not match path"):
        spark.read.format("bucketlog").option("source", "segments").load(gapped_topic).count()
    with pytest.raises(Exception, match=r"option startingOffsets=.*bucket 7 does not exist"):
        spark.read.format("bucketlog").option("startingOffsets", '{"7": 0}').load(
            gapped_topic
        ).count()
