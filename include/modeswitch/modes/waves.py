"""The wave seam executed: a batch wave, or a backfill's window, read and written by the
strategies its :class:`~modeswitch.modes.wave_path.WavePath` names, with no branch in the modes.

:data:`WAVE_READERS` holds one reader per ``WavePath.reader`` (``native``, ``kafka``,
``bucketlog``); :func:`transformed_rows` reads a :class:`WaveRead` with the path's reader and
runs the transform where the path says (its Spark form on the DataFrame read, or its Arrow form
inside the ``bucketlog`` reader). :data:`WAVE_COMMITS` holds one commit per batch writer
(``arrow``: the wave's Python tasks read, transform and write, the driver commits; ``native``
and ``python``: the transformed rows written by that writer). A backfill's window takes
:func:`transformed_rows` and stages them (:mod:`modeswitch.modes.backfill_job`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from modeswitch.control.planning import Wave
from modeswitch.offsets import OffsetsMap
from modeswitch.sinks import arrow_wave
from modeswitch.sinks.native import write_batch
from modeswitch.sources.native import read_segments
from modeswitch.sources.spark import SOURCE_NAME
from modeswitch.sources.spark import register as register_source
from modeswitch.sources.spark_kafka import read_batch

if TYPE_CHECKING:
    from modeswitch.modes.job import JobPlan

Range = tuple[int, int, int]
"""``(bucket, start, end)``: a split's range of one bucket."""


@dataclass(frozen=True)
class WaveRead:
    """What one wave (or a backfill's window) reads: its tasks' ranges, in order."""

    partitions: tuple[tuple[Range, ...], ...]
    """The Spark tasks of the read, each a list of ranges (the planner's balanced waves)."""
    scratch: str
    """Where a ``native`` read keeps its snapshots of growing segments (removed by the caller
    once the wave is written)."""
    tasks: int
    """At least this many tasks for a reader that cuts ranges itself (Spark's Kafka source)."""

    @classmethod
    def of(cls, wave: Wave, *, scratch: str, tasks: int | None = None) -> WaveRead:
        """The read of a planned ``wave``: its partitions as they are; ``tasks`` defaults to
        their number."""
        partitions = tuple(
            tuple((s.bucket, s.start, s.end) for s in partition) for partition in wave.partitions
        )
        return cls(partitions, scratch, len(partitions) if tasks is None else tasks)

    @property
    def splits(self) -> list[Range]:
        """Every range read, partition after partition."""
        return [r for partition in self.partitions for r in partition]

    @property
    def start(self) -> OffsetsMap:
        """Per bucket, the first offset read."""
        start: dict[int, int] = {}
        for bucket, lo, _ in self.splits:
            start[bucket] = min(lo, start.get(bucket, lo))
        return start

    @property
    def end(self) -> OffsetsMap:
        """Per bucket, the end of what is read (exclusive)."""
        end: dict[int, int] = {}
        for bucket, _, hi in self.splits:
            end[bucket] = max(hi, end.get(bucket, hi))
        return end

    def partitions_json(self) -> str:
        """The ``partitions`` option of ``bucketlog`` for this read."""
        return json.dumps([[list(r) for r in partition] for partition in self.partitions])


def read_native(spark: Any, job: JobPlan, read: WaveRead, *, in_reader: bool) -> Any:
    """Spark's Parquet reader on the segment files of the read's ranges."""
    return read_segments(spark, job.source, read.splits, scratch=read.scratch)


def read_kafka(spark: Any, job: JobPlan, read: WaveRead, *, in_reader: bool) -> Any:
    """Spark's Kafka source over each partition's range of the read."""
    return read_batch(spark, job.source, read.start, read.end, min_partitions=read.tasks)


def read_bucketlog(spark: Any, job: JobPlan, read: WaveRead, *, in_reader: bool) -> Any:
    """The ``bucketlog`` data source on exactly the read's partitions; with ``in_reader`` it
    runs the transform's Arrow form where it reads and gives the transformed rows."""
    options = job.reader_arrow_options if in_reader else {}
    register_source(spark)
    reader = spark.read.format(SOURCE_NAME).option("partitions", read.partitions_json())
    return reader.options(**options).load(job.source)


WaveReaderFunction = Callable[..., Any]
WAVE_READERS: Mapping[str, WaveReaderFunction] = {
    "native": read_native,
    "kafka": read_kafka,
    "bucketlog": read_bucketlog,
}
"""The reader of each ``WavePath.reader`` but ``arrow`` (whose tasks also write:
:data:`WAVE_COMMITS`)."""


def keep_all(df: Any) -> Any:
    """No filter."""
    return df


def transformed_rows(
    spark: Any,
    job: JobPlan,
    read: WaveRead,
    *,
    before: Callable[[Any], Any] = keep_all,
    after: Callable[[Any], Any] = keep_all,
) -> Any:
    """The read's rows, transformed where ``job.waves`` says: its Spark form on the records
    read, or its Arrow form inside the ``bucketlog`` reader. ``before`` filters the records
    before a Spark form (it must mean the same on the transformed rows: they keep the log's
    columns, so it is applied after an Arrow form in the reader), ``after`` the transformed
    rows."""
    path = job.waves
    assert path is not None, f"a {job.kind} job has no waves"
    in_reader = path.transform == "arrow"
    records = WAVE_READERS[path.reader](spark, job, read, in_reader=in_reader)
    return after(TRANSFORM_STEPS[path.transform](job, records, before))


TRANSFORM_STEPS: Mapping[str, Callable[[JobPlan, Any, Callable[[Any], Any]], Any]] = {
    "spark": lambda job, records, before: job.transform(before(records)),
    "arrow": lambda job, rows, before: before(rows),
}
"""Where the transform runs, by ``WavePath.transform``: ``spark`` on the records read,
``arrow`` already done inside the reader."""


def commit_arrow_wave(spark: Any, job: JobPlan, read: WaveRead, options: Mapping[str, str]) -> None:
    """The wave's Python tasks read their ranges, run the Arrow form and write the files; the
    driver commits (:func:`modeswitch.sinks.arrow_wave.write_wave`)."""
    arrow_wave.write_wave(
        spark,
        job.source,
        [list(partition) for partition in read.partitions],
        job.arrow.function,
        job.arrow.schema,
        job.settings.sink,
        **options,
    )


def commit_rows_wave(spark: Any, job: JobPlan, read: WaveRead, options: Mapping[str, str]) -> None:
    """The wave's transformed rows (:func:`transformed_rows`) written by the path's writer,
    Spark's Parquet writer (``native``) or the ``modeswitch_delta`` data source (``python``),
    then the sink's commit (:func:`modeswitch.sinks.native.write_batch`)."""
    assert job.waves is not None
    rows = transformed_rows(spark, job, read)
    write_batch(rows, job.settings.sink, writer=job.waves.writer, **options)


WAVE_COMMITS: Mapping[str, Callable[[Any, JobPlan, WaveRead, Mapping[str, str]], None]] = {
    "arrow": commit_arrow_wave,
    "native": commit_rows_wave,
    "python": commit_rows_wave,
}
"""How a batch wave is written and committed, by ``WavePath.writer``."""


__all__ = [
    "TRANSFORM_STEPS",
    "WAVE_COMMITS",
    "WAVE_READERS",
    "WaveRead",
    "commit_arrow_wave",
    "commit_rows_wave",
    "keep_all",
    "read_bucketlog",
    "read_kafka",
    "read_native",
    "transformed_rows",
]
