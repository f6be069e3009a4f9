"""The contract every source log honours: buckets of contiguous offsets, read as Arrow batches.

A *bucketed log* is a set of buckets (Kafka partitions, Fluss buckets), each an append-only
sequence of records addressed by contiguous offsets. Offsets maps always mean "next offset to
read" (exclusive ends). Every record has the columns of :data:`RECORD_SCHEMA`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Protocol, runtime_checkable

import pyarrow as pa

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


@runtime_checkable
class BucketedLog(Protocol):
    """A log of buckets with contiguous offsets (the embedded segment log, Kafka)."""

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
