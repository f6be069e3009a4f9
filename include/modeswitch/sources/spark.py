"""The ``bucketlog`` PySpark data source: batch and streaming reads of any bucketed log.

Usage::

    from modeswitch.sources.spark import register
    register(spark)
    df = (spark.read.format("bucketlog")
          .option("startingOffsets", '{"0": 100, "1": 0}')
          .option("endingOffsets", "latest")
          .load("/data/log"))

Options (validated on the driver, :mod:`modeswitch.sources.spark_options`; an error names the
option and its value):

- ``path`` (or the ``load()`` argument): the log's root.
- ``source``: ``segments`` (the embedded log) or ``kafka``; by default ``kafka`` for a
  ``kafka://<topic>`` path, ``segments`` otherwise. A Kafka log's client configuration is
  read from ``MODESWITCH_KAFKA_CONFIG`` in the driver's and the Python workers' environment,
  never from an option (options show in the plan and the Spark UI).
- ``startingOffsets``: ``earliest``, ``latest`` or an offsets map as JSON. Buckets missing
  from a map start at their earliest offset. Default: ``earliest`` for batch reads,
  ``latest`` for streaming reads (as Spark's Kafka source does).
- ``endingOffsets`` (batch only): ``latest`` (default) or an offsets map; missing buckets end
  at their latest offset.
- ``maxRecordsPerPartition``: no partition reads more; skewed buckets are cut and small ones
  packed together. Default 1 000 000.
- ``numPartitions``: read with this many partitions when each gets at least 20 000 records
  (``MIN_PARTITION_RECORDS``), fewer for less (default: this machine's cores). A live
  micro-batch of a few thousand records is then one task, not one per bucket.
- ``partitions`` (batch only): the exact Spark partitions to read, as JSON: a list of
  partitions, each a list of ``[bucket, start, end]`` ranges read in order. The planner's
  balanced waves use it; ``startingOffsets`` / ``endingOffsets`` are then ignored.
- ``arrowForm`` with ``arrowSchema``: a function from the records' Arrow batches to a
  transform's, and its output's Spark schema as JSON, both made by
  :func:`~modeswitch.sources.spark_options.arrow_form_options` (the transform's Arrow form,
  :mod:`modeswitch.transforms`, "An Arrow form"): each partition's batches go through it in
  the reader's own Python worker, and the source gives the transform's columns. The rows then
  cross from Python to the JVM once, already parsed, instead of crossing back and forth for a
  ``mapInArrow``: what the stream job reads with the Arrow parse. The function reaches the
  workers as it was built on the driver: nothing is looked up or parsed again by name.
- ``maxRecordsPerTrigger`` (streaming): at most this many records per micro-batch, shared
  between buckets in proportion to how far behind each is. Spark passes it back to
  ``latestOffset`` as a ``ReadMaxRows`` limit, and replaces it with ``ReadAllAvailable``
  where a trigger demands it.

Readers hold only plain options and offsets (picklable); each ``read()`` opens the log
afresh from its root, so ``read`` is stateless.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from modeswitch.errors import ModeswitchError, OffsetOutOfRangeError, UnknownBucketError
from modeswitch.offsets import OffsetsMap, offsets_from_dict, offsets_to_dict
from modeswitch.sources.base import BucketedLog, check_range, spark_record_schema
from modeswitch.sources.spark_options import BucketLogOptions, arrow_function, resolve_offsets
from modeswitch.worker_gc import freeze_imports

log = logging.getLogger(__name__)

SOURCE_NAME = "bucketlog"


@dataclass
class BucketRanges(InputPartition):
    """One Spark partition of planned ranges ``[(bucket, start, end), ...]``, read in order."""

    ranges: tuple[tuple[int, int, int], ...]


MIN_PARTITION_RECORDS = 20_000
"""A read is cut into ``parallelism`` partitions only when each gets at least this many
records: a live micro-batch of a thousand records is one task. Each task costs its Python
workers' round trips (~90 ms here whatever it reads) and the tasks of a micro-batch share two
cores with the driver: in one task the stream's micro-batches took 206-207 ms (median of
~290) against 213-234 ms in two, p50 latency 273-280 against 283-314 ms (2026-11-28, session
32, docs/BENCHMARKS.md)."""


def plan_partitions(
    start: Mapping[int, int],
    end: Mapping[int, int],
    *,
    max_records: int,
    parallelism: int,
    min_records: int = MIN_PARTITION_RECORDS,
) -> list[BucketRanges]:
    """Balanced Spark partitions covering ``[start, end)`` of every bucket exactly.

    ``parallelism`` partitions when each gets at least ``min_records`` (fewer, down to one,
    for less), more when a partition would exceed ``max_records``; skewed buckets are cut
    and small ones packed together (the planner's balancing,
    :func:`modeswitch.control.planning.plan_batch`). A micro-batch of a few thousand records
    over 16 buckets is one task, not sixteen. Within a bucket, ranges come in offset order. An
    empty range gives no partition.
    """
    from modeswitch.control.planning import plan_batch

    total = sum(max(0, end[b] - start.get(b, end[b])) for b in end)
    if total == 0:
        return []
    enough = max(1, min(parallelism, total // max(1, min_records)))
    count = max(enough, -(-total // max_records))
    plan = plan_batch(
        {b: start.get(b, end[b]) for b in end},
        dict(end),
        max_split_records=max_records,
        wave_records=total,
        parallelism=count,
    )
    return [
        BucketRanges(tuple((s.bucket, s.start, s.end) for s in partition))
        for wave in plan.waves
        for partition in wave.partitions
    ]


def read_ranges(options: BucketLogOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Arrow batches of one partition's ranges, each in offset order."""
    if not isinstance(partition, BucketRanges):
        # With no partitions to read, Spark still calls read() once, with a partition of
        # its own: nothing to read.
        return
    freeze_imports()
    source = options.open_log()
    batches = (b for r in partition.ranges for b in source.read(*r))
    if options.arrow_form is None:
        yield from batches
    else:
        yield from arrow_function(options.arrow_form)(batches)


def limit_by_rows(start: Mapping[int, int], latest: Mapping[int, int], max_rows: int) -> OffsetsMap:
    """Advance from ``start`` towards ``latest`` by at most ``max_rows`` records in all.

    Each bucket gets a share proportional to how far behind it is; the leftover records go
    to the buckets furthest behind, so the total is exactly ``min(max_rows, available)``.
    """
    lag = {b: max(0, latest[b] - start.get(b, latest[b])) for b in latest}
    total = sum(lag.values())
    if total <= max_rows:
        return dict(latest)
    take = {b: lag[b] * max_rows // total for b in lag}
    leftover = max_rows - sum(take.values())
    for b in sorted(lag, key=lambda b: (-(lag[b] - take[b]), b)):
        if leftover == 0:
            break
        if take[b] < lag[b]:
            take[b] += 1
            leftover -= 1
    return {b: start.get(b, latest[b]) + take[b] for b in latest}


class BucketLogBatchReader(DataSourceReader):
    """Batch read of fixed offset ranges, resolved when the query is planned."""

    def __init__(self, options: BucketLogOptions) -> None:
        self.options = options
        source = options.open_log()
        earliest, latest = source.earliest_offsets(), source.latest_offsets()
        if options.partitions is not None:
            for partition in options.partitions:
                for bucket, lo, hi in partition:
                    try:
                        check_range(bucket, lo, hi, earliest=earliest, latest=latest, what="")
                    except (UnknownBucketError, OffsetOutOfRangeError) as exc:
                        raise type(exc)(f"option partitions: {exc}") from exc
            return
        self.start = resolve_offsets(
            "startingOffsets",
            options.starting,
            default="earliest",
            earliest=earliest,
            latest=latest,
            fill=earliest,
        )
        self.end = resolve_offsets(
            "endingOffsets",
            options.ending,
            default="latest",
            earliest=earliest,
            latest=latest,
            fill=latest,
        )
        for bucket, end in self.end.items():
            if self.start[bucket] > end:
                raise OffsetOutOfRangeError(
                    f"option startingOffsets={options.starting!r}: bucket {bucket} starts at "
                    f"{self.start[bucket]}, after its ending offset {end} "
                    f"(option endingOffsets={options.ending!r})"
                )

    def partitions(self) -> Sequence[InputPartition]:
        if self.options.partitions is not None:
            return [BucketRanges(tuple(p)) for p in self.options.partitions if p]
        return plan_partitions(
            self.start,
            self.end,
            max_records=self.options.max_records_per_partition,
            parallelism=self.options.parallelism,
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_ranges(self.options, partition)


class BucketLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over offsets maps; honours ``maxRecordsPerTrigger`` and availableNow."""

    def __init__(self, options: BucketLogOptions) -> None:
        self.options = options
        self._target: OffsetsMap | None = None
        self._log: BucketedLog | None = None
        self._reported: OffsetsMap | None = None

    def _open(self) -> BucketedLog:
        """One log per reader: it caches each segment's row count by file identity, so a
        micro-batch reads only the footers of the segments that changed."""
        if self._log is None:
            self._log = self.options.open_log()
        return self._log

    def initialOffset(self) -> dict:
        source = self._open()
        earliest = source.earliest_offsets()
        start = resolve_offsets(
            "startingOffsets",
            self.options.starting,
            default="latest",
            earliest=earliest,
            latest=source.latest_offsets(),
            fill=earliest,
        )
        log.info("bucketlog stream starts at %s", start)
        return offsets_to_dict(start)

    def _latest(self) -> OffsetsMap:
        latest = self._open().latest_offsets()
        if self._target is not None:
            latest = {b: min(latest[b], self._target.get(b, latest[b])) for b in latest}
        return latest

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = offsets_from_dict(start, source="stream start offset")
        latest = self._latest()
        self._reported = latest
        if set(latest) - set(begin):
            # A bucket added while the query runs (a partition added to a Kafka topic) is
            # read from its earliest offset, like a bucket the epoch started with.
            earliest = self._open().earliest_offsets()
            begin = {**{b: earliest[b] for b in latest if b not in begin}, **begin}
        begin = {b: begin[b] for b in latest}
        if isinstance(limit, ReadMaxRows):
            end = limit_by_rows(begin, latest, limit.max_rows)
        elif isinstance(limit, ReadMinRows):
            available = sum(latest[b] - begin[b] for b in latest)
            end = latest if available >= limit.min_rows else begin
        else:
            end = latest
        return offsets_to_dict(end)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict:
        # Spark asks right after latestOffset, for its progress report: the log as that call
        # saw it, not a second scan of it.
        latest, self._reported = self._reported, None
        return offsets_to_dict(latest if latest is not None else self._latest())

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._open().latest_offsets()
        log.info("bucketlog availableNow target %s", self._target)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = offsets_from_dict(start, source="micro-batch start offset")
        until = offsets_from_dict(end, source="micro-batch end offset")
        if set(until) - set(begin):
            # A bucket added since the previous micro-batch: from its earliest offset, as
            # latestOffset planned it (Spark hands back the previous end, which lacks it).
            earliest = self._open().earliest_offsets()
            begin = {**{b: earliest[b] for b in until if b not in begin}, **begin}
        return plan_partitions(
            begin,
            until,
            max_records=self.options.max_records_per_partition,
            parallelism=self.options.parallelism,
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_ranges(self.options, partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: the sink's commit, not the source, is the checkpoint."""


class BucketLogDataSource(DataSource):
    """``spark.read.format("bucketlog")`` / ``spark.readStream.format("bucketlog")``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> Any:
        options = self._options()
        if options.arrow_schema is None:
            return spark_record_schema(options.path)
        return StructType.fromJson(json.loads(options.arrow_schema))

    def _options(self) -> BucketLogOptions:
        return BucketLogOptions.parse(self.options)

    def reader(self, schema: object) -> DataSourceReader:
        return BucketLogBatchReader(self._options())

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        options = self._options()
        if options.partitions is not None:
            raise ValueError("option partitions: only for batch reads")
        if options.ending is not None:
            raise ValueError(
                f"option endingOffsets={options.ending!r}: not supported by streaming reads "
                "(stop the query with a trigger or a command instead)"
            )
        # Fail on the driver, before the query starts, for a missing log or a bad start.
        BucketLogStreamReader(options).initialOffset()
        return BucketLogStreamReader(options)


def register(spark: object) -> None:
    """Register the ``bucketlog`` data source with a Spark session."""
    spark.dataSource.register(BucketLogDataSource)  # type: ignore[attr-defined]


__all__ = [
    "MIN_PARTITION_RECORDS",
    "SOURCE_NAME",
    "BucketLogDataSource",
    "BucketRanges",
    "ModeswitchError",
    "limit_by_rows",
    "plan_partitions",
    "register",
]
