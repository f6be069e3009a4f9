"""Batch waves in Python workers: each task reads, parses and writes its ranges, no row in the JVM.

What a batch wave runs with ``batch_reader = arrow``. Spark schedules one task per planned
partition of the wave (``spark.range(n).mapInArrow``, one row per partition, so it runs
unchanged on a cluster); each task, in a Python worker:

1. reads its ``(bucket, start, end)`` ranges with the log's own reader
   (:meth:`~modeswitch.sources.base.BucketedLog.read_ranges`: pyarrow on the segment files, or
   one Kafka consumer for them all), as Arrow batches;
2. runs the transform's Arrow form on them (:meth:`modeswitch.transforms.Transform.arrow_form`;
   the Arrow parse's is :class:`modeswitch.transforms.arrow.PayloadParser`);
3. writes them with the sink's own pyarrow writer (:func:`modeswitch.sinks.files.write_files`:
   the table's files and the quarantine's, with their statistics and the max event time per
   bucket) into a folder unique to this attempt, ``<table>/native-<uuid>/`` (and
   ``<quarantine>/native-<uuid>/``);
4. returns what it wrote (a pickled :class:`~modeswitch.sinks.files.DeltaCommitMessage`, a
   few hundred bytes) and how long it spent reading, parsing and writing (:class:`WavePhases`)
   to the driver, which checks the wave's record count and makes the sink's one exactly-once
   commit (:func:`modeswitch.sinks.committer.commit_files`); the wave's log line gives the
   phases summed over its tasks.

No row crosses between the JVM and Python: in the other paths every row goes to a Python
worker and back at least once (the Python data source reader, ``mapInArrow``, the Python
writer), which costs about what the parse saves (docs/BENCHMARKS.md, "The shared transform").

A failed wave or a refused commit deletes the attempt's folders; what a killed driver leaves
behind is deleted by vacuum, as the native writer's (the folders share its prefix). A retried
task writes new files; only the successful attempt's message reaches the commit.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from modeswitch.errors import ModeswitchError
from modeswitch.sinks.committer import CommitOutcome, commit_files
from modeswitch.sinks.delta import prepare_write
from modeswitch.sinks.files import DeltaCommitMessage, write_files
from modeswitch.sinks.native import FOLDER_PREFIX, remove_attempt_folder
from modeswitch.sinks.options import DeltaSinkOptions
from modeswitch.sinks.parquet_files import WrittenFile
from modeswitch.sources.base import BucketedLog

log = logging.getLogger(__name__)

Ranges = Sequence[tuple[int, int, int]]
"""One task's ``(bucket, start, end)`` ranges, read in order."""
Batches = Iterator[pa.RecordBatch]


@dataclass(frozen=True)
class WavePhases:
    """Seconds a task spent in each phase of its chain (summed over a wave's tasks by
    :meth:`__add__`): ``read`` in the log's reader, ``parse`` in the transform, ``write`` in the
    sink's writer (conforming to the table's schema, encoding, writing the files)."""

    read: float = 0.0
    parse: float = 0.0
    write: float = 0.0

    def __add__(self, other: WavePhases) -> WavePhases:
        return WavePhases(
            self.read + other.read, self.parse + other.parse, self.write + other.write
        )

    def __str__(self) -> str:
        return f"read {self.read:.2f} s, parse {self.parse:.2f} s, write {self.write:.2f} s"


def run_phases(
    read: Batches,
    transform: Callable[[Batches], Batches],
    write: Callable[[Batches], DeltaCommitMessage],
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[DeltaCommitMessage, WavePhases]:
    """``write(transform(read))``, and the seconds spent in each: the chain is lazy (each
    stage pulls batches from the one before), so a stage's own time is the time inside its
    ``next()`` less the time inside the stage it pulls from."""
    inside = [0.0, 0.0]  # seconds inside the reader's next(), inside the transform's

    def timed(batches: Batches, stage: int) -> Batches:
        batches = iter(batches)
        while True:
            began = clock()
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                inside[stage] += clock() - began
            yield batch

    began = clock()
    message = write(timed(transform(timed(read, 0)), 1))
    total = clock() - began
    read_s, through_parse = inside
    return message, WavePhases(read_s, through_parse - read_s, total - through_parse)


@dataclass(frozen=True)
class WaveTask:
    """What each task runs (pickled to the Python workers with the function it calls): the
    ranges of partition ``i`` for each id ``i`` it is given, read, transformed, written."""

    source: str
    partitions: tuple[tuple[tuple[int, int, int], ...], ...]
    transform: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
    schema: pa.Schema  # the transform's output, with the quarantine reason
    options: DeltaSinkOptions  # paths inside the attempt's folders; no storage options
    folder: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from modeswitch.sources import open_log

        return self.run(batches, open_log(self.source))

    def run(
        self, batches: Iterator[pa.RecordBatch], source: BucketedLog
    ) -> Iterator[pa.RecordBatch]:
        """:meth:`__call__` on the log ``source``, already open (a stream's, kept from
        micro-batch to micro-batch in the driver)."""
        for batch in batches:
            for index in batch.column(0).to_pylist():
                ranges = self.partitions[index]
                message, phases = run_phases(
                    source.read_ranges(ranges),
                    self.transform,
                    lambda parsed: write_files(self.options, self._conformed(parsed)),
                )
                message = dataclasses.replace(
                    message,
                    files=[self._in_folder(f) for f in message.files],
                    quarantine_files=[self._in_folder(f) for f in message.quarantine_files],
                )
                yield pa.RecordBatch.from_arrays(
                    [pa.array([pickle.dumps((message, phases))], pa.binary())], names=["message"]
                )

    def _conformed(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The transform's batches in the table's Arrow schema (the columns Spark's schema
        for them gives; a transform that gives other types fails the task, naming them)."""
        for batch in batches:
            if batch.schema != self.schema:
                if batch.schema.names != self.schema.names:
                    raise ModeswitchError(
                        f"transform: its Arrow form gave columns {batch.schema.names}, its "
                        f"schema says {self.schema.names}"
                    )
                batch = batch.cast(self.schema)
            yield batch

    def _in_folder(self, written: WrittenFile) -> WrittenFile:
        return dataclasses.replace(written, path=f"{self.folder}/{written.path}")


def run_in_spark_tasks(spark: Any, task: WaveTask, source: BucketedLog | None) -> list[bytes]:
    """``task`` run in one Spark task per partition (``spark.range(n).mapInArrow``), so it runs
    unchanged on a cluster, each task opening the log itself: the answers, pickled."""
    count = max(1, len(task.partitions))
    rows = spark.range(count, numPartitions=count).mapInArrow(task, "message binary").collect()
    return [row.message for row in rows]


def run_in_driver(spark: Any, task: WaveTask, source: BucketedLog | None) -> list[bytes]:
    """``task`` run here, in the driver's own process, partition after partition, on the log
    ``source`` if it is open already: no Spark job. A job with Python tasks costs about
    100-130 ms before any record is read (a trivial ``mapInArrow`` of two tasks, measured on a
    warm session here), most of a small micro-batch's time."""
    from modeswitch.sources import open_log

    ids = pa.RecordBatch.from_arrays([pa.array(range(len(task.partitions)), pa.int64())], ["id"])
    answers = task.run(iter([ids]), source or open_log(task.source))
    return [answer.column(0)[0].as_py() for answer in answers]


TASK_RUNNERS: dict[str, Callable[[Any, WaveTask, BucketedLog | None], list[bytes]]] = {
    "spark": run_in_spark_tasks,
    "driver": run_in_driver,
}
"""Where a wave's tasks run, by name: Spark's tasks, or the driver's own process (a stream's
small micro-batch, :mod:`modeswitch.modes.stream_waves`)."""


def write_wave(
    spark: Any,
    source: str,
    partitions: Sequence[Ranges],
    transform: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    output: Any,
    path: str,
    *,
    runs_in: str = "spark",
    **options: str,
) -> CommitOutcome:
    """Read ``partitions`` of the log at ``source``, transform them with ``transform`` (an
    Arrow form whose output has the Spark schema ``output``) and append them to the Delta
    table at ``path`` in one exactly-once commit; ``options`` are the ``modeswitch_delta``
    options (``expectedRecords`` is checked before the commit). ``runs_in`` names where the
    tasks run (:data:`TASK_RUNNERS`). See the module docstring."""
    raw = {k: str(v) for k, v in options.items()}
    parsed, schema = prepare_write({**raw, "path": path}, output, overwrite=False)
    return write_prepared_wave(
        spark, source, partitions, transform, output, parsed, schema, runs_in=runs_in
    )


@dataclass(frozen=True)
class WrittenAhead:
    """Part of a wave written before the wave runs, committed with it (a stream's first
    micro-batch, read ahead while its query starts:
    :class:`modeswitch.modes.stream_waves.ReadAhead`): the attempt folders its files are in and
    its tasks' answers (:func:`write_ahead`)."""

    folders: tuple[str, ...] = ()
    answers: tuple[bytes, ...] = ()


def wave_task(
    source: str,
    partitions: Sequence[Ranges],
    transform: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    output: Any,
    parsed: DeltaSinkOptions,
) -> WaveTask:
    """The task of a wave of ``partitions``, writing into a new attempt folder of its own."""
    from pyspark.sql.pandas.types import to_arrow_schema

    folder = f"{FOLDER_PREFIX}{uuid.uuid4().hex}"
    quarantine = f"{parsed.quarantine_path}/{folder}" if parsed.quarantine_path else None
    return WaveTask(
        source=source,
        partitions=tuple(tuple(tuple(r) for r in p) for p in partitions),
        transform=transform,
        schema=to_arrow_schema(output, timezone="UTC"),
        # The workers' pyarrow takes credentials from the store's own variables, as the Python
        # writer's; the options are pickled into the plan, so they carry none.
        options=dataclasses.replace(
            parsed, storage_options={}, path=f"{parsed.path}/{folder}", quarantine_path=quarantine
        ),
        folder=folder,
    )


def write_ahead(
    source: str,
    source_log: BucketedLog,
    ranges: Ranges,
    transform: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    output: Any,
    parsed: DeltaSinkOptions,
) -> WrittenAhead:
    """``ranges`` of the log at ``source``, open as ``source_log``, read, transformed and
    written here, in the calling thread, into an attempt folder of their own, to be committed
    with a wave that runs later (:func:`write_prepared_wave`'s ``ahead``) or discarded
    (:func:`discard_ahead`). ``parsed`` are the wave's options, checked (only the table's own
    are used: where and how files are written)."""
    task = wave_task(source, (ranges,), transform, output, parsed)
    try:
        answers = run_in_driver(None, task, source_log)
    except BaseException:
        _remove_folders(parsed, task.folder)
        raise
    return WrittenAhead((task.folder,), tuple(answers))


def discard_ahead(parsed: DeltaSinkOptions, ahead: WrittenAhead) -> None:
    """Delete what was written ahead for a wave that will not commit it."""
    _remove_folders(parsed, *ahead.folders)


def write_prepared_wave(
    spark: Any,
    source: str,
    partitions: Sequence[Ranges],
    transform: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    output: Any,
    parsed: DeltaSinkOptions,
    schema: pa.Schema,
    *,
    runs_in: str = "spark",
    source_log: BucketedLog | None = None,
    ahead: WrittenAhead = WrittenAhead(),
) -> CommitOutcome:
    """:func:`write_wave` with its options already checked
    (:func:`~modeswitch.sinks.delta.prepare_write`): what a stream's micro-batches do, which
    check their options once per query (a check opens the table: 9 ms a micro-batch) and keep
    their log open (``source_log``, for a wave run in the driver); ``ahead``, what was written
    for this wave before it ran, is committed with it (its ranges are not in ``partitions``)."""
    task = wave_task(source, partitions, transform, output, parsed)
    folders = (task.folder, *ahead.folders)
    started = time.perf_counter()
    try:
        answers: list[tuple[DeltaCommitMessage, WavePhases]] = [
            pickle.loads(answer)
            for answer in (*ahead.answers, *TASK_RUNNERS[runs_in](spark, task, source_log))
        ]
        messages = [message for message, _ in answers]
        phases = sum((p for _, p in answers), WavePhases())
        records = sum(m.records for m in messages)
        quarantined = sum(m.quarantined for m in messages)
        expected = parsed.expected_records
        if expected is not None and records + quarantined != expected:
            raise ModeswitchError(
                f"sink {parsed.path}: this wave read {records} records and {quarantined} "
                f"quarantined, but its source offsets cover {expected}; nothing was committed"
            )
    except BaseException:
        _remove_folders(parsed, *folders)
        raise
    written = time.perf_counter()
    try:
        outcome = commit_files(
            parsed,
            schema,
            messages,
            sequence=parsed.sequence if parsed.sequence is not None else 0,
            start=parsed.offsets_start,
            end=parsed.offsets_end,
        )
    except BaseException:
        _remove_folders(parsed, *folders, only_if_empty=True)
        raise
    if outcome.status != "committed":
        _remove_folders(parsed, *folders)
    log.info(
        "arrow wave %s: %s, %d records in %d files (%d quarantined); tasks %.2f s (%s, summed "
        "over %d tasks, %d of them written ahead: %s), commit %.2f s",
        task.folder,
        outcome.status,
        records,
        sum(len(m.files) for m in messages),
        quarantined,
        written - started,
        runs_in,
        len(answers),
        len(ahead.answers),
        phases,
        time.perf_counter() - written,
    )
    return outcome


def _remove_folders(options: DeltaSinkOptions, *folders: str, only_if_empty: bool = False) -> None:
    """Delete the attempts' ``folders`` in the table and the quarantine; with
    ``only_if_empty``, only a folder with no file left (a commit that landed keeps its files)."""
    for folder in folders:
        for table in filter(None, (options.path, options.quarantine_path)):
            remove_attempt_folder(table, folder, only_if_empty=only_if_empty)


__all__ = [
    "TASK_RUNNERS",
    "WavePhases",
    "WaveTask",
    "WrittenAhead",
    "discard_ahead",
    "run_in_driver",
    "run_in_spark_tasks",
    "run_phases",
    "wave_task",
    "write_ahead",
    "write_prepared_wave",
    "write_wave",
]
