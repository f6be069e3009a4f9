"""What librdkafka's mock cluster could not show, on a real Apache Kafka broker (KRaft, from the
jars of jvm/kafka-broker/pom.xml, started and stopped by this module through
:class:`modeswitch.devtools.kafka_broker.KafkaBroker`):

- a transactional producer's aborted records are hidden under ``read_committed``, and an open
  transaction holds the topic's end at the last stable offset, in our Kafka source and in
  Spark's own (``format("kafka")``, on every session's class path from jvm/pom.xml);
- ``offsets_for_times`` answers (the mock answered -1, so the source searched by timestamps);
- records survive a SIGKILLed broker that is started again on its data.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, TopicPartition

from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.sources.kafka import SCHEME, KafkaLog

BASE_MS = (int(time.time()) // 3600 - 24) * 3_600_000
"""Message timestamps: record ``n`` at ``BASE_MS + n`` seconds, from a day ago (a broker refuses
timestamps more than an hour ahead, and its retention deletes those older than a week)."""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    with KafkaBroker(tmp_path_factory.mktemp("kafka-broker")) as running:
        yield running


class Transactions:
    """One transactional producer writing to partition 0 of ``topic``; record ``n`` is
    ``{"n": n}`` with timestamp ``BASE_MS + n`` s."""

    def __init__(self, broker: KafkaBroker, topic: str) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.producer = Producer({**broker.config, "transactional.id": f"{topic}-tx"})
        self.producer.init_transactions(60)
        self.n = 0

    def write(self, records: int, *, then: str) -> list[int]:
        """Produce ``records`` in a transaction, then ``commit``, ``abort`` or leave it ``open``;
        returns their numbers."""
        self.producer.begin_transaction()
        numbers = list(range(self.n, self.n + records))
        for n in numbers:
            self.producer.produce(
                self.topic, json.dumps({"n": n}).encode(), partition=0, timestamp=BASE_MS + n * 1000
            )
        self.n += records
        self.producer.flush(30)
        if then == "commit":
            self.producer.commit_transaction(60)
        elif then == "abort":
            self.producer.abort_transaction(60)
        return numbers

    def close(self) -> None:
        self.producer.flush(30)


def _settles_at(log: KafkaLog, end: dict[int, int], timeout: float = 30) -> None:
    """Wait until the topic's end (its last stable offset, under read_committed) is ``end``: a
    producer's commit or abort returns before the broker has written the transaction's markers,
    and the end moves only once they are written (seen here: 22 right after a commit that
    takes it to 26, on a broker whose transaction coordinator was still loading)."""
    deadline = time.monotonic() + timeout
    while (latest := log.latest_offsets()) != end:
        assert time.monotonic() < deadline, f"the end stayed at {latest}, not {end}"
        time.sleep(0.1)


def _numbers(log: KafkaLog, start: int, end: int) -> list[int]:
    values = [v for b in log.read(0, start, end) for v in b.column("value").to_pylist()]
    return [json.loads(v)["n"] for v in values]


def test_aborted_records_are_hidden_and_an_open_transaction_holds_the_end(
    broker: KafkaBroker,
) -> None:
    broker.create_topic("tx-source", 1)
    writer = Transactions(broker, "tx-source")
    log = KafkaLog(f"{SCHEME}tx-source", broker.config)
    try:
        committed = writer.write(10, then="commit")  # offsets 0-9, marker 10
        writer.write(5, then="abort")  # 11-15, marker 16
        more = writer.write(4, then="commit")  # 17-20, marker 21
        writer.write(3, then="open")  # 22-24: not yet decided
        # read_committed: the end is the last stable offset, the open transaction's first.
        _settles_at(log, {0: 22})
        time.sleep(1)
        assert log.latest_offsets() == {0: 22}  # and stays there while it is open
        assert _numbers(log, 0, 22) == committed + more
        assert log.held_offsets(0, 0, 22).tolist() == [*range(10), *range(17, 21)]
        writer.producer.commit_transaction(60)  # decided: the end moves past its marker
        _settles_at(log, {0: 26})
        assert _numbers(log, 22, 26) == [19, 20, 21]
    finally:
        writer.close()
        log.close()


def test_offsets_for_times_answers_on_a_real_broker(broker: KafkaBroker) -> None:
    broker.create_topic("tx-times", 1)
    writer = Transactions(broker, "tx-times")
    log = KafkaLog(f"{SCHEME}tx-times", broker.config)
    try:
        writer.write(20, then="commit")  # offsets 0-19, record n at BASE_MS + n s
        consumer = Consumer({**broker.config, "group.id": "times"})
        try:
            [answer] = consumer.offsets_for_times(
                [TopicPartition("tx-times", 0, BASE_MS + 7_500)], timeout=30
            )
        finally:
            consumer.close()
        assert answer.offset == 8  # the broker's own answer, not the source's search
        moment = datetime.fromtimestamp((BASE_MS + 12_000) / 1000, UTC)
        assert log.offset_at(moment) == {0: 12}
    finally:
        writer.close()
        log.close()


def test_sparks_kafka_source_reads_an_exact_range_of_committed_records(
    spark, broker: KafkaBroker
) -> None:
    broker.create_topic("tx-spark", 2)
    writer = Transactions(broker, "tx-spark")
    try:
        first = writer.write(6, then="commit")  # partition 0: offsets 0-5, marker 6
        writer.write(4, then="abort")  # 7-10, marker 11
        second = writer.write(5, then="commit")  # 12-16, marker 17
        writer.write(2, then="open")  # 18-19
        with contextlib.closing(KafkaLog(f"{SCHEME}tx-spark", broker.config)) as log:
            _settles_at(log, {0: 18, 1: 0})  # the second commit's marker is written
        assign = {"tx-spark": [0, 1]}
        frame = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("kafka.isolation.level", "read_committed")
            .option("assign", json.dumps(assign))
            .option("startingOffsets", json.dumps({"tx-spark": {"0": 3, "1": 0}}))
            .option("endingOffsets", json.dumps({"tx-spark": {"0": 18, "1": 0}}))  # exclusive
            .load()
        )
        rows = frame.selectExpr("partition", "offset", "CAST(value AS STRING) AS value").collect()
        got = sorted((r.partition, r.offset, json.loads(r.value)["n"]) for r in rows)
        offsets = [*range(3, 6), *range(12, 17)]
        assert got == [(0, o, n) for o, n in zip(offsets, first[3:] + second, strict=True)]
    finally:
        writer.producer.commit_transaction(60)
        writer.close()


def test_records_survive_a_killed_broker_started_again_on_its_data(tmp_path: Path) -> None:
    """A completed transaction (its commit marker written: the end has moved past it) survives
    a SIGKILLed broker. What happens to one killed between the client's commit and its markers
    is for the broker-fault tests: twice here the restarted broker completed it, once it held
    the end at the transaction's start for over a minute."""
    with KafkaBroker(tmp_path / "broker") as own:
        own.create_topic("durable", 1)
        writer = Transactions(own, "durable")
        written = writer.write(30, then="commit")
        writer.close()
        del writer
        log = KafkaLog(f"{SCHEME}durable", own.config)
        try:
            deadline = time.monotonic() + 30
            while log.latest_offsets() != {0: 31}:  # 30 records and the commit marker
                assert time.monotonic() < deadline, "the commit marker was never written"
                time.sleep(0.2)
        finally:
            log.close()
        pid = own.process.pid if own.process else None
        assert pid is not None
        # Its temporary files are in its own folder (a killed broker's stay there, not in /tmp).
        assert f"-Djava.io.tmpdir={tmp_path / 'broker' / 'tmp'}" in psutil.Process(pid).cmdline()
        own.kill()
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)  # the whole group is gone
        own.start()
        log = KafkaLog(f"{SCHEME}durable", own.config)
        try:
            # 31: the records and the commit marker. 32 when the transaction coordinator had
            # written the markers but not yet logged the transaction complete when it was
            # killed: it then writes the marker again once it is back (seen once, in a whole
            # run). Either way the records are there, once.
            [end] = log.latest_offsets().values()
            assert end in (31, 32), end
            assert _numbers(log, 0, end) == written
        finally:
            log.close()
    assert own.process is None
