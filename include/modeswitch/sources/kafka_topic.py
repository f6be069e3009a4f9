"""A Kafka topic's partitions and offsets, asked of its brokers: :class:`KafkaTopic`.

What the planner and the policy need of a topic, with no record read for it: its partitions
(the log's buckets), each one's earliest and latest offsets (a request to its leader, asked
again while a partition has none), the first offset at or after a time (Kafka's time index),
and whether the topic is compacted. :class:`~modeswitch.sources.kafka.KafkaLog` reads and
writes the records on top of it; the client configuration is resolved there.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from modeswitch.errors import ModeswitchError, SourceUnavailableError, TopicNotFoundError
from modeswitch.offsets import OffsetsMap

client_log = logging.getLogger("modeswitch.sources.kafka")
"""Where librdkafka's clients log (its ``logger`` setting): the consumers and admin client
here and :class:`~modeswitch.sources.kafka.KafkaLog`'s producer under one name."""

METADATA_TIMEOUT = 10.0
"""Seconds a metadata or offsets request may take before the broker counts as unreachable."""
LEADER_RETRY_PAUSE = 0.2
"""Seconds between asks while a partition has no leader."""
_NO_LEADER_CODES = ("NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE")


def _between_leaders(exc: BaseException) -> bool:
    """Whether a client error says the partition has no leader right now: an answer the
    broker changes within seconds, unlike an unreachable broker or a missing topic."""
    error = exc.args[0] if exc.args else None
    kafka = confluent()
    codes = {getattr(kafka.KafkaError, name) for name in _NO_LEADER_CODES}
    return isinstance(error, kafka.KafkaError) and error.code() in codes


def confluent() -> Any:
    """The ``confluent_kafka`` module, imported on first use (it loads librdkafka)."""
    import confluent_kafka

    return confluent_kafka


class KafkaTopic:
    """A topic's partitions and offsets, through one metadata consumer opened on first use;
    see the module docstring. ``config`` holds librdkafka settings, ``bootstrap.servers``
    among them."""

    def __init__(self, topic: str, config: Mapping[str, str]) -> None:
        self.topic = topic
        self.config = dict(config)
        self._consumer: Any = None
        self._compacting: bool | None = None

    @property
    def compacting(self) -> bool:
        """True when the topic's ``cleanup.policy`` includes ``compact`` (asked once)."""
        if self._compacting is None:
            self._compacting = "compact" in self._topic_config("cleanup.policy").split(",")
        return self._compacting

    def _topic_config(self, name: str) -> str:
        from confluent_kafka.admin import AdminClient, ConfigResource

        admin = AdminClient({**self.config, "logger": client_log})
        resource = ConfigResource(ConfigResource.Type.TOPIC, self.topic)
        try:
            described = admin.describe_configs([resource], request_timeout=METADATA_TIMEOUT)
            entries = described[resource].result(timeout=METADATA_TIMEOUT)
        except Exception as exc:
            raise self._unreachable(f"its config {name}", exc) from exc
        return entries[name].value or ""

    @property
    def servers(self) -> str:
        return self.config["bootstrap.servers"]

    def _client_config(self, **extra: Any) -> dict[str, Any]:
        config: dict[str, Any] = {
            "group.id": f"modeswitch-{self.topic}",  # required by librdkafka; never committed
            "isolation.level": "read_committed",
            **self.config,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "socket.connection.setup.timeout.ms": int(METADATA_TIMEOUT * 1000),
            "fetch.wait.max.ms": 50,  # a range ending in a transaction marker ends at EOF
            **extra,
        }
        config.setdefault("logger", client_log)
        return config

    def _metadata_consumer(self) -> Any:
        if self._consumer is None:
            self._consumer = confluent().Consumer(self._client_config())
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _unreachable(self, what: str, exc: BaseException) -> SourceUnavailableError:
        self.close()  # a client left to retry would log each failed connection, for ever
        return SourceUnavailableError(
            f"kafka {self.servers}: {what} of topic {self.topic!r} failed within "
            f"{METADATA_TIMEOUT:.0f} s ({exc}); is the broker reachable and the topic there?"
        )

    def buckets(self) -> list[int]:
        """The topic's partitions, asked each time: a partition added to a running topic is
        a new bucket at the next plan."""
        kafka = confluent()
        try:
            meta = self._metadata_consumer().list_topics(self.topic, timeout=METADATA_TIMEOUT)
        except kafka.KafkaException as exc:
            raise self._unreachable("metadata", exc) from exc
        topic = meta.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            why = f" ({topic.error.str()})" if topic is not None and topic.error else ""
            raise TopicNotFoundError(
                f"kafka {self.servers}: topic {self.topic!r} does not exist{why}; topics there: "
                f"{sorted(t for t in meta.topics if not t.startswith('__'))[:20]}"
            )
        return sorted(topic.partitions)

    def _watermarks(self) -> dict[int, tuple[int, int]]:
        return {partition: self._watermark(partition) for partition in self.buckets()}

    def _watermark(self, partition: int) -> tuple[int, int]:
        """``(earliest, latest)`` of one partition: a request to its leader, asked again
        within :data:`METADATA_TIMEOUT` while the partition has none (a topic just created,
        a leader moving or restarting)."""
        kafka = confluent()
        tp = kafka.TopicPartition(self.topic, partition)
        deadline = time.monotonic() + METADATA_TIMEOUT
        while True:
            left = deadline - time.monotonic()
            try:
                return self._metadata_consumer().get_watermark_offsets(tp, timeout=max(left, 0.1))
            except kafka.KafkaException as exc:
                if not (_between_leaders(exc) and left > LEADER_RETRY_PAUSE):
                    raise self._unreachable(f"offsets of partition {partition}", exc) from exc
            time.sleep(LEADER_RETRY_PAUSE)

    def earliest_offsets(self) -> OffsetsMap:
        return {b: low for b, (low, _) in self._watermarks().items()}

    def latest_offsets(self) -> OffsetsMap:
        return {b: high for b, (_, high) in self._watermarks().items()}

    def offset_at(self, event_time: datetime) -> OffsetsMap:
        """Per partition, the first offset whose message timestamp is at or after
        ``event_time``: Kafka's ``offsets_for_times``. A broker that answers "none" while
        the partition's newest message is newer (librdkafka's mock cluster does) is answered
        by a binary search over message timestamps instead."""
        kafka = confluent()
        millis = int(event_time.timestamp() * 1000)
        marks = self._watermarks()
        consumer = self._metadata_consumer()
        asked = [kafka.TopicPartition(self.topic, b, millis) for b in marks]
        try:
            found = consumer.offsets_for_times(asked, timeout=METADATA_TIMEOUT)
        except kafka.KafkaException as exc:
            raise self._unreachable("offsets_for_times", exc) from exc
        result = {}
        for tp in found:
            low, high = marks[tp.partition]
            if tp.offset >= 0:
                result[tp.partition] = max(low, min(tp.offset, high))
            else:
                result[tp.partition] = self._search_time(tp.partition, low, high, millis)
        return result

    def _search_time(self, partition: int, low: int, high: int, millis: int) -> int:
        """The first position in ``[low, high]`` from which the next record's timestamp is
        >= ``millis`` (``high`` if none): a binary search, one probe read per step, assuming
        timestamps grow with offsets as Kafka's time index does."""
        kafka = confluent()
        consumer = kafka.Consumer(self._client_config())
        try:
            lo, hi = low, high
            while lo < hi:
                mid = (lo + hi) // 2
                consumer.assign([kafka.TopicPartition(self.topic, partition, mid)])
                found = self._probe(consumer, partition, mid)
                if found is None or found[1] >= millis:
                    hi = mid
                else:
                    lo = found[0] + 1
            return lo
        finally:
            consumer.close()

    def _probe(self, consumer: Any, partition: int, start: int) -> tuple[int, int] | None:
        """(offset, timestamp in ms) of the first record at or after ``start``, or None."""
        kafka = confluent()
        deadline = time.monotonic() + METADATA_TIMEOUT
        while time.monotonic() < deadline:
            for message in consumer.consume(1, timeout=1.0):
                error = message.error()
                if error is None:
                    return message.offset(), message.timestamp()[1]
                if error.code() == kafka.KafkaError._PARTITION_EOF:
                    return None
                raise ModeswitchError(
                    f"kafka {self.servers}: topic {self.topic!r} partition {partition}: read "
                    f"at {start} failed: {error.str()}"
                )
        raise ModeswitchError(
            f"kafka {self.servers}: topic {self.topic!r} partition {partition}: no answer in "
            f"{METADATA_TIMEOUT:.0f} s reading at offset {start}"
        )
