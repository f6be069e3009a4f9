"""The ``modeswitch_delta`` sink: a PySpark data source writer that commits to Delta exactly once.

Executors write Parquet files with pyarrow straight into the table's folder (any filesystem
pyarrow supports) and return, in a commit message, the files with their statistics. The
driver then makes one atomic Delta commit per batch write or micro-batch with ``deltalake``.
Nothing but file descriptions reaches the driver.

With ``pipeline`` and ``epoch`` set, every commit also carries the offsets range it covers,
its epoch and mode (see :mod:`modeswitch.sinks.commits`) and a Delta application transaction
``(pipeline, txn_version(epoch, sequence))``. Before committing, the driver checks the
table's transaction version for the pipeline:

- equal: this commit already landed (a replay after a crash); it is skipped and its files
  deleted;
- higher: a later epoch or sequence already committed; this writer is a zombie and is refused
  with :class:`FencedError`;
- lower: the commit goes ahead, made from exactly the snapshot that was checked, with no
  automatic retry. If any other commit landed in between, delta-rs refuses it
  (``CommitFailedError``) and the check is made again on the new snapshot. So two writers
  racing between check and commit cannot both land.

Options:

- ``path``: the table URI. ``storage.<key>``: storage options for deltalake and pyarrow.
- ``pipeline``, ``epoch``, ``mode`` (``batch`` / ``stream``): the exactly-once protocol.
- ``sequence``: batch writes: the wave's number within the epoch; streaming writes: the
  sequence of the checkpoint's micro-batch 0 (default 0), later ones count on from it.
- ``offsetsStart`` / ``offsetsEnd`` (JSON offsets maps): the source range this write covers.
  Batch writes with a pipeline must give ``offsetsEnd``. Streaming writes read the micro-batch's
  end from Spark's offsets log in ``checkpointLocation``; the start is the previous
  micro-batch's end, or ``offsetsStart`` for the first micro-batch.
- ``partitionBy``: comma-separated partition columns (for example an event date column).
- ``mergeSchema``: ``true`` to add new columns to the table; otherwise new columns are an error.
- ``maxRecordsPerFile``: roll files within a task (default 5 000 000).
- ``eventTimeColumn`` (default ``event_time``): its max per ``bucket`` is recorded per commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
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
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from modeswitch.errors import (
    FencedError,
    ModeswitchError,
    OffsetsContinuityError,
    SchemaMismatchError,
)
from modeswitch.faults import pause_point
from modeswitch.offsets import OffsetsMap, offsets_from_json
from modeswitch.resume import offsets_log_entry
from modeswitch.sinks.commits import (
    METADATA_KEY,
    SinkCommit,
    newest_commit_in,
    split_txn_version,
    txn_version,
)
from modeswitch.transforms import QUARANTINE_REASON

log = logging.getLogger(__name__)

SINK_NAME = "modeswitch_delta"
DEFAULT_MAX_RECORDS_PER_FILE = 5_000_000
STRING_STATS_PREFIX = 32
COMMIT_ATTEMPTS = 20
QUARANTINE_METADATA_KEY = "modeswitch_quarantine"
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
_UNSET: Any = object()
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# -- options ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeltaSinkOptions:
    """The sink's options, parsed and checked on the driver before anything is written."""

    path: str
    storage_options: dict[str, str]
    pipeline: str | None
    epoch: int | None
    mode: str
    sequence: int | None
    offsets_start: OffsetsMap | None
    offsets_end: OffsetsMap | None
    partition_by: tuple[str, ...]
    merge_schema: bool
    max_records_per_file: int
    event_time_column: str
    checkpoint_location: str | None
    quarantine_path: str | None = None
    expected_records: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> DeltaSinkOptions:
        opts = {k.lower(): v for k, v in options.items()}
        path = opts.get("path")
        if not path:
            raise ValueError("option path: the Delta table's URI is required (save(path))")
        pipeline = opts.get("pipeline") or None
        epoch = _int_option(opts, "epoch", minimum=0)
        if pipeline is not None and epoch is None:
            raise ValueError(f"option epoch: required with option pipeline={pipeline!r}")
        if pipeline is None and epoch is not None:
            raise ValueError("option pipeline: required with option epoch")
        mode = opts.get("mode", "batch").lower()
        if mode not in ("batch", "stream"):
            raise ValueError(f"option mode={mode!r}: expected 'batch' or 'stream'")
        merge = opts.get("mergeschema", "false").strip().lower()
        if merge not in ("true", "false"):
            raise ValueError(f"option mergeSchema={merge!r}: expected 'true' or 'false'")
        return cls(
            path=_absolute(path),
            storage_options={
                k[len("storage.") :]: v for k, v in opts.items() if k.startswith("storage.")
            },
            pipeline=pipeline,
            epoch=epoch,
            mode=mode,
            sequence=_int_option(opts, "sequence", minimum=0),
            offsets_start=_offsets_option(opts, "offsetsStart"),
            offsets_end=_offsets_option(opts, "offsetsEnd"),
            partition_by=tuple(
                c.strip() for c in opts.get("partitionby", "").split(",") if c.strip()
            ),
            merge_schema=merge == "true",
            max_records_per_file=_int_option(opts, "maxRecordsPerFile", minimum=1)
            or DEFAULT_MAX_RECORDS_PER_FILE,
            event_time_column=opts.get("eventtimecolumn", "event_time"),
            checkpoint_location=opts.get("checkpointlocation"),
            expected_records=_int_option(opts, "expectedRecords", minimum=0),
            quarantine_path=_absolute(opts["quarantinepath"])
            if opts.get("quarantinepath")
            else None,
        )


def _absolute(path: str) -> str:
    return path if "://" in path else os.path.abspath(path)


def _int_option(opts: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    raw = opts.get(name.lower())
    if raw is None or raw == "":
        return None
    try:
        value = int(str(raw).strip())
    except ValueError as exc:
        raise ValueError(f"option {name}={raw!r}: expected a whole number") from exc
    if value < minimum:
        raise ValueError(f"option {name}={raw!r}: must be at least {minimum}")
    return value


def _offsets_option(opts: Mapping[str, str], name: str) -> OffsetsMap | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    return offsets_from_json(raw, source=f"option {name}={raw!r}")


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
        full = f"{self.root}/{self.relative}"
        self.fs.create_dir(full.rsplit("/", 1)[0], recursive=True)
        self.writer = pq.ParquetWriter(
            full,
            schema,
            filesystem=self.fs,
            compression="snappy",
            use_dictionary=_dictionary_columns(first),
        )
        self.full = full
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
            self.writer.write_table(table, row_group_size=max(ROW_GROUP_ROWS, table.num_rows))
            self.pending, self.pending_rows = [], 0

    def close(self) -> WrittenFile:
        self._flush()
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
        self.writer.close()
        self.fs.delete_file(self.full)


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


def write_files(options: DeltaSinkOptions, batches: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
    """Write a task's batches as Parquet files in the table folder; describe them.

    Rows whose ``_quarantine_reason`` is set go to files in the quarantine table's folder
    instead (see :data:`QUARANTINE_SCHEMA`); nothing is dropped.
    """
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
                if batch.num_rows == 0:
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
            micros = _micros(latest)
            message.max_event_time_us[bucket] = max(
                micros, message.max_event_time_us.get(bucket, micros)
            )


def _micros(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - EPOCH) // timedelta(microseconds=1)


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


# -- driver: one atomic commit ----------------------------------------------------------------
@dataclass(frozen=True)
class CommitOutcome:
    """What the driver's commit did."""

    status: str  # "committed", "replayed", "empty"
    table_version: int | None
    commit: SinkCommit | None


def commit_files(
    options: DeltaSinkOptions,
    schema: pa.Schema,
    messages: Sequence[WriterCommitMessage | None],
    *,
    sequence: int | None,
    start: OffsetsMap | None,
    end: OffsetsMap | None,
) -> CommitOutcome:
    """Commit the tasks' files to the table in one Delta commit, exactly once.

    ``start`` / ``end`` are the source offsets the commit covers (may be None without a
    pipeline). On refusal or replay the files are deleted and nothing becomes visible.
    """
    from deltalake import CommitProperties, Transaction
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction, create_table_with_add_actions

    parts = [m for m in messages if isinstance(m, DeltaCommitMessage)]
    files = [f for m in parts for f in m.files]
    quarantine_files = [f for m in parts for f in m.quarantine_files]
    quarantined = sum(m.quarantined for m in parts)
    records = sum(m.records for m in parts)
    max_event: dict[int, int] = {}
    for m in parts:
        for bucket, micros in m.max_event_time_us.items():
            max_event[bucket] = max(micros, max_event.get(bucket, micros))
    actions = [
        AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats)
        for f in files
    ]
    data_schema = pa.schema([f for f in schema if f.name != QUARANTINE_REASON])
    if quarantine_files and (options.pipeline is None or options.quarantine_path is None):
        raise ValueError("option quarantinePath: quarantined records need a pipeline and a path")
    landed = False
    try:
        table = _open_table(options)
        if options.quarantine_path and options.pipeline:
            # A crash may have come between the last commit and its quarantine commit.
            sync_quarantine(options, table)
        for attempt in range(COMMIT_ATTEMPTS):
            if attempt:
                table = _open_table(options)
            commit = None
            properties: dict[str, Any] = {"max_commit_retries": 0}
            if options.pipeline is not None:
                assert options.epoch is not None and sequence is not None
                previous = _check_fencing(table, options, sequence)
                if previous == "replayed":
                    _check_replay(table, options, sequence, end)
                    delete_message_files(options, parts)
                    version = table.version() if table is not None else None
                    return CommitOutcome("replayed", version, None)
                commit = _sink_commit(
                    options, sequence, start, end, records, max_event, previous, table
                )
                properties["app_transactions"] = [Transaction(options.pipeline, commit.txn_version)]
                properties["custom_metadata"] = commit.to_metadata()
                if quarantine_files:
                    properties["custom_metadata"][QUARANTINE_METADATA_KEY] = json.dumps(
                        {
                            "records": quarantined,
                            "files": [dataclasses.asdict(f) for f in quarantine_files],
                        },
                        separators=(",", ":"),
                    )
            elif not actions:
                return CommitOutcome("empty", table.version() if table else None, None)
            pause_point("sink.between_check_and_commit")
            try:
                if table is None:
                    create_table_with_add_actions(
                        options.path,
                        _delta_schema(data_schema),
                        actions,
                        mode="error",
                        partition_by=list(options.partition_by) or None,
                        storage_options=options.storage_options,
                        commit_properties=CommitProperties(**properties),
                    )
                else:
                    table_schema = _merge_schema(table, data_schema, options)
                    table.create_write_transaction(
                        actions,
                        "append",
                        table_schema,
                        partition_by=list(options.partition_by) or None,
                        commit_properties=CommitProperties(**properties),
                    )
            except CommitFailedError:
                log.info("sink commit raced another commit (attempt %d); checking again", attempt)
                time.sleep(min(0.5, 0.01 * 2**attempt))
                continue
            except Exception as exc:
                if table is None and "exists" in str(exc).lower():
                    continue  # another writer created the table first: check again
                raise
            landed = True  # from here on, the files belong to the table: never delete them
            pause_point("sink.after_commit")
            # No automatic retry: the commit landed exactly on top of the checked snapshot.
            version = 0 if table is None else table.version() + 1
            if quarantine_files:
                pause_point("sink.before_quarantine_commit")
                sync_quarantine(options)
            log.info(
                "sink commit %s: %d records in %d files, table version %d",
                commit.txn_version if commit else "(no pipeline)",
                records,
                len(files),
                version,
            )
            return CommitOutcome("committed", version, commit)
        raise ModeswitchError(
            f"sink {options.path}: gave up after {COMMIT_ATTEMPTS} commit attempts, each "
            "raced by another commit"
        )
    except BaseException:
        if not landed:
            delete_message_files(options, parts)
        raise


def _open_table(options: DeltaSinkOptions) -> Any:
    """The sink table's current snapshot, None before the first commit.

    The table is loaded once per process and brought up to date with
    ``update_incremental()`` (only the log entries since): a stream commits every micro-batch
    from the same reused Python worker, and loading the table afresh read its checkpoint and
    up to 99 log entries each time (15 ms on average on a quiet machine, 60 ms under load,
    growing until the next Delta checkpoint). The snapshot is as current as a fresh load's,
    so the fencing check and the commit made from it are unchanged.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    key = (options.path, tuple(sorted(options.storage_options.items())))
    table = _OPEN_TABLES.get(key)
    if table is not None:
        try:
            table.update_incremental()
            return table
        except Exception as exc:  # deleted or replaced under us: load it afresh below
            log.info("sink %s: reloading the table (%s)", options.path, exc)
            _OPEN_TABLES.pop(key, None)
    try:
        table = DeltaTable(options.path, storage_options=options.storage_options)
    except TableNotFoundError:
        return None
    if len(_OPEN_TABLES) >= OPEN_TABLES_KEPT:
        _OPEN_TABLES.clear()
    _OPEN_TABLES[key] = table
    return table


OPEN_TABLES_KEPT = 8
_OPEN_TABLES: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}


def sync_quarantine(options: DeltaSinkOptions, table: Any = _UNSET) -> int:
    """Commit to the quarantine table the files that the pipeline's newest sink commit lists,
    unless the quarantine table already holds them; returns how many files it committed. If
    the newest sink commit is a rewind, delete the rewound rows from the quarantine instead,
    unless that is done (returns 1 if this call did it).

    The sink commit is the truth: its metadata lists its quarantine files, and the quarantine
    commit carries the same app-transaction version, so a crash between the two is repaired
    by the next commit (or by calling this) and never commits them twice.
    """
    from modeswitch.sinks.commits import newest_commit_entry

    assert options.pipeline is not None and options.quarantine_path is not None
    if table is _UNSET:
        table = _open_table(options)
    if table is None:
        return 0
    found = newest_commit_entry(table, options.pipeline)
    if found is not None and found[0].is_rewind:
        from modeswitch.sinks.rewind import rewind_quarantine

        rewound = rewind_quarantine(
            options.quarantine_path,
            options.pipeline,
            found[0],
            storage_options=options.storage_options,
        )
        return int(rewound)
    if found is None or QUARANTINE_METADATA_KEY not in found[1]:
        return 0
    commit, info = found
    files = [WrittenFile(**f) for f in json.loads(info[QUARANTINE_METADATA_KEY])["files"]]
    return commit_quarantine(options, files, commit.txn_version)


def commit_quarantine(options: DeltaSinkOptions, files: Sequence[WrittenFile], version: int) -> int:
    """One quarantine commit for the sink commit with app-transaction ``version``."""
    from deltalake import CommitProperties, DeltaTable, Transaction
    from deltalake.exceptions import CommitFailedError, TableNotFoundError
    from deltalake.transaction import AddAction, create_table_with_add_actions

    assert options.pipeline is not None and options.quarantine_path is not None
    actions = [
        AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats)
        for f in files
    ]
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            table = DeltaTable(options.quarantine_path, storage_options=options.storage_options)
        except TableNotFoundError:
            table = None
        current = table.transaction_version(options.pipeline) if table is not None else None
        if current is not None and current >= version:
            return 0
        properties = CommitProperties(
            max_commit_retries=0, app_transactions=[Transaction(options.pipeline, version)]
        )
        try:
            if table is None:
                create_table_with_add_actions(
                    options.quarantine_path,
                    _delta_schema(QUARANTINE_SCHEMA),
                    actions,
                    mode="error",
                    storage_options=options.storage_options,
                    commit_properties=properties,
                )
            else:
                table.create_write_transaction(
                    actions, "append", QUARANTINE_SCHEMA, commit_properties=properties
                )
        except CommitFailedError:
            time.sleep(min(0.5, 0.01 * 2**attempt))
            continue
        except Exception as exc:
            if table is None and "exists" in str(exc).lower():
                continue
            raise
        log.info("quarantine commit %d: %d files", version, len(files))
        return len(files)
    raise ModeswitchError(
        f"quarantine {options.quarantine_path}: gave up after {COMMIT_ATTEMPTS} attempts"
    )


def _check_fencing(table: Any, options: DeltaSinkOptions, sequence: int) -> Any:
    """Compare with the table's app transaction; return the previous commit or 'replayed'."""
    assert options.pipeline is not None and options.epoch is not None
    mine = txn_version(options.epoch, sequence)
    current = table.transaction_version(options.pipeline) if table is not None else None
    if current is not None and current == mine:
        log.warning(
            "sink: epoch %d sequence %d already committed (a replay); skipped",
            options.epoch,
            sequence,
        )
        return "replayed"
    if current is not None and current > mine:
        epoch, seq = split_txn_version(current)
        raise FencedError(
            f"sink {options.path}: refused commit of pipeline {options.pipeline!r} epoch "
            f"{options.epoch} sequence {sequence}: the table already holds epoch {epoch} "
            f"sequence {seq}. This writer belongs to an ended epoch (a zombie) or replays "
            "out of order."
        )
    if current is None:
        return None
    return _latest_commit(table, options.pipeline)


def _check_replay(table: Any, options: DeltaSinkOptions, sequence: int, end: Any) -> None:
    """A replay must cover what the commit it replays covered: the same end offsets. One that
    does not (two runs of an epoch that planned a micro-batch differently) is refused, so the
    run that thinks it committed other offsets than the sink holds cannot go on."""
    landed = _latest_commit(table, options.pipeline)  # type: ignore[arg-type]
    if end is None or landed is None or landed.sequence != sequence:
        return
    differ = {b: (o, landed.end.get(b)) for b, o in end.items() if landed.end.get(b) != o}
    if differ:
        raise OffsetsContinuityError(
            f"sink {options.path}: epoch {options.epoch} sequence {sequence} is already "
            f"committed with other end offsets (this write, the sink's): {differ}"
        )


def _latest_commit(table: Any, pipeline: str) -> SinkCommit | None:
    return newest_commit_in(table, pipeline)


def _sink_commit(
    options: DeltaSinkOptions,
    sequence: int,
    start: OffsetsMap | None,
    end: OffsetsMap | None,
    records: int,
    max_event: dict[int, int],
    previous: SinkCommit | None,
    table: Any,
) -> SinkCommit:
    assert options.pipeline is not None and options.epoch is not None
    before = dict(previous.end) if previous else {}
    if end is None:
        raise ModeswitchError(
            f"sink {options.path}: no end offsets for epoch {options.epoch} sequence "
            f"{sequence} (give option offsetsEnd, or checkpointLocation for streaming writes)"
        )
    begin = dict(start) if start is not None else {b: before.get(b, 0) for b in end}
    for bucket, offset in end.items():
        first = begin.get(bucket, before.get(bucket, offset))
        if first > offset:
            raise OffsetsContinuityError(
                f"sink {options.path}: bucket {bucket}: start offset {first} is after end "
                f"offset {offset} (epoch {options.epoch} sequence {sequence})"
            )
        if bucket in before and first != before[bucket]:
            kind = "a gap" if first > before[bucket] else "an overlap"
            raise OffsetsContinuityError(
                f"sink {options.path}: bucket {bucket}: epoch {options.epoch} sequence "
                f"{sequence} starts at offset {first} but the sink holds up to offset "
                f"{before[bucket]}: {kind}. A commit must continue where the last one ended."
            )
    full_end = {**before, **end}
    return SinkCommit(
        pipeline=options.pipeline,
        epoch=options.epoch,
        mode=options.mode,  # type: ignore[arg-type]
        sequence=sequence,
        start={b: begin.get(b, before.get(b, end[b])) for b in end},
        end=full_end,
        records=records,
        max_event_time_us=max_event,
    )


def _delta_schema(schema: pa.Schema) -> Any:
    from deltalake import Schema

    return Schema.from_arrow(schema)


def _merge_schema(table: Any, incoming: pa.Schema, options: DeltaSinkOptions) -> pa.Schema:
    """The schema to commit with: the table's, plus new columns when mergeSchema is set."""
    from deltalake import Field

    current = pa.schema(table.schema().to_arrow())
    added = check_additive(current, incoming, options)
    if added:
        fields = [incoming.field(n) for n in added]
        table.alter.add_columns([Field.from_arrow(f) for f in fields])
        log.info("sink %s: added columns %s", options.path, ", ".join(added))
        current = pa.schema(list(current) + fields)
    return current


def check_additive(current: pa.Schema, incoming: pa.Schema, options: DeltaSinkOptions) -> list[str]:
    """Refuse type changes, and new columns unless mergeSchema; return the new columns."""
    added, changed = schema_changes(current, incoming)
    if changed:
        raise SchemaMismatchError(
            f"sink {options.path}: columns change type: "
            + ", ".join(f"{n} ({old} -> {new})" for n, old, new in changed)
            + "; only additive schema changes are allowed"
        )
    if added and not options.merge_schema:
        raise SchemaMismatchError(
            f"sink {options.path}: new columns {', '.join(added)} are not in the table; "
            "set option mergeSchema=true to add them"
        )
    return added


def schema_changes(
    current: pa.Schema, incoming: pa.Schema
) -> tuple[list[str], list[tuple[str, str, str]]]:
    """New column names, and ``(name, old type, new type)`` for columns whose type changed."""
    existing = {f.name: f.type for f in current}
    added = [f.name for f in incoming if f.name not in existing]
    changed = [
        (f.name, str(existing[f.name]), str(f.type))
        for f in incoming
        if f.name in existing and not _same_type(existing[f.name], f.type)
    ]
    return added, changed


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    def norm(t: pa.DataType) -> pa.DataType:
        if pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return pa.string()
        if pa.types.is_timestamp(t):
            return pa.timestamp("us", "UTC" if t.tz else None)
        return t

    return norm(a).equals(norm(b))


def check_schema_before_write(options: DeltaSinkOptions, schema: pa.Schema) -> None:
    """Refuse a write whose columns the table cannot take, before any file is written."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    missing = [c for c in options.partition_by if c not in schema.names]
    if missing:
        raise ValueError(
            f"option partitionBy={','.join(options.partition_by)!r}: no column "
            f"{', '.join(missing)} in the data"
        )
    try:
        table = DeltaTable(options.path, storage_options=options.storage_options)
    except TableNotFoundError:
        return
    check_additive(pa.schema(table.schema().to_arrow()), schema, options)
    existing = table.metadata().partition_columns
    if existing and list(options.partition_by) != list(existing):
        raise ValueError(
            f"option partitionBy={','.join(options.partition_by)!r}: the table is "
            f"partitioned by {','.join(existing)!r}"
        )


# -- streaming: the micro-batch's offsets from Spark's offsets log ----------------------------
def micro_batch_offsets(checkpoint: str, batch_id: int) -> tuple[OffsetsMap | None, OffsetsMap]:
    """``(start, end)`` of micro-batch ``batch_id`` from the query's offsets log.

    Spark writes ``<checkpoint>/offsets/<id>`` before running a micro-batch; its last line is
    the source's end offsets. The start is the previous micro-batch's end (None for batch 0).
    """
    end = offsets_log_entry(checkpoint, batch_id)
    if end is None:
        raise ModeswitchError(
            f"sink: Spark's offsets log in {checkpoint} has no entry for micro-batch {batch_id}"
        )
    return (offsets_log_entry(checkpoint, batch_id - 1) if batch_id > 0 else None, end)


# -- the PySpark data source ------------------------------------------------------------------
class DeltaSinkWriter(DataSourceArrowWriter):
    """Batch writes: one Delta commit for the whole write."""

    def __init__(self, options: DeltaSinkOptions, schema: pa.Schema) -> None:
        self.options = options
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        return write_files(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_files(
            self.options,
            self.schema,
            messages,
            sequence=self.options.sequence if self.options.sequence is not None else 0,
            start=self.options.offsets_start,
            end=self.options.offsets_end,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        delete_message_files(self.options, messages)


class DeltaSinkStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes: one Delta commit per micro-batch; its sequence is the micro-batch id
    plus the option ``sequence`` (0 by default: a stream restarted with a fresh checkpoint
    counts on from the sequences its epoch already committed)."""

    def __init__(self, options: DeltaSinkOptions, schema: pa.Schema) -> None:
        self.options = options
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        return write_files(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        start: OffsetsMap | None = None
        end: OffsetsMap | None = None
        if self.options.pipeline is not None:
            if self.options.checkpoint_location is None:
                raise ValueError(
                    "option checkpointLocation: required for streaming writes with a pipeline"
                )
            start, end = micro_batch_offsets(self.options.checkpoint_location, batchId)
            if start is None:
                start = self.options.offsets_start
        sequence = (self.options.sequence or 0) + batchId
        commit_files(self.options, self.schema, messages, sequence=sequence, start=start, end=end)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        delete_message_files(self.options, messages)


class DeltaSinkDataSource(DataSource):
    """``df.write.format("modeswitch_delta")`` / ``df.writeStream.format("modeswitch_delta")``."""

    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def writer(self, schema: Any, overwrite: bool) -> DeltaSinkWriter:
        return DeltaSinkWriter(*prepare_write(self.options, schema, overwrite=overwrite))

    def streamWriter(self, schema: Any, overwrite: bool) -> DeltaSinkStreamWriter:
        # Spark asks for a stream writer twice per micro-batch; the table's schema is checked
        # once per worker process and query (every commit checks it again anyway).
        key = (json.dumps(self.options, sort_keys=True, default=str), schema.json(), overwrite)
        prepared = _PREPARED_STREAM_WRITERS.get(key)
        if prepared is None:
            prepared = prepare_write(self.options, schema, overwrite=overwrite, streaming=True)
            _PREPARED_STREAM_WRITERS.clear()
            _PREPARED_STREAM_WRITERS[key] = prepared
        return DeltaSinkStreamWriter(*prepared)


_PREPARED_STREAM_WRITERS: dict[tuple[str, str, bool], tuple[DeltaSinkOptions, pa.Schema]] = {}


def prepare_write(
    raw_options: Mapping[str, str], schema: Any, *, overwrite: bool, streaming: bool = False
) -> tuple[DeltaSinkOptions, pa.Schema]:
    """Parse and check a write's options and Spark schema on the driver, before any file is
    written; return the options and the table's Arrow schema (without the quarantine reason).

    Shared by both data paths: the Python data source writer and Spark's own Parquet writer
    (:mod:`modeswitch.sinks.native`).
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    if overwrite:
        raise ValueError(
            f"{SINK_NAME}: mode overwrite is not supported; the sink only appends "
            "(offsets must never go backwards)"
        )
    options = DeltaSinkOptions.parse(raw_options)
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    if QUARANTINE_REASON in arrow_schema.names:
        if options.quarantine_path is None or options.pipeline is None:
            raise ValueError(
                f"option quarantinePath: the data has a {QUARANTINE_REASON} column, so "
                "malformed records need a quarantine table (and a pipeline); refusing to "
                "write rather than lose them"
            )
        arrow_schema = arrow_schema.remove(arrow_schema.get_field_index(QUARANTINE_REASON))
    if not streaming and options.pipeline is not None and options.offsets_end is None:
        raise ValueError(
            "option offsetsEnd: batch writes with a pipeline must say which source "
            "offsets they cover"
        )
    check_schema_before_write(options, arrow_schema)
    return options, arrow_schema


def register(spark: Any) -> None:
    """Register the ``modeswitch_delta`` sink with a Spark session."""
    spark.dataSource.register(DeltaSinkDataSource)


def vacuum(
    table_uri: str,
    *,
    retention: timedelta = timedelta(days=7),
    dry_run: bool = False,
    storage_options: Mapping[str, str] | None = None,
) -> list[str]:
    """Delete files in the table folder that no table version references and that are older
    than ``retention``: what failed or aborted writes left behind.

    Files younger than ``retention`` are kept, because a running write may be about to commit
    them: keep ``retention`` well above the longest write.
    """
    from deltalake import DeltaTable

    table = DeltaTable(table_uri, storage_options=dict(storage_options or {}))
    hours = retention.total_seconds() / 3600
    return table.vacuum(
        retention_hours=int(hours),
        dry_run=dry_run,
        enforce_retention_duration=False,
        full=True,
    )


__all__ = [
    "METADATA_KEY",
    "SINK_NAME",
    "CommitOutcome",
    "DeltaSinkDataSource",
    "DeltaSinkOptions",
    "commit_files",
    "micro_batch_offsets",
    "register",
    "vacuum",
]
