"""The sink's executor side: Parquet files written with pyarrow, and their Delta statistics.

Each task of a write (:func:`write_files`) writes its rows into the table's folder (any
filesystem pyarrow supports), the malformed ones into the quarantine table's folder, and returns
the files with their statistics in a :class:`DeltaCommitMessage`: nothing but file
descriptions reaches the driver, which commits them (:mod:`modeswitch.sinks.committer`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql.datasource import WriterCommitMessage

from modeswitch.errors import StorageWriteError
from modeswitch.sinks.commits import add_reasons, event_time_to_micros
from modeswitch.sinks.options import DeltaSinkOptions
from modeswitch.transforms import QUARANTINE_REASON
from modeswitch.worker_gc import freeze_imports

log = logging.getLogger(__name__)

STRING_STATS_PREFIX = 32
QUARANTINE_SCHEMA = pa.schema(
    [
        ("bucket", pa.int32()),
        ("offset", pa.int64()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("key", pa.string()),
        ("value", pa.string()),
        ("reason", pa.string()),
    ]
)
"""The quarantine table: each malformed record with its bucket, offset, raw value and why."""
ROW_GROUP_ROWS = 262_144


# -- executors: files and their statistics ----------------------------------------------------
@dataclass
class WrittenFile:
    path: str  # relative to the table root, URL-style
    size: int
    partition_values: dict[str, str | None]
    modification_time: int
    stats: str


@dataclass
class DeltaCommitMessage(WriterCommitMessage):
    """What one task wrote: files, record count, and max event time per bucket."""

    files: list[WrittenFile] = field(default_factory=list)
    records: int = 0
    quarantine_files: list[WrittenFile] = field(default_factory=list)
    quarantined: int = 0
    max_event_time_us: dict[int, int] = field(default_factory=dict)
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    """The quarantined records' reasons, with counts (:func:`count_reasons`)."""


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


class _FileWriter:
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
    of the write time before Parquet gives up on it.
    """
    rows = max(1, sample.num_rows)
    return [
        field.name
        for field, column in zip(sample.schema, sample.columns, strict=True)
        if pc.count_distinct(column).as_py() <= rows // 2
    ]


def _partition_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    return str(value)


def write_files(
    options: DeltaSinkOptions, batches: Iterator[pa.RecordBatch], *, write_data: bool = True
) -> DeltaCommitMessage:
    """Write a task's batches as Parquet files in the table folder; describe them.

    Rows whose ``_quarantine_reason`` is set go to files in the quarantine table's folder
    instead (see :data:`QUARANTINE_SCHEMA`); nothing is dropped. With ``write_data`` False the
    good rows are only counted (and their event times tracked), for a writer that writes them
    itself (:mod:`modeswitch.sinks.delta_spark`).
    """
    freeze_imports()
    message = DeltaCommitMessage()
    open_files: dict[tuple, _FileWriter] = {}
    quarantine: _FileWriter | None = None
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if options.pipeline is not None:
                _track_event_times(message, batch, options.event_time_column)
            if QUARANTINE_REASON in batch.schema.names:
                batch, bad = _split_quarantine(batch)
                if bad.num_rows:
                    assert options.quarantine_path is not None
                    if quarantine is None:
                        quarantine = _FileWriter(options.quarantine_path, bad, {})
                    quarantine.write(bad)
                    message.quarantined += bad.num_rows
                    count_reasons(message, bad)
                if batch.num_rows == 0:
                    continue
            if not write_data:
                message.records += batch.num_rows
                continue
            for values, part in _split_by_partition(batch, options.partition_by):
                key = tuple(values.items())
                writer = open_files.get(key)
                if writer is None:
                    writer = open_files[key] = _FileWriter(options.path, part, values)
                writer.write(part)
                message.records += part.num_rows
                if writer.records >= options.max_records_per_file:
                    message.files.append(open_files.pop(key).close())
        for writer in open_files.values():
            message.files.append(writer.close())
        open_files.clear()
        if quarantine is not None:
            message.quarantine_files.append(quarantine.close())
            quarantine = None
    except BaseException:
        for writer in [*open_files.values(), *([quarantine] if quarantine else [])]:
            writer.discard()
        delete_message_files(options, [message])
        raise
    return message


def count_reasons(message: DeltaCommitMessage, bad: pa.RecordBatch) -> None:
    """Count the reasons of quarantined rows (:data:`QUARANTINE_SCHEMA`) into ``message``."""
    counted = pc.value_counts(bad.column("reason")).to_pylist()
    add_reasons(message.quarantine_reasons, {c["values"]: c["counts"] for c in counted})


def _split_quarantine(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, pa.RecordBatch]:
    """Good rows without the reason column, and bad rows in the quarantine schema."""
    reason = batch.column(QUARANTINE_REASON)
    bad_mask = pc.is_valid(reason)
    good = batch.filter(pc.invert(bad_mask)).drop_columns([QUARANTINE_REASON])
    if not pc.any(bad_mask).as_py():
        return good, batch.slice(0, 0)
    bad = batch.filter(bad_mask)
    columns = []
    for field_ in QUARANTINE_SCHEMA:
        name = QUARANTINE_REASON if field_.name == "reason" else field_.name
        if name in bad.schema.names:
            columns.append(bad.column(name).cast(field_.type))
        else:
            columns.append(pa.nulls(bad.num_rows, field_.type))
    return good, pa.RecordBatch.from_arrays(columns, schema=QUARANTINE_SCHEMA)


def _split_by_partition(
    batch: pa.RecordBatch, columns: Sequence[str]
) -> Iterator[tuple[dict, pa.RecordBatch]]:
    if not columns:
        yield {}, batch
        return
    table = pa.Table.from_batches([batch])
    keys = table.select(list(columns)).group_by(list(columns)).aggregate([])
    data_columns = [n for n in table.column_names if n not in columns]
    for row in keys.to_pylist():
        mask = None
        for col in columns:
            value = row[col]
            cond = pc.is_null(table[col]) if value is None else pc.equal(table[col], value)
            mask = cond if mask is None else pc.and_(mask, cond)
        part = table.filter(mask).select(data_columns).combine_chunks()
        for out in part.to_batches():
            yield row, out


def _track_event_times(message: DeltaCommitMessage, batch: pa.RecordBatch, event_col: str) -> None:
    """Max event time per bucket: what the watermark is computed from.

    Plain compute kernels, not ``Table.group_by``: a group-by loads pyarrow's Acero engine,
    which imports pyarrow.dataset and pandas, about a second of a cold writer worker's first
    micro-batch on this machine. A batch holds a few buckets at most.
    """
    names = batch.schema.names
    if "bucket" not in names or event_col not in names:
        return
    buckets = batch.column("bucket")
    times = batch.column(event_col)
    for bucket in pc.unique(buckets).to_pylist():
        if bucket is None:
            continue
        latest = pc.max(pc.filter(times, pc.equal(buckets, bucket))).as_py()
        if latest is not None:
            micros = event_time_to_micros(latest)
            message.max_event_time_us[bucket] = max(
                micros, message.max_event_time_us.get(bucket, micros)
            )


def delete_message_files(
    options: DeltaSinkOptions, messages: Sequence[WriterCommitMessage | None]
) -> None:
    """Remove every file the tasks wrote, in the table and in the quarantine."""
    parts = [m for m in messages if isinstance(m, DeltaCommitMessage)]
    delete_files(options.path, [f for m in parts for f in m.files])
    if options.quarantine_path:
        delete_files(options.quarantine_path, [f for m in parts for f in m.quarantine_files])


def delete_files(table_uri: str, files: Sequence[WrittenFile]) -> None:
    """Remove written files that will never be committed (abort, replay, refusal)."""
    if not files:
        return
    fs, root = pafs.FileSystem.from_uri(table_uri)
    for written in files:
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(f"{root}/{written.path}")
