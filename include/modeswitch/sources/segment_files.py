"""The embedded log's files: its layout under a root, and reading and writing one segment file
(or a run of them). :class:`~modeswitch.sources.segments.SegmentLog` is the log built on them.

Layout under a root that pyarrow can address (a local path, ``file://``, ``s3://``, ``gs://``,
``hdfs://``)::

    <root>/_log.json                               {"format": ..., "buckets": N}
    <root>/<bucket>/<20-digit base offset>.parquet  one immutable segment

A segment holds the records ``[base, base + num_rows)`` of its bucket; consecutive segments
of a bucket are contiguous. Segments are written aside (a dot-file) and published with a
rename (:func:`publish_segment`), so a reader never sees half a segment; a publish that would
land on an existing segment is refused. Appenders on the same bucket hold its lock
(:func:`bucket_lock`, local and POSIX filesystems only).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from modeswitch.errors import ModeswitchError, SegmentConflictError
from modeswitch.sources.base import RECORD_SCHEMA

LOG_FORMAT = "modeswitch-segments"
LOG_FORMAT_VERSION = 1
META_FILE = "_log.json"
OFFSET_DIGITS = 20
SEGMENT_NAME_LENGTH = OFFSET_DIGITS + len(".parquet")
SEGMENT_WRITE_OPTIONS: dict = {"compression": "snappy", "use_dictionary": ["bucket"]}
"""How segments are written: dictionary encoding for the one-value ``bucket`` column only.
Offsets, times, keys and payloads barely repeat; a dictionary for them is built, overflows
and is abandoned by the writer, and its pages cost every reader a decoding pass (Spark's
read of a segment + the default transform: ~15 % less CPU without them, docs/BENCHMARKS.md)."""


OPEN_SEGMENT_GROUP_RECORDS = 8_192
"""An append to an open segment joins its last row group while that holds fewer records than
this, else starts a row group of its own (:func:`grown_groups`). A reader of part of a
segment decodes every row group it touches whole, so a segment of one row group made a
stream's first micro-batch after a batch decode, in each bucket, all of the segment its range
begins in (a producer's bulk append of 10 000-50 000 records, extended by its live flushes) to
keep a few hundred: 170 ms of a 55 000-record read of 176 segments. Groups of at least this
many records keep whole-segment reads as cheap as before (docs/BENCHMARKS.md)."""


def grown_groups(
    groups: tuple[int, ...], added: int, *, joined_below: int = OPEN_SEGMENT_GROUP_RECORDS
) -> tuple[int, ...]:
    """The row groups (record counts, in order) of an open segment of ``groups`` with
    ``added`` records appended: the last group grown while it holds fewer than
    ``joined_below``, else a new group (:data:`OPEN_SEGMENT_GROUP_RECORDS`)."""
    if groups and groups[-1] < joined_below:
        return (*groups[:-1], groups[-1] + added)
    return (*groups, added)


def segment_name(base_offset: int) -> str:
    """File name of the segment that starts at ``base_offset``: zero-padded, sorts by offset."""
    if base_offset < 0:
        raise ValueError(f"segment base offset {base_offset} is negative")
    return f"{base_offset:0{OFFSET_DIGITS}d}.parquet"


@dataclass(frozen=True)
class Segment:
    bucket: int
    base: int
    path: str


# --- the log's metadata and listings ---------------------------------------------------------


def read_meta(fs: pafs.FileSystem, base: str) -> dict | None:
    """The log's metadata under ``base``, or None where there is none."""
    path = f"{base}/{META_FILE}"
    try:
        with fs.open_input_stream(path) as src:
            meta = json.loads(src.read())
    except FileNotFoundError:
        return None
    if meta.get("format") != LOG_FORMAT:
        raise ModeswitchError(f"{path} is not a modeswitch segment log: {meta!r}")
    return meta


def write_meta(fs: pafs.FileSystem, base: str, meta: dict[str, Any]) -> None:
    """Write the log's metadata aside, then move it into place."""
    tmp = f"{base}/.{META_FILE}.{uuid.uuid4().hex}"
    with fs.open_output_stream(tmp) as out:
        out.write(json.dumps(meta).encode())
    fs.move(tmp, f"{base}/{META_FILE}")


def list_segment_names(fs: pafs.FileSystem, folder: str, *, local: bool) -> list[str]:
    """Segment file names in a bucket's ``folder``, ascending. Zero-padded names sort as their
    offsets do, so this is one listing and one sort of strings: no parsing per file."""
    if local:
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            names = []
    else:
        selector = pafs.FileSelector(folder, allow_not_found=True)
        names = [info.base_name for info in fs.get_file_info(selector)]
    names = [
        n
        for n in names
        if len(n) == SEGMENT_NAME_LENGTH and n[0].isdigit() and n.endswith(".parquet")
    ]
    names.sort()
    return names


def file_identity(path: str, *, local: bool) -> tuple[int, int, int] | None:
    """``(inode, size, mtime_ns)`` of a local file (None elsewhere): what tells a rewritten
    open segment from the version a row count came from."""
    if not local:
        return None
    info = os.stat(path)
    return info.st_ino, info.st_size, info.st_mtime_ns


# --- reading ---------------------------------------------------------------------------------


def first_offset_at(
    fs: pafs.FileSystem, segment: Segment, at: datetime, earliest: int
) -> int | None:
    """The first offset of ``segment`` at or above ``earliest`` whose event time is at or
    after ``at``, or None; row groups whose footer statistics put every event time before
    ``at`` are skipped unread."""
    parquet = pq.ParquetFile(segment.path, filesystem=fs)
    meta = parquet.metadata
    column = meta.schema.names.index("event_time")
    group_start = segment.base
    for group in range(meta.num_row_groups):
        rows = meta.row_group(group).num_rows
        stats = meta.row_group(group).column(column).statistics
        skip = stats is not None and stats.has_min_max and stats.max < at
        if not skip and group_start + rows > earliest:
            table = parquet.read_row_group(group, columns=["offset", "event_time"])
            hits = pc.greater_equal(table.column("event_time"), pa.scalar(at))
            hits = pc.and_(hits, pc.greater_equal(table.column("offset"), earliest))
            found = pc.index(hits, True).as_py()
            if found >= 0:
                return int(table.column("offset")[found].as_py())
        group_start += rows
    return None


def read_segment(
    fs: pafs.FileSystem,
    segment: Segment,
    seg_end: int,
    lo: int,
    hi: int,
    batch_rows: int,
    *,
    newest: bool,
    root: str,
) -> Iterator[pa.RecordBatch]:
    """Records ``[lo, hi)`` of one segment, which ends where the next one starts
    (``seg_end``), read by row group; the newest may have grown past it."""
    # One open for footer and rows: an open segment replaced meanwhile is read whole from
    # the version opened (it only ever grows at its end).
    parquet = pq.ParquetFile(segment.path, filesystem=fs)
    meta = parquet.metadata
    rows = meta.num_rows
    if segment.base + rows != seg_end and not (newest and segment.base + rows > seg_end):
        raise ModeswitchError(
            f"log {root!r}: bucket {segment.bucket}: segment {segment.path} holds "
            f"{meta.num_rows} records but the next segment starts at {seg_end}: "
            "offsets are not contiguous"
        )
    group_start = segment.base
    for group in range(meta.num_row_groups):
        group_rows = meta.row_group(group).num_rows
        group_end = group_start + group_rows
        if group_end > lo and group_start < hi:
            table = parquet.read_row_group(group)
            table = table.slice(max(lo, group_start) - group_start)
            table = table.slice(0, min(hi, group_end) - max(lo, group_start))
            for batch in table.to_batches(max_chunksize=batch_rows):
                yield conform(batch)
        group_start = group_end
        if group_start >= hi:
            break


def read_whole_segments(
    fs: pafs.FileSystem, run: list[tuple[Segment, int]], batch_rows: int, *, root: str
) -> Iterator[pa.RecordBatch]:
    """The records of a run of whole segments, streamed: pyarrow's scanner reads the files
    on its threads and yields their batches in the order of the files given (offset
    order), each checked to continue the one before; nothing is sorted."""
    import pyarrow.dataset as ds

    dataset = ds.dataset([segment.path for segment, _ in run], format="parquet", filesystem=fs)
    first, last = run[0][0].base, run[-1][1]
    expected = first
    for batch in dataset.to_batches(batch_size=batch_rows, use_threads=True):
        if not batch.num_rows:
            continue
        offsets = batch.column("offset")
        ends = expected + batch.num_rows
        if offsets[0].as_py() != expected or offsets[-1].as_py() != ends - 1 or ends > last:
            break
        expected = ends
        yield conform(batch)
    else:
        if expected == last:
            return
    raise ModeswitchError(
        f"log {root!r}: bucket {run[0][0].bucket}: segments from offset {first} to "
        f"{last} do not hold contiguous offsets (they break after offset {expected - 1})"
    )


def link_snapshot(segment: Segment, needed_end: int, folder: str) -> str | None:
    """Hard-link ``segment`` into ``folder`` and return the link's name, or None where no
    link can be made (another filesystem: EXDEV). An appender never changes a segment file
    in place (it writes a new file and renames it over the old one), so the link is a
    snapshot holding at least what was planned; the reader filters the offsets it needs.
    One snapshot per segment and folder: another range of the same segment (a second
    split of the bucket) reuses it, so no row is read twice, unless it misses that range."""
    name = f"{segment.bucket}-{segment.base}.parquet"
    try:
        os.link(segment.path, f"{folder}/{name}")
    except FileExistsError as exc:
        held = pq.ParquetFile(f"{folder}/{name}").metadata.num_rows
        if segment.base + held < needed_end:
            raise ModeswitchError(
                f"{folder}/{name}: the snapshot holds offsets up to {segment.base + held} "
                f"of bucket {segment.bucket}, not {needed_end}: take the snapshots of one "
                "scratch folder after every range in it was planned"
            ) from exc
    except OSError:
        return None
    return name


def conform(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` in :data:`~modeswitch.sources.base.RECORD_SCHEMA` (cast where it differs)."""
    if batch.schema.equals(RECORD_SCHEMA):
        return batch
    return batch.cast(RECORD_SCHEMA)


# --- writing ---------------------------------------------------------------------------------


def publish_segment(
    fs: pafs.FileSystem, folder: str, start: int, table: pa.Table, *, local: bool, what: str
) -> str:
    """Write ``table`` as the segment at offset ``start`` of the bucket's ``folder``: aside,
    then linked (local) or moved into place; returns its path. A segment already there is a
    :class:`SegmentConflictError` (``what`` names the log and bucket)."""
    final = f"{folder}/{segment_name(start)}"
    tmp = f"{folder}/.{uuid.uuid4().hex}.parquet.tmp"
    pq.write_table(table, tmp, filesystem=fs, **SEGMENT_WRITE_OPTIONS)
    try:
        if local:
            # link() never replaces an existing file, unlike rename().
            try:
                os.link(tmp, final)
            except FileExistsError as exc:
                raise SegmentConflictError(
                    f"{what}: a segment at offset {start} "
                    "already exists; another appender wrote this bucket concurrently"
                ) from exc
        else:
            if fs.get_file_info(final).type != pafs.FileType.NotFound:
                raise SegmentConflictError(
                    f"{what}: a segment at offset {start} "
                    "already exists; another appender wrote this bucket concurrently"
                )
            fs.move(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(tmp)
    return final


def rewrite_segment(folder: str, path: str, table: pa.Table, groups: Sequence[int]) -> None:
    """Replace the local segment at ``path`` with ``table``, atomically (rename over it), in
    row groups of ``groups`` records each, in order."""
    tmp = f"{folder}/.{uuid.uuid4().hex}.parquet.tmp"
    try:
        with pq.ParquetWriter(tmp, table.schema, **SEGMENT_WRITE_OPTIONS) as writer:
            at = 0
            for rows in groups:
                writer.write_table(table.slice(at, rows), row_group_size=rows)
                at += rows
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


@contextlib.contextmanager
def bucket_lock(folder: str, *, local: bool) -> Iterator[None]:
    """An exclusive lock on the bucket's ``folder`` (``.lock``) while the block runs; none
    where the filesystem is not local."""
    if not local:
        yield
        return
    with open(f"{folder}/.lock", "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
