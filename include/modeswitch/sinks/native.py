"""Batch writes through Spark's own Parquet writer, committed by the sink's exactly-once commit.

The ``modeswitch_delta`` data source hands every row from the JVM to a Python worker, which
alone costs as much as Spark's whole native Parquet write (docs/BENCHMARKS.md). For batch
writes, :func:`write_batch` keeps the rows in the JVM:

1. the options and the schema are checked on the driver, as the data source does
   (:func:`modeswitch.sinks.delta.prepare_write`);
2. Spark writes the DataFrame with ``df.write.parquet`` into a folder of the table that is
   unique to this attempt, ``<table>/native-<uuid>/`` (snappy, timestamps as
   ``TIMESTAMP_MICROS``, dates and timestamps proleptic Gregorian: the files the Python path
   writes). Rows marked with ``_quarantine_reason`` go, in the same write, to a second
   subfolder (``partitionBy`` on a route column, without a sort);
3. the driver lists the part files and reads their Parquet footers (nothing else) to build
   the add actions and their statistics; Spark's ``_SUCCESS`` and checksum files are deleted,
   never referenced. Quarantined rows (usually a handful) are rewritten on the driver into the
   quarantine table's schema;
4. the max event time per bucket, which each commit records for the watermark, is scanned on
   the driver from the written files' ``bucket`` and ``event_time`` columns only, in batches
   (no record goes through Spark to the driver; a Spark job for it cost 3-4 times as much,
   see docs/SINK.md);
5. one Delta commit through :func:`modeswitch.sinks.committer.commit_files`: the same fencing,
   app transaction, continuity check, commit metadata and quarantine commit as the data
   source's.

A failed Spark write, a refused (fenced) commit or a replay deletes the attempt's folder, so
nothing becomes visible; what a killed driver leaves behind is deleted by
:func:`modeswitch.sinks.delta.vacuum` (the folder's name starts with neither ``_`` nor ``.``,
so vacuum does not take it for a hidden folder).

Tables with ``partitionBy`` are written by the Python data source writer instead (Spark's
partition folders would need their values parsed back into Delta's partition values).
Streaming writes always use the data source.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from modeswitch.errors import ModeswitchError
from modeswitch.sinks.committer import CommitOutcome, commit_files
from modeswitch.sinks.delta import SINK_NAME, prepare_write, register
from modeswitch.sinks.files import (
    DeltaCommitMessage,
    count_reasons,
    split_quarantine,
    track_event_times,
)
from modeswitch.sinks.options import DeltaSinkOptions
from modeswitch.sinks.parquet_files import ParquetFileWriter, WrittenFile, footer_stats_json
from modeswitch.spark_conf import session_conf
from modeswitch.transforms import QUARANTINE_REASON

log = logging.getLogger(__name__)

BatchWriter = Literal["native", "python"]
BATCH_WRITERS: tuple[str, ...] = ("native", "python")
FOLDER_PREFIX = "native-"
ROUTE_COLUMN = "_modeswitch_route"
ROUTE_TABLE = "table"
ROUTE_QUARANTINE = "quarantine"
FILE_READERS = 4
SCAN_BATCH_ROWS = 1 << 16

WRITE_CONF: dict[str, str] = {
    # int64 microseconds, as pyarrow writes them; Spark's default is INT96.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # Proleptic Gregorian as pyarrow, instead of failing on dates before 1582.
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    # partitionBy on the route column without sorting each task's rows first: each task keeps
    # one writer per route open.
    "spark.sql.maxConcurrentOutputFileWriters": "4",
}


NO_DICTIONARY_COLUMNS = ("offset", "event_time", "key", "value")
"""Source columns whose values barely repeat: Parquet's writer would build a dictionary for
each, see it overflow and fall back to plain pages (~10 % of a wave's write time here;
docs/BENCHMARKS.md), so it is not asked to. The pyarrow path decides per column the same way."""


def write_batch(
    df: Any, path: str, *, writer: BatchWriter = "native", **options: str
) -> CommitOutcome | None:
    """Append ``df`` to the Delta table at ``path`` in one exactly-once commit.

    ``options`` are the ``modeswitch_delta`` options (module docstring of
    :mod:`modeswitch.sinks.delta`: ``pipeline``, ``epoch``, ``sequence``, ``offsetsStart``,
    ``offsetsEnd``, ``quarantinePath``, ...). ``writer="native"`` writes the data files with
    Spark's Parquet writer (see the module docstring); ``"python"``, and any table with
    ``partitionBy``, with the ``modeswitch_delta`` data source. Returns the commit's outcome,
    or None when the data source wrote.
    """
    if writer not in BATCH_WRITERS:
        raise ValueError(f"writer={writer!r}: expected one of {', '.join(BATCH_WRITERS)}")
    raw = {k: str(v) for k, v in options.items()}
    if writer == "python" or DeltaSinkOptions.parse({**raw, "path": path}).partition_by:
        register(df.sparkSession)
        df.write.format(SINK_NAME).mode("append").options(**raw).save(path)
        return None
    if ROUTE_COLUMN in df.columns:
        raise ValueError(f"column {ROUTE_COLUMN}: reserved by the sink's native writer")
    parsed, schema = prepare_write({**raw, "path": path}, df.schema, overwrite=False)
    return NativeWrite(parsed, f"{FOLDER_PREFIX}{uuid.uuid4().hex}").run(df, schema)


@dataclass(frozen=True)
class NativeWrite:
    """One attempt: Spark writes into ``<table>/<folder>``, the driver commits its files."""

    options: DeltaSinkOptions
    folder: str

    def run(self, df: Any, schema: Any) -> CommitOutcome:
        routed = QUARANTINE_REASON in df.columns
        started = time.perf_counter()
        try:
            self._spark_write(df, routed)
            written = time.perf_counter()
            message = self._describe_files(schema)
            expected = self.options.expected_records
            if expected is not None and message.records + message.quarantined != expected:
                raise ModeswitchError(
                    f"sink {self.options.path}: this write holds {message.records} records and "
                    f"{message.quarantined} quarantined, but its source offsets cover {expected}; "
                    "nothing was committed (a source file changed while it was read?)"
                )
        except BaseException:
            self._remove_folder()
            raise
        described = time.perf_counter()
        try:
            outcome = commit_files(
                self.options,
                schema,
                [message],
                sequence=self.options.sequence if self.options.sequence is not None else 0,
                start=self.options.offsets_start,
                end=self.options.offsets_end,
            )
        except BaseException:
            # commit_files deleted the files unless the commit landed: then they stay.
            self._remove_folder(only_if_empty=True)
            raise
        if outcome.status != "committed":
            self._remove_folder()
        log.info(
            "native write %s: %s, %d records in %d files (%d quarantined); Spark write %.2f s, "
            "files described %.2f s, commit %.2f s",
            self.folder,
            outcome.status,
            message.records,
            len(message.files),
            message.quarantined,
            written - started,
            described - written,
            time.perf_counter() - described,
        )
        return outcome

    # -- 1. Spark writes ----------------------------------------------------------------------
    def _spark_write(self, df: Any, routed: bool) -> None:
        from pyspark.sql import functions as F

        if routed:
            route = F.when(F.col(QUARANTINE_REASON).isNull(), F.lit(ROUTE_TABLE))
            df = df.withColumn(ROUTE_COLUMN, route.otherwise(F.lit(ROUTE_QUARANTINE)))
        with session_conf(df.sparkSession, WRITE_CONF):
            write = (
                df.write.mode("errorifexists")
                .option("compression", "snappy")
                .option("maxRecordsPerFile", str(self.options.max_records_per_file))
                .options(
                    **{
                        f"parquet.enable.dictionary#{name}": "false"
                        for name in NO_DICTIONARY_COLUMNS
                        if name in df.columns
                    }
                )
            )
            if routed:
                write = write.partitionBy(ROUTE_COLUMN)
            write.parquet(f"{self.options.path}/{self.folder}")

    # -- 2. the driver describes the files ----------------------------------------------------
    def _describe_files(self, schema: Any) -> DeltaCommitMessage:
        fs, root = pafs.FileSystem.from_uri(self.options.path)
        table_files, quarantine_files = [], []
        for info in fs.get_file_info(pafs.FileSelector(f"{root}/{self.folder}", recursive=True)):
            if info.type != pafs.FileType.File:
                continue
            relative = info.path[len(root) + 1 :]
            route = _route_of(relative, self.folder)
            if route == ROUTE_TABLE:
                table_files.append(info)
            elif route == ROUTE_QUARANTINE:
                quarantine_files.append(info)
            else:  # _SUCCESS, .crc checksums: never part of the table
                fs.delete_file(info.path)
        with ThreadPoolExecutor(FILE_READERS) as pool:
            described = list(pool.map(lambda i: self._read_file(fs, i), table_files))
        message = DeltaCommitMessage()
        for info, (footer, max_event) in zip(table_files, described, strict=True):
            if footer.num_rows == 0:  # Spark writes an empty file for an empty DataFrame
                fs.delete_file(info.path)
                continue
            for bucket, micros in max_event.items():
                message.max_event_time_us[bucket] = max(
                    micros, message.max_event_time_us.get(bucket, micros)
                )
            message.files.append(
                WrittenFile(
                    path=info.path[len(root) + 1 :],
                    size=info.size,
                    partition_values={},
                    modification_time=info.mtime_ns // 1_000_000,
                    stats=footer_stats_json(footer, schema),
                )
            )
            message.records += footer.num_rows
        if quarantine_files:
            self._rewrite_quarantine(fs, quarantine_files, message)
        return message

    def _rewrite_quarantine(
        self, fs: Any, files: list[pafs.FileInfo], message: DeltaCommitMessage
    ) -> None:
        """Rewrite the quarantined rows into the quarantine table's schema (with pyarrow, one
        file; bounded memory), then delete Spark's files of them."""
        assert self.options.quarantine_path is not None
        writer: ParquetFileWriter | None = None
        try:
            for batch in _batches(fs, files):
                if self.options.pipeline is not None:
                    track_event_times(message, batch, self.options.event_time_column)
                _, bad = split_quarantine(batch)
                if bad.num_rows == 0:
                    continue
                if writer is None:
                    writer = ParquetFileWriter(self.options.quarantine_path, bad, {})
                writer.write(bad)
                message.quarantined += bad.num_rows
                count_reasons(message, bad)
            if writer is not None:
                message.quarantine_files.append(writer.close())
                writer = None
        except BaseException:
            if writer is not None:
                writer.discard()
            raise
        for info in files:
            fs.delete_file(info.path)
        with contextlib.suppress(FileNotFoundError, OSError):
            fs.delete_dir(files[0].path.rsplit("/", 1)[0])  # the emptied route folder

    def _read_file(self, fs: Any, info: pafs.FileInfo) -> tuple[Any, dict[int, int]]:
        """A written file's footer and, with a pipeline, the max event time per bucket of its
        rows, which each commit records for the watermark: one open of the file, scanning only
        its ``bucket`` and event-time columns, in batches (bounded memory)."""
        columns = ["bucket", self.options.event_time_column]
        found = DeltaCommitMessage()
        with fs.open_input_file(info.path) as source:
            parquet = pq.ParquetFile(source)
            if self.options.pipeline is not None and set(columns) <= set(
                parquet.schema_arrow.names
            ):
                for batch in parquet.iter_batches(batch_size=SCAN_BATCH_ROWS, columns=columns):
                    track_event_times(found, batch, self.options.event_time_column)
            return parquet.metadata, found.max_event_time_us

    # -- failure ------------------------------------------------------------------------------
    def _remove_folder(self, *, only_if_empty: bool = False) -> None:
        remove_attempt_folder(self.options.path, self.folder, only_if_empty=only_if_empty)


def remove_attempt_folder(table_uri: str, folder: str, *, only_if_empty: bool = False) -> None:
    """Delete an attempt's folder of the table at ``table_uri``; with ``only_if_empty``, only
    if no file is left in it (a commit that landed keeps its files)."""
    fs, root = pafs.FileSystem.from_uri(table_uri)
    path = f"{root}/{folder}"
    with contextlib.suppress(FileNotFoundError):
        if only_if_empty:
            left = fs.get_file_info(pafs.FileSelector(path, recursive=True))
            if any(i.type == pafs.FileType.File for i in left):
                return
        fs.delete_dir(path)


def _route_of(relative: str, folder: str) -> str | None:
    """Which output a listed file is: ``table``, ``quarantine`` or None (not a data file)."""
    parts = relative.split("/")
    name = parts[-1]
    if parts[0] != folder or not (name.startswith("part-") and name.endswith(".parquet")):
        return None
    if len(parts) == 2:
        return ROUTE_TABLE
    if len(parts) == 3 and parts[1].startswith(f"{ROUTE_COLUMN}="):
        route = parts[1].split("=", 1)[1]
        return route if route in (ROUTE_TABLE, ROUTE_QUARANTINE) else None
    return None


def _batches(fs: Any, files: list[pafs.FileInfo]) -> Iterator[Any]:
    for info in files:
        with fs.open_input_file(info.path) as source:
            yield from pq.ParquetFile(source).iter_batches()


__all__ = ["BATCH_WRITERS", "BatchWriter", "write_batch"]
