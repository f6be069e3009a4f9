"""A Kafka topic as a bucketed log: partitions are buckets, Kafka offsets are offsets.

The source setting ``kafka://<topic>`` names it; the client configuration (librdkafka
settings: ``bootstrap.servers``, ``security.protocol``, ``sasl.*``, ...) comes from the
environment variable ``MODESWITCH_KAFKA_CONFIG`` (a JSON object), or from
:func:`kafka_config_scope` (what the Airflow tasks do with the ``kafka_connection``
setting's Connection). The configuration is never part of a setting, an option, a command
line or a log line: it holds secrets.

What this log promises, and what it does not:

- **Offsets have gaps.** Transaction markers, aborted transactions (read with
  ``isolation.level=read_committed``, the default here) and compaction leave offsets with no
  record. ``read(bucket, start, end)`` yields the records the topic holds in ``[start, end)``
  and is complete once the consumer's position has passed ``end - 1``, not once it has counted
  ``end - start`` records; :meth:`KafkaLog.held_offsets` lists what a range actually holds.
- **No consumer-group commits**: ranges are read with ``assign()`` at exact offsets, and the
  offsets that count live in the Delta sink.
- **Event time** is the message's timestamp, or with ``kafka://<topic>?event_time=<field>``
  a top-level field of the JSON value (epoch milliseconds or an ISO-8601 string); a record
  whose field is missing or unreadable keeps its message timestamp. ``offset_at`` always
  answers by message timestamp (Kafka's time index).
- **Undecodable bytes are kept, not dropped**: a key or value that is not UTF-8 becomes
  :data:`NOT_UTF8_PREFIX` followed by the bytes in base64, which the transform quarantines
  with the reason ``value is not UTF-8``.
- **Headers** are read only with ``kafka://<topic>?headers=true``: a ``headers`` column after
  the others (:data:`~modeswitch.sources.base.HEADERS_FIELD`: each header's key as text, its
  value as bytes, in the order written; null for a record without headers), as Spark's Kafka
  source gives them with ``includeHeaders``.

A topic's partitions and offsets (asked of the brokers, no record read) are
:class:`~modeswitch.sources.kafka_topic.KafkaTopic`'s, which :class:`KafkaLog` extends with
reading and writing records. The ``kafka://`` URL itself is parsed in
:mod:`modeswitch.control.locations`, below the settings that check it; :class:`KafkaLocation`
and :func:`is_kafka_source` are re-exported here.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import contextvars
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa

from modeswitch.control.locations import SCHEME, KafkaLocation, is_kafka_source
from modeswitch.environment import KAFKA_CONFIG, env_value
from modeswitch.errors import (
    ConfigError,
    ModeswitchError,
    OffsetOutOfRangeError,
    SourceUnavailableError,
    UnknownBucketError,
)
from modeswitch.sources.base import HEADERS_FIELD, RECORD_SCHEMA, check_range
from modeswitch.sources.kafka_reads import partition_runs, read_rounds
from modeswitch.sources.kafka_topic import KafkaTopic, confluent

log = logging.getLogger(__name__)

ENV_KAFKA_CONFIG = KAFKA_CONFIG.name
NOT_UTF8_PREFIX = "\ufffdbase64:"
"""What an undecodable key or value starts with; the base64 of its bytes follows. U+FFFD
cannot begin JSON, so such a value never parses as a record."""
BATCH_RECORDS = 65_536
CONSUME_BATCH = 10_000
READ_IDLE_TIMEOUT = 30.0
"""Seconds a range read may go without a message before it gives up."""

_config_scope: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "modeswitch_kafka_config", default=None
)


def kafka_config(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The librdkafka settings in force: :func:`kafka_config_scope`'s, else
    ``MODESWITCH_KAFKA_CONFIG``'s. A malformed variable is refused without repeating it."""
    scoped = _config_scope.get()
    if scoped is not None and environ is None:
        return dict(scoped)
    return env_value(KAFKA_CONFIG, environ)


@contextlib.contextmanager
def kafka_config_scope(config: Mapping[str, str] | None) -> Iterator[None]:
    """Within the block, logs opened in this context use ``config`` (None: no change). Not
    the process environment: child processes get it only through :func:`kafka_environment`."""
    if config is None:
        yield
        return
    token = _config_scope.set(dict(config))
    try:
        yield
    finally:
        _config_scope.reset(token)


def kafka_environment(config: Mapping[str, str]) -> dict[str, str]:
    """The environment entry that hands ``config`` to a child process (``{}`` for none)."""
    if not config:
        return {}
    return {ENV_KAFKA_CONFIG: json.dumps(dict(config), sort_keys=True)}


class KafkaLog(KafkaTopic):
    """A topic, read by partition and exact offsets; see the module docstring."""

    contiguous = False  # transaction markers, aborted transactions and compaction leave gaps
    parquet_files = False  # records come from the brokers, never from files Spark could read
    spark_source = "kafka"  # Spark's own Kafka source (modeswitch.sources.spark_kafka)
    client_config = True  # librdkafka's settings: the kafka_connection, MODESWITCH_KAFKA_CONFIG

    def __init__(self, source: str, config: Mapping[str, str] | None = None) -> None:
        self.location = KafkaLocation.parse(source)
        config = dict(kafka_config() if config is None else config)
        if not config.get("bootstrap.servers"):
            raise ConfigError(
                f"source {source!r}: no Kafka bootstrap.servers; set {ENV_KAFKA_CONFIG} (a "
                'JSON object such as {"bootstrap.servers": "broker:9092"}) or, under Airflow, '
                "the kafka_connection setting's Connection"
            )
        super().__init__(self.location.topic, config)
        self._writer: Any = None
        self._reading: Any = None

    def __str__(self) -> str:
        """With its brokers: a Java client's errors name a partition, not where it was."""
        return f"{SCHEME}{self.topic} at {self.servers}"

    def __repr__(self) -> str:
        return f"KafkaLog({self})"

    @property
    def event_time_indexed(self) -> bool:
        """Kafka's time index holds message timestamps: it indexes the event time only when
        that is the message timestamp (no ``event_time`` field in the source)."""
        return self.location.event_time_field is None

    def close(self) -> None:
        super().close()
        self._close_reader()
        if self._writer is not None:
            self._writer.flush(10)
            self._writer = None

    # -- BucketedLog ------------------------------------------------------------------------

    def held_offsets(self, bucket: int, start: int, end: int) -> np.ndarray:
        """The offsets in ``[start, end)`` that hold a record (gaps left out), ascending."""
        parts = [b.column("offset").to_numpy() for b in self.read(bucket, start, end)]
        return np.concatenate(parts) if parts else np.array([], dtype=np.int64)

    def read(self, bucket: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        yield from self.read_ranges([(bucket, start, end)])

    def read_ranges(self, ranges: Sequence[tuple[int, int, int]]) -> Iterator[pa.RecordBatch]:
        """The records of every ``(bucket, start, end)`` range, each checked as :meth:`read`
        checks one, read by one consumer assigned to all of them: a micro-batch's ranges
        over every partition cost one consumer's start and one fetch round, not one per
        partition."""
        what = f"kafka topic {self.topic!r}"
        known = self.buckets()
        for bucket, _, _ in ranges:
            if bucket not in known:
                raise UnknownBucketError(
                    f"{what}: bucket {bucket} does not exist (buckets are {known})"
                )
        ends = {bucket: self._watermark(bucket) for bucket in {b for b, _, _ in ranges}}
        for bucket, start, end in ranges:
            low, high = ends[bucket]
            check_range(
                bucket, start, end, earliest={bucket: low}, latest={bucket: high}, what=what
            )
        for round_ in read_rounds(ranges):
            yield from self._read(round_)

    # -- reading ----------------------------------------------------------------------------

    def _read(self, ranges: Mapping[int, tuple[int, int]]) -> Iterator[pa.RecordBatch]:
        """The records of ``[start, end)`` of each partition (``{partition: (start, end)}``):
        a partition is done when its position passes ``end - 1``."""
        ranges = {p: (start, end) for p, (start, end) in ranges.items() if start < end}
        if not ranges:
            return
        kafka = confluent()
        consumer = self._reader()
        columns = {
            p: _Columns(self.location.event_time_field, headers=self.location.headers)
            for p in ranges
        }
        at = {p: start for p, (start, _) in ranges.items()}  # the next offset to come
        reading = set(ranges)
        try:
            consumer.assign([kafka.TopicPartition(self.topic, p, at[p]) for p in ranges])
            idle_since = time.monotonic()
            while reading:
                # consume(n) waits for n messages or the timeout: ask for no more than the
                # ranges can still hold, so a read ends as soon as its last record arrives
                # (a range that ends in a transaction marker ends at EOF or the timeout).
                left = sum(ranges[p][1] - at[p] for p in reading)
                messages = consumer.consume(max(1, min(CONSUME_BATCH, left)), timeout=0.1)
                if not messages:
                    self._check_positions(consumer, reading, ranges, idle_since)
                    continue
                idle_since = time.monotonic()
                for partition, run, failed in partition_runs(messages):
                    if partition not in reading:
                        continue  # a partition read to its end: what follows is not wanted
                    if failed is not None:
                        if self._at_eof(partition, failed, ranges[partition]):
                            reading.discard(partition)
                        continue
                    # Records come in offset order: the runs between errors are taken a field
                    # at a time, by list comprehensions (2-7 % less CPU for the whole read
                    # than one loop over the records).
                    if columns[partition].take(run, ranges[partition][1]):
                        reading.discard(partition)
                    at[partition] = run[-1].offset() + 1
                    if len(columns[partition]) >= BATCH_RECORDS:
                        yield columns[partition].batch(partition)
            consumer.unassign()  # no fetching past the ranges until the next read
            for partition, gathered in columns.items():
                if len(gathered):
                    yield gathered.batch(partition)
        except kafka.KafkaException as exc:
            self._close_reader()
            raise SourceUnavailableError(
                f"kafka {self.servers}: topic {self.topic!r}: reading partitions "
                f"{sorted(ranges)} failed: {exc}"
            ) from exc
        except BaseException:
            self._close_reader()  # left mid-read (an error, a reader that stopped pulling)
            raise

    def _reader(self) -> Any:
        """The consumer this log reads with, kept from read to read (each assigns it afresh:
        librdkafka drops what it fetched for the assignment before): starting one and its
        first fetch cost 15-30 ms here, most of a live micro-batch's read."""
        if self._reading is None:
            self._reading = confluent().Consumer(
                self._client_config(
                    **{"fetch.max.bytes": 52_428_800, "queued.min.messages": 200_000}
                )
            )
        return self._reading

    def _close_reader(self) -> None:
        if self._reading is not None:
            reading, self._reading = self._reading, None
            reading.close()

    def _check_positions(
        self,
        consumer: Any,
        reading: set[int],
        ranges: Mapping[int, tuple[int, int]],
        idle_since: float,
    ) -> None:
        """After a wait with no message: the partitions whose position passed their end are
        read; one still short after :data:`READ_IDLE_TIMEOUT` fails the read."""
        kafka = confluent()
        positions = consumer.position([kafka.TopicPartition(self.topic, p) for p in reading])
        for position in positions:
            if position.offset >= ranges[position.partition][1]:
                reading.discard(position.partition)
        if reading and time.monotonic() - idle_since > READ_IDLE_TIMEOUT:
            partition = min(reading)
            start, end = ranges[partition]
            at = next(p.offset for p in positions if p.partition == partition)
            raise SourceUnavailableError(
                f"kafka {self.servers}: topic {self.topic!r} partition {partition}: "
                f"no record for {READ_IDLE_TIMEOUT:.0f} s while reading offsets "
                f"[{start}, {end}) (at {at}); an open transaction "
                "holds the read back, or the broker is unreachable"
            )

    def _at_eof(self, partition: int, failed: Any, range_: tuple[int, int]) -> bool:
        """True when the message ``failed`` (an error) is the partition's end at or past the
        range's end; an EOF before it is passed over; any other error fails the read, naming
        the range."""
        kafka = confluent()
        start, end = range_
        error = failed.error()
        if error.code() == kafka.KafkaError._PARTITION_EOF:
            return failed.offset() >= end
        if error.code() == kafka.KafkaError.OFFSET_OUT_OF_RANGE:
            raise OffsetOutOfRangeError(
                f"kafka topic {self.topic!r} partition {partition}: offsets "
                f"[{start}, {end}) are no longer retained ({error.str()}); "
                "rewind the pipeline to the earliest offsets to go on"
            )
        raise SourceUnavailableError(
            f"kafka {self.servers}: topic {self.topic!r} partition "
            f"{partition}: read of [{start}, {end}) failed: {error.str()}"
        )

    # -- writing (the producer CLI, demos, tests) -------------------------------------------

    def _producer(self) -> Any:
        if self._writer is None:
            self._writer = confluent().Producer(
                {
                    "compression.type": "zstd",
                    "linger.ms": 20,
                    "batch.num.messages": 10_000,
                    "queue.buffering.max.messages": 1_000_000,
                    **self.config,
                    "logger": log,
                }
            )
        return self._writer

    def write_events(self, events: pa.Table) -> dict[int, int]:
        """Produce ``events`` (columns bucket, event_time, key, value): each to the partition
        its bucket names, timestamped with its event time. Returns the count per partition;
        waits until every message is acknowledged."""
        producer = self._producer()
        buckets = events.column("bucket").to_pylist()
        stamps = (events.column("event_time").cast(pa.int64()).to_numpy() // 1000).tolist()
        keys = events.column("key").to_pylist()
        values = events.column("value").to_pylist()
        counts: dict[int, int] = {}
        failures: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        produce = producer.produce
        for bucket, stamp, key, value in zip(buckets, stamps, keys, values, strict=True):
            while True:
                try:
                    produce(
                        self.topic,
                        value=value,
                        key=key,
                        partition=bucket,
                        timestamp=stamp,
                        on_delivery=delivered,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            counts[bucket] = counts.get(bucket, 0) + 1
        left = producer.flush(60)
        if left or failures:
            raise ModeswitchError(
                f"kafka {self.servers}: {left} messages to topic {self.topic!r} not delivered "
                f"in 60 s; errors: {failures[:3]}"
            )
        return counts


class _Columns:
    """Raw record columns being gathered for one Arrow batch: decoded a batch at a time
    (one vectorised UTF-8 check per column; per record only where it fails). With
    ``headers``, the records' headers too, as librdkafka gives them (a list of ``(key,
    value)`` pairs in the order written, or None), into :data:`HEADERS_FIELD`."""

    def __init__(self, field: str | None, *, headers: bool = False) -> None:
        self.field = field
        self.schema = pa.schema([*RECORD_SCHEMA, *([HEADERS_FIELD] if headers else [])])
        self.offsets: list[int] = []
        self.stamps: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[list[tuple[str, bytes | None]] | None] | None = [] if headers else None

    def __len__(self) -> int:
        return len(self.offsets)

    def take(self, messages: list[Any], end: int) -> bool:
        """Add the records of ``messages`` (no errors among them) below ``end``; True when
        the range is read: a record at or past ``end - 1`` was seen."""
        if not messages:
            return False
        offsets = [m.offset() for m in messages]
        done = offsets[-1] >= end - 1
        if offsets[-1] >= end:
            cut = bisect.bisect_left(offsets, end)
            messages, offsets = messages[:cut], offsets[:cut]
        self.offsets += offsets
        self.stamps += [m.timestamp()[1] for m in messages]
        self.keys += [m.key() for m in messages]
        self.values += [m.value() for m in messages]
        if self.headers is not None:
            self.headers += [m.headers() for m in messages]
        return done

    def batch(self, partition: int) -> pa.RecordBatch:
        n = len(self.offsets)
        values = _utf8(self.values)
        micros = np.array(self.stamps, dtype=np.int64) * 1000
        if self.field is not None:
            for i, text in enumerate(values.to_pylist()):
                if text is not None:
                    micros[i] = _field_micros(text, self.field, int(micros[i]))
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(np.full(n, partition, dtype=np.int32)),
                pa.array(self.offsets, pa.int64()),
                pa.array(micros).cast(pa.timestamp("us", tz="UTC")),
                _utf8(self.keys),
                values,
                *([] if self.headers is None else [pa.array(self.headers, HEADERS_FIELD.type)]),
            ],
            schema=self.schema,
        )
        self.offsets, self.stamps, self.keys, self.values = [], [], [], []
        self.headers = None if self.headers is None else []
        return batch


def _utf8(raw: list[bytes | None]) -> pa.Array:
    """Bytes as Arrow strings; where some are not UTF-8, those become :func:`_text`'s form."""
    array = pa.array(raw, pa.binary())
    try:
        return array.cast(pa.string())  # validates UTF-8
    except pa.ArrowInvalid:
        return pa.array([_text(item) for item in raw], pa.string())


def _text(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return NOT_UTF8_PREFIX + base64.b64encode(raw).decode("ascii")


def _field_micros(value: str, field: str, default: int) -> int:
    """Event time from a JSON value's top-level ``field`` (epoch ms or ISO-8601)."""
    try:
        found = json.loads(value).get(field)
    except (ValueError, AttributeError):
        return default
    if isinstance(found, bool) or found is None:
        return default
    if isinstance(found, int | float):
        return int(found * 1000)
    if isinstance(found, str):
        try:
            parsed = datetime.fromisoformat(found.replace("Z", "+00:00"))
        except ValueError:
            return default
        if parsed.tzinfo is None:
            return default
        return int(parsed.timestamp() * 1_000_000)
    return default


__all__ = [
    "ENV_KAFKA_CONFIG",
    "NOT_UTF8_PREFIX",
    "SCHEME",
    "KafkaLocation",
    "KafkaLog",
    "is_kafka_source",
    "kafka_config",
    "kafka_config_scope",
    "kafka_environment",
]
