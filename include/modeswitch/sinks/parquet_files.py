"""Parquet files as the sink writes them with pyarrow, and their Delta statistics.

:class:`ParquetFileWriter` writes one file of one partition into a table's folder (row groups
of about :data:`ROW_GROUP_ROWS` rows, dictionary encoding only where values repeat) and
describes it as a :class:`WrittenFile`: what a Delta add action needs, its statistics
included. :func:`footer_stats_json` gives the same statistics for a file written elsewhere
(by Spark), from its footer alone. Used by the tasks' writer (:mod:`modeswitch.sinks.files`)
and by the driver of Spark's native write (:mod:`modeswitch.sinks.native`).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from modeswitch.errors import StorageWriteError

STRING_STATS_PREFIX = 32
"""String columns whose min or max is longer than this get no bounds in the statistics."""
ROW_GROUP_ROWS = 262_144
"""About how many rows :class:`ParquetFileWriter` gathers into one row group."""


@dataclass
class WrittenFile:
    """A Parquet file written into a table's folder, as a Delta add action describes it."""

    path: str  # relative to the table root, URL-style
    size: int
    partition_values: dict[str, str | None]
    modification_time: int
    stats: str


class _ColumnStats:
    """Min / max / null count of one column, as Delta's JSON statistics want them.

    Most columns take them from the Parquet footer the writer produces anyway (free).
    Floating-point columns are tracked while writing (``track_floats``), because Parquet
    statistics leave NaN out and a max that ignores NaN would let readers skip files wrongly;
    where they cannot be tracked (files written by Spark), they get no min / max at all.
    """

    def __init__(self, dtype: pa.DataType, *, track_floats: bool = True) -> None:
        self.dtype = dtype
        self.nulls = 0
        self.seen = False  # a null count is only reported for a column that was counted
        self.min: Any = None
        self.max: Any = None
        self.usable = _stats_type(dtype)
        self.running = pa.types.is_floating(dtype) and track_floats
        if pa.types.is_floating(dtype) and not track_floats:
            self.usable = False

    def update(self, array: pa.Array | pa.ChunkedArray) -> None:
        """Track a floating-point column batch by batch."""
        self.seen = True
        self.nulls += array.null_count
        if not self.usable or array.null_count == len(array):
            return
        if pc.any(pc.is_nan(array)).as_py():
            self.usable = False
            return
        bounds = pc.min_max(array)
        self._widen(bounds["min"].as_py(), bounds["max"].as_py())

    def add_footer(self, stats: Any) -> None:
        """Fold in one row group's Parquet statistics (non-float columns)."""
        if stats is None:
            self.usable = False
            return
        self.seen = True
        self.nulls += stats.null_count
        if not stats.has_min_max:
            if stats.num_values > 0:
                # Values without bounds (Parquet drops min / max of very long values):
                # the other row groups' bounds would not cover them.
                self.usable = False
            return
        self._widen(stats.min, stats.max)

    def _widen(self, low: Any, high: Any) -> None:
        self.min = low if self.min is None else min(self.min, low)
        self.max = high if self.max is None else max(self.max, high)


def fold_footer(stats: Mapping[str, _ColumnStats], footer: pq.FileMetaData) -> None:
    """Fold a Parquet file's footer statistics into ``stats`` (columns not tracked while
    writing); top-level columns only."""
    for index in range(footer.num_columns):
        col = stats.get(footer.schema.column(index).path)
        if col is None or col.running:
            continue
        for group in range(footer.num_row_groups):
            col.add_footer(footer.row_group(group).column(index).statistics)


def footer_stats_json(footer: pq.FileMetaData, schema: pa.Schema) -> str:
    """Delta statistics of a Parquet file written elsewhere (by Spark), from its footer
    alone: the columns of ``schema``; floating-point columns get no min / max."""
    stats = {f.name: _ColumnStats(f.type, track_floats=False) for f in schema}
    fold_footer(stats, footer)
    return _stats_json(footer.num_rows, stats)


def _stats_type(dtype: pa.DataType) -> bool:
    return (
        pa.types.is_integer(dtype)
        or pa.types.is_floating(dtype)
        or pa.types.is_string(dtype)
        or pa.types.is_large_string(dtype)
        or pa.types.is_timestamp(dtype)
        or pa.types.is_date(dtype)
    )


def _stat_value(value: Any, *, upper: bool) -> Any:
    if isinstance(value, datetime):
        # Delta keeps timestamps to the millisecond: round the max up so skipping stays safe.
        micros = value.microsecond % 1000
        if upper and micros:
            value = value + timedelta(microseconds=1000 - micros)
        value = value - timedelta(microseconds=value.microsecond % 1000)
        if value.tzinfo is None:
            return value.isoformat(timespec="milliseconds")
        return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    return value


def _stats_json(records: int, stats: Mapping[str, _ColumnStats]) -> str:
    mins, maxs, nulls = {}, {}, {}
    for name, col in stats.items():
        if col.seen:
            nulls[name] = col.nulls
        if not col.usable or col.min is None:
            continue
        if isinstance(col.min, str) and (
            len(col.min) > STRING_STATS_PREFIX or len(col.max) > STRING_STATS_PREFIX
        ):
            continue  # a truncated max would be wrong; leave this column unbounded
        mins[name] = _stat_value(col.min, upper=False)
        maxs[name] = _stat_value(col.max, upper=True)
    return json.dumps(
        {"numRecords": records, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    )


class ParquetFileWriter:
    """One open Parquet file of one partition.

    Batches are gathered into row groups of about ``ROW_GROUP_ROWS`` (Spark hands over
    batches of 10 000 rows; one row group each would be slow to write and to read).
    """

    def __init__(self, table_uri: str, first: pa.RecordBatch, values: dict) -> None:
        schema = first.schema
        self.fs, self.root = pafs.FileSystem.from_uri(table_uri)
        self.values = values
        prefix = "".join(f"{k}={_partition_text(v)}/" for k, v in values.items())
        self.relative = f"{prefix}part-{uuid.uuid4().hex}-c000.snappy.parquet"
        full = self.full = f"{self.root}/{self.relative}"
        with naming_the_file(full):
            self.fs.create_dir(full.rsplit("/", 1)[0], recursive=True)
            self.writer = pq.ParquetWriter(
                full,
                schema,
                filesystem=self.fs,
                compression="snappy",
                use_dictionary=_dictionary_columns(first),
            )
        self.stats = {f.name: _ColumnStats(f.type) for f in schema}
        self.records = 0
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        self.records += batch.num_rows
        for name, col in self.stats.items():
            if col.running:
                col.update(batch.column(name))
        if self.pending_rows >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            table = pa.Table.from_batches(self.pending)
            with naming_the_file(self.full):
                self.writer.write_table(table, row_group_size=max(ROW_GROUP_ROWS, table.num_rows))
            self.pending, self.pending_rows = [], 0

    def close(self) -> WrittenFile:
        self._flush()
        with naming_the_file(self.full):
            self.writer.close()
        fold_footer(self.stats, self.writer.writer.metadata)
        info = self.fs.get_file_info(self.full)
        return WrittenFile(
            path=self.relative,
            size=info.size,
            partition_values={k: _partition_text(v) for k, v in self.values.items()},
            modification_time=int(time.time() * 1000),
            stats=_stats_json(self.records, self.stats),
        )

    def discard(self) -> None:
        """Close and remove the file; a full or read-only disk may refuse the close (its
        buffered rows), never the removal of what is there."""
        with contextlib.suppress(OSError):
            self.writer.close()
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.full)


@contextlib.contextmanager
def naming_the_file(path: str) -> Iterator[None]:
    """Turn an I/O error (no space left, a read-only filesystem) into a
    :class:`~modeswitch.errors.StorageWriteError` naming the file: pyarrow's names neither."""
    try:
        yield
    except StorageWriteError:
        raise
    except OSError as exc:
        raise StorageWriteError(f"writing the data file {path} failed: {exc}") from exc


def _dictionary_columns(sample: pa.RecordBatch) -> list[str]:
    """Columns worth dictionary encoding: those with mostly repeated values in a sample.

    Trying a dictionary on a column of unique values (offsets, JSON payloads) costs a third
    of the write time before Parquet gives up on it. A nested column (a struct, list or map of
    an Avro payload) is left to Parquet's default: its values cannot be counted as one.
    """
    rows = max(1, sample.num_rows)
    return [
        field.name
        for field, column in zip(sample.schema, sample.columns, strict=True)
        if not pa.types.is_nested(field.type) and pc.count_distinct(column).as_py() <= rows // 2
    ]


def _partition_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    return str(value)
