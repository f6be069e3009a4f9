"""The contract every source log honours: buckets of ordered offsets, read as Arrow batches.

A *bucketed log* is a set of buckets (Kafka partitions, Fluss buckets), each an append-only
sequence of records addressed by increasing offsets. Offsets maps always mean "next offset to
read" (exclusive ends). Every record has the columns of :data:`RECORD_SCHEMA`.

**Offsets may have gaps.** Kafka's transaction markers, aborted transactions and compaction
leave offsets that hold no record. So nothing may count ``end - start`` as the number of
records of a range: a read of ``[start, end)`` is complete when the reader has passed
``end - 1``, and what a range holds is :meth:`BucketedLog.held_offsets`. ``end - start`` is
only an upper bound (the planner sizes splits with it). A log whose ``contiguous`` is true
(the embedded segment log) promises no gaps, and its readers may count.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from modeswitch.control.locations import HEADERS_COLUMN, record_columns
from modeswitch.errors import OffsetOutOfRangeError, UnknownBucketError
from modeswitch.offsets import OffsetsMap

RECORD_SCHEMA = pa.schema(
    [
        pa.field("bucket", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("event_time", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.string()),
        pa.field("value", pa.string()),
    ]
)
"""Schema of a source record. Spark's view of it: ``bucket int, offset bigint,
event_time timestamp, key string, value string``."""

SPARK_RECORD_DDL = "bucket int, offset bigint, event_time timestamp, key string, value string"

HEADERS_FIELD = pa.field(
    HEADERS_COLUMN,
    pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])),
)
"""A Kafka record's headers (:data:`~modeswitch.control.locations.HEADERS_COLUMN`), the type
Spark's Kafka source gives them: ``array<struct<key string, value binary>>``."""


def record_schema(source: str) -> pa.Schema:
    """The schema of ``source``'s records (the ``source`` setting): :data:`RECORD_SCHEMA`, with
    :data:`HEADERS_FIELD` after it for a topic read with its headers
    (``kafka://<topic>?headers=true``), so that every reader of one source gives one schema."""
    extra = {HEADERS_COLUMN: HEADERS_FIELD}
    return pa.schema([*RECORD_SCHEMA, *(extra[name] for name in record_columns(source))])


def spark_record_schema(source: str) -> Any:
    """:func:`record_schema` as Spark's ``StructType``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(record_schema(source))


class LogCapabilities(Protocol):
    """What a kind of log can do beyond reading ranges, known without opening one: class
    attributes of each log class (:func:`modeswitch.sources.log_type`), what the wave seam
    (:func:`modeswitch.modes.wave_path.choose_wave_path`) decides from."""

    contiguous: bool
    """True when every offset of ``[earliest, latest)`` holds a record (no gaps): a reader
    may count the records of a range as ``end - start``."""

    parquet_files: bool
    """True when the records are Parquet files that Spark's own reader can read
    (:func:`modeswitch.sources.native.read_segments`, ``batch_reader = native``)."""

    client_config: bool
    """True when the log is reached through a client of a service, whose configuration
    (servers, credentials) comes from the ``kafka_connection`` Airflow Connection or
    ``MODESWITCH_KAFKA_CONFIG`` (a Kafka topic; what lineage names it by too); False for a log
    of files the pipeline reaches through its storage options."""

    spark_source: str
    """The Spark source that reads this log in a stream epoch (and, for ``kafka``, in batch
    waves with ``batch_reader = native``): ``bucketlog`` (our Python data source,
    :mod:`modeswitch.sources.spark`) or ``kafka`` (Spark's own Kafka source,
    :mod:`modeswitch.sources.spark_kafka`)."""


@runtime_checkable
class BucketedLog(LogCapabilities, Protocol):
    """A log of buckets of ordered offsets (the embedded segment log, Kafka). ``str(log)``
    is how a message names it: where it is read from."""

    event_time_indexed: bool
    """True when :meth:`offset_at` answers by the records' own event time; False when the
    log's time index holds another time (a Kafka topic whose event time is a JSON field: its
    index is the message timestamp), so a search by event time starts at the earliest offset."""

    compacting: bool
    """True when the log may later remove records below its latest offset that a reader has
    already read (a Kafka topic whose ``cleanup.policy`` includes ``compact``: the cleaner
    keeps the newest record of each key). What such a log holds now is a lower bound of what
    was read from it; :func:`modeswitch.ops.verify.audit` counts accordingly."""

    def buckets(self) -> list[int]:
        """Bucket ids, ascending."""
        ...

    def earliest_offsets(self) -> OffsetsMap:
        """Per bucket, the first offset still retained."""
        ...

    def latest_offsets(self) -> OffsetsMap:
        """Per bucket, the next offset to be written (exclusive end of what is readable)."""
        ...

    def offset_at(self, event_time: datetime) -> OffsetsMap:
        """Per bucket, the first retained offset whose record's event time is at or after
        ``event_time`` (the latest offset if there is none): where reading from a moment in
        event time starts (a rewind by event time). Kafka answers it with
        ``offsets_for_times``."""
        ...

    def read(self, bucket: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """Records ``[start, end)`` of ``bucket`` in offset order, as batches of RECORD_SCHEMA.

        Raises :class:`OffsetOutOfRangeError` if the range is not entirely retained and
        published, :class:`UnknownBucketError` for a bucket the log does not have.
        """
        ...

    def read_ranges(self, ranges: Sequence[tuple[int, int, int]]) -> Iterator[pa.RecordBatch]:
        """The records of every ``(bucket, start, end)`` range, each in offset order (the
        batches of different ranges may come interleaved); a wave's task reads its ranges
        with it. Same errors as :meth:`read`."""
        ...

    def held_offsets(self, bucket: int, start: int, end: int) -> np.ndarray:
        """The offsets of ``[start, end)`` that hold a record, ascending (int64): all of
        them for a contiguous log, fewer where there are gaps. Same errors as :meth:`read`."""
        ...


def check_range(
    bucket: int,
    start: int,
    end: int,
    *,
    earliest: Mapping[int, int],
    latest: Mapping[int, int],
    what: str = "read",
) -> None:
    """Refuse a range that is unknown, inverted, below retention or beyond the latest offset.

    ``what`` prefixes the message (the log, an option); empty means no prefix.
    """
    what = f"{what}: " if what else ""
    if bucket not in latest:
        raise UnknownBucketError(
            f"{what}bucket {bucket} does not exist (buckets are {sorted(latest)})"
        )
    if start > end:
        raise OffsetOutOfRangeError(
            f"{what}bucket {bucket}: start offset {start} is after end offset {end}"
        )
    if start < earliest[bucket]:
        raise OffsetOutOfRangeError(
            f"{what}bucket {bucket}: offset {start} is below the earliest retained offset "
            f"{earliest[bucket]}; records [{start}, {earliest[bucket]}) were dropped by retention"
        )
    if end > latest[bucket]:
        raise OffsetOutOfRangeError(
            f"{what}bucket {bucket}: end offset {end} is beyond the latest offset {latest[bucket]}"
        )
