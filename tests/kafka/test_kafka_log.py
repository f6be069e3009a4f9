"""The Kafka bucketed log against an Apache Kafka broker (one KRaft node, see conftest).

Aborted transactions are hidden under read_committed, and they and the transaction markers
leave gaps in the offsets: these tests read across them and compare with a plain consumer.
Not tested here: compaction (tests/kafka/test_real_broker.py has what else the broker adds).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.errors import ConfigError, ModeswitchError, OffsetOutOfRangeError
from modeswitch.sources import open_log
from modeswitch.sources.kafka import NOT_UTF8_PREFIX, KafkaLocation, KafkaLog

BASE_MS = 1_700_000_000_000  # as in conftest


def _topic(source: str) -> str:
    return KafkaLocation.parse(source).topic


def plain_read(cluster: KafkaBroker, topic: str, partition: int, start: int, end: int):
    """What a plain read_committed consumer gets for [start, end): (offset, key, value)."""
    consumer = Consumer(
        {
            **cluster.config,
            "group.id": "plain",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, partition, start)])
    out = []
    try:
        while True:
            message = consumer.poll(5)
            assert message is not None, "the plain consumer got nothing for 5 s"
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF
                break
            if message.offset() >= end:
                break
            out.append((message.offset(), message.key().decode(), message.value().decode()))
    finally:
        consumer.close()
    return out


def test_exact_range_reads_equal_a_plain_consumer_across_transaction_gaps(
    kafka_cluster: KafkaBroker, new_topic: Callable[[int], str], transactions
) -> None:
    source = new_topic(3)
    topic = _topic(source)
    transactions(topic, partitions=3, transactions=40)
    log = open_log(source)
    assert isinstance(log, KafkaLog) and not log.contiguous
    latest = log.latest_offsets()
    rng = random.Random(1)
    gaps = 0
    for partition in log.buckets():
        ranges = [(0, latest[partition])]
        for _ in range(6):
            a, b = sorted(rng.randrange(latest[partition] + 1) for _ in range(2))
            ranges.append((a, b))
        for start, end in ranges:
            rows = [
                row
                for batch in log.read(partition, start, end)
                for row in zip(
                    batch.column("offset").to_pylist(),
                    batch.column("key").to_pylist(),
                    batch.column("value").to_pylist(),
                    strict=True,
                )
            ]
            assert rows == plain_read(kafka_cluster, topic, partition, start, end), (
                partition,
                start,
                end,
            )
            held = log.held_offsets(partition, start, end).tolist()
            assert held == [offset for offset, _, _ in rows]
        gaps += latest[partition] - len(log.held_offsets(partition, 0, latest[partition]))
    assert gaps >= 40, "every transaction leaves a marker: the offsets must have gaps"
    log.close()


def test_ranges_of_every_partition_read_at_once_equal_a_plain_consumer(
    kafka_cluster: KafkaBroker, new_topic: Callable[[int], str], transactions
) -> None:
    """One consumer for a wave's or a micro-batch's ranges (read_ranges): each partition's
    records exactly as a plain consumer reads them, across transaction gaps, with a split
    bucket's pieces joined and a range that is not next to the one before read after it."""
    source = new_topic(3)
    topic = _topic(source)
    transactions(topic, partitions=3, transactions=40)
    log = open_log(source)
    latest = log.latest_offsets()
    rng = random.Random(2)
    for _ in range(4):
        ranges = []
        for partition in log.buckets():
            a, b = sorted(rng.randrange(3, latest[partition] + 1) for _ in range(2))
            middle = (a + b) // 2
            ranges += [(partition, a, middle), (partition, middle, b)]  # a split bucket
        first = ranges[0][1]
        ranges.append((0, first - 3, first))  # partition 0 again, before: a second round
        got: dict[tuple[int, int, int], list] = {r: [] for r in ranges}
        for batch in log.read_ranges(ranges):
            partition = batch.column("bucket")[0].as_py()
            for offset, key, value in zip(
                batch.column("offset").to_pylist(),
                batch.column("key").to_pylist(),
                batch.column("value").to_pylist(),
                strict=True,
            ):
                owner = next(r for r in ranges if r[0] == partition and r[1] <= offset < r[2])
                got[owner].append((offset, key, value))
        for partition, start, end in ranges:
            expected = plain_read(kafka_cluster, topic, partition, start, end)
            assert got[partition, start, end] == expected, (partition, start, end)
    with pytest.raises(OffsetOutOfRangeError):
        list(log.read_ranges([(0, 0, 1), (1, 0, latest[1] + 5)]))
    log.close()


def test_event_time_from_the_timestamp_or_a_json_field_and_offset_at(
    kafka_cluster: KafkaBroker, new_topic: Callable[[int], str]
) -> None:
    source = new_topic(1)
    topic = _topic(source)
    producer = Producer(kafka_cluster.config)
    for n in range(50):
        field = {"at": BASE_MS + n * 1000 + 500} if n != 7 else {}
        producer.produce(
            topic, json.dumps(field).encode(), partition=0, timestamp=BASE_MS + n * 1000
        )
    producer.flush(10)
    by_stamp = next(iter(open_log(source).read(0, 0, 50)))
    assert by_stamp.column("event_time")[3].as_py() == datetime.fromtimestamp(
        (BASE_MS + 3000) / 1000, UTC
    )
    by_field = next(iter(KafkaLog(f"{source}?event_time=at").read(0, 0, 50)))
    assert by_field.column("event_time")[3].as_py() == datetime.fromtimestamp(
        (BASE_MS + 3500) / 1000, UTC
    )
    # No field: the message timestamp stays.
    assert by_field.column("event_time")[7] == by_stamp.column("event_time")[7]
    log = open_log(source)
    at = datetime.fromtimestamp((BASE_MS + 20_500) / 1000, UTC)
    assert log.offset_at(at) == {0: 21}
    assert log.offset_at(datetime.fromtimestamp(BASE_MS / 1000 - 60, UTC)) == {0: 0}
    assert log.offset_at(datetime.fromtimestamp(BASE_MS / 1000 + 3600, UTC)) == {0: 50}


def test_undecodable_bytes_are_kept_for_the_quarantine(
    kafka_cluster: KafkaBroker, new_topic: Callable[[int], str]
) -> None:
    source = new_topic(1)
    producer = Producer(kafka_cluster.config)
    producer.produce(_topic(source), b"\xff\xfe{}", key=b"\xc3", partition=0)
    producer.produce(_topic(source), None, key=b"tombstone", partition=0)
    producer.flush(10)
    batch = next(iter(open_log(source).read(0, 0, 2)))
    assert batch.column("value").to_pylist() == [NOT_UTF8_PREFIX + "//57fQ==", None]
    assert batch.column("key").to_pylist() == [NOT_UTF8_PREFIX + "ww==", "tombstone"]


def test_bad_input_is_refused_with_a_clear_error(
    kafka_cluster: KafkaBroker, new_topic: Callable[[int], str]
) -> None:
    source = new_topic(2)
    topic = _topic(source)
    producer = Producer(kafka_cluster.config)
    for _ in range(30):
        producer.produce(topic, b"{}", partition=0)
    producer.flush(10)
    log = open_log(source)
    # Offsets below retention: the error names the bucket and the dropped offsets.
    kafka_cluster.delete_records(topic, 0, 10)
    with pytest.raises(OffsetOutOfRangeError, match=r"bucket 0: offset 5 .* records \[5, 10\)"):
        list(log.read(0, 5, 20))
    with pytest.raises(OffsetOutOfRangeError, match="beyond the latest offset 30"):
        list(log.read(0, 10, 31))
    with pytest.raises(ModeswitchError, match="bucket 9 does not exist"):
        list(log.read(9, 0, 1))
    # An unreachable broker: an error naming it, in bounded time.
    began = time.monotonic()
    with pytest.raises(ModeswitchError, match=r"kafka 127\.0\.0\.1:9: .* failed within"):
        KafkaLog(source, {"bootstrap.servers": "127.0.0.1:9"}).latest_offsets()
    assert time.monotonic() - began < 30
    with pytest.raises(ConfigError, match=r"no Kafka bootstrap\.servers"):
        KafkaLog(source, {})
    with pytest.raises(ConfigError, match="unknown parameter"):
        KafkaLog(f"{source}?partitions=3")
