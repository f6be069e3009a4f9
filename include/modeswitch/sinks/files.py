"""The sink's executor side: a task's rows written as Parquet files with pyarrow.

Each task of a write (:func:`write_files`) writes its rows into the table's folder (any
filesystem pyarrow supports), the malformed ones into the quarantine table's folder, and returns
the files with their statistics (:mod:`modeswitch.sinks.parquet_files`) in a
:class:`DeltaCommitMessage`: nothing but file descriptions reaches the driver, which commits
them (:mod:`modeswitch.sinks.committer`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from pyspark.sql.datasource import WriterCommitMessage

from modeswitch.sinks.commits import add_reasons, event_time_to_micros
from modeswitch.sinks.options import DeltaSinkOptions
from modeswitch.sinks.parquet_files import ParquetFileWriter, WrittenFile
from modeswitch.transforms import QUARANTINE_REASON
from modeswitch.worker_gc import freeze_imports

log = logging.getLogger(__name__)

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
    open_files: dict[tuple, ParquetFileWriter] = {}
    quarantine: ParquetFileWriter | None = None
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if options.pipeline is not None:
                track_event_times(message, batch, options.event_time_column)
            if QUARANTINE_REASON in batch.schema.names:
                batch, bad = split_quarantine(batch)
                if bad.num_rows:
                    assert options.quarantine_path is not None
                    if quarantine is None:
                        quarantine = ParquetFileWriter(options.quarantine_path, bad, {})
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
                    writer = open_files[key] = ParquetFileWriter(options.path, part, values)
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


def split_quarantine(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, pa.RecordBatch]:
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


def track_event_times(message: DeltaCommitMessage, batch: pa.RecordBatch, event_col: str) -> None:
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
