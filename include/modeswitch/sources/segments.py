"""The embedded bucketed log: append-only Parquet segments in a folder, the default source.

Its files (the layout, reading and writing one segment, the bucket's lock) are
:mod:`modeswitch.sources.segment_files`; this is the log built on them: :class:`SegmentLog`,
which finds the segments of a range, reads them, appends, keeps a bucket's newest segment
open, and drops old segments (retention).

On a local filesystem the newest segment of a bucket stays *open* for a short while (one
second, up to 65 536 records, by default): an appender that published it extends it by
writing the old rows plus the new ones aside and renaming the result over it, under the
bucket's lock. A segment only ever grows by appending to its end, so a reader that saw it
smaller reads the same records it expected. Without this, a live producer flushing every
50 ms leaves one tiny file per bucket per flush, and every reader pays for each file (about
0.5 ms apiece, and a listing that grows without end). Only the newest segment can grow:
once another segment follows it, a segment never changes again.

Appenders on *different* buckets run in parallel. Appenders on the *same* bucket are
serialized by an exclusive lock on ``<root>/<bucket>/.lock`` (local and POSIX filesystems),
and a publish that would land on an existing segment is refused: offsets never get a gap or
a duplicate. On object stores there is no lock: run one appender per bucket there (the
publish still refuses an existing segment name, but check-then-move is not atomic).

``latest_offsets()`` lists each bucket's folder and reads the footer of its newest segment
only; its cost does not depend on the number of records.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from modeswitch.errors import ModeswitchError, OffsetOutOfRangeError, UnknownBucketError
from modeswitch.offsets import OffsetsMap
from modeswitch.sources.base import RECORD_SCHEMA, check_range
from modeswitch.sources.segment_files import (
    LOG_FORMAT,
    LOG_FORMAT_VERSION,
    META_FILE,
    OFFSET_DIGITS,
    SEGMENT_WRITE_OPTIONS,
    Segment,
    bucket_lock,
    file_identity,
    first_offset_at,
    grown_groups,
    link_snapshot,
    list_segment_names,
    publish_segment,
    read_meta,
    read_segment,
    read_whole_segments,
    rewrite_segment,
    segment_name,
    write_meta,
)
from modeswitch.storage import filesystem

log = logging.getLogger(__name__)

DEFAULT_BATCH_ROWS = 65_536
SMALL_SEGMENT_RUN = 8  # read this many small whole segments or more in one scan
SMALL_SEGMENT_SCAN = 512  # at most this many files per scan
SMALL_SEGMENT_SCAN_RECORDS = DEFAULT_BATCH_ROWS
"""At most this many records per scan of small segments: what bounds a reader's memory there.
pyarrow's scanner reads a scan's files ahead on its threads as fast as it can, whatever the
reader takes (the whole scan, when the parse and write behind it are slower), so a scan may be
held whole. With scans of up to 262 144 records, held and sorted, the 100 M backlog's tail
buckets (segments of 20 000-40 000 records) took 132 MB of Arrow memory in a worker's task
against 72-74 MB now; one such bucket read alone, 114 MB against 9 MB (docs/BENCHMARKS.md, "A
backlog of 100 M records"). Segments that
small are read one at a time at little cost; the scans are for a live producer's many tiny
ones (~1 ms a file one at a time)."""
OPEN_SEGMENT_SECONDS = 1.0
OPEN_SEGMENT_RECORDS = 65_536


@dataclass(frozen=True)
class _OpenSegment:
    """The newest segment of a bucket as this appender last wrote it, still open for appends."""

    path: str
    base: int
    opened_at: float  # time.monotonic() of its first publish
    table: pa.Table
    identity: tuple[int, int, int]  # (inode, size, mtime_ns) right after the last write
    groups: tuple[int, ...]  # its row groups' record counts, in order


class SegmentLog:
    """A bucketed log stored as Parquet segments under ``root``.

    Instances hold only the root and a cache of segment row counts; they are cheap to
    create, so Spark tasks open their own from the root string.

    ``open_segment_seconds`` / ``open_segment_records``: how long, and up to how many records,
    this appender keeps extending the newest segment it published (local filesystems only; 0
    publishes every append as its own segment).
    """

    contiguous = True  # segments of a bucket are contiguous: no offset without a record
    parquet_files = True  # segments are Parquet files: Spark's reader reads them natively
    spark_source = "bucketlog"  # the Python data source (modeswitch.sources.spark)
    client_config = False  # files, reached with the storage options
    event_time_indexed = True  # offset_at searches the records' event times
    compacting = False  # records leave only with whole segments, by retention (below earliest)

    def __init__(
        self,
        root: str,
        *,
        open_segment_seconds: float = OPEN_SEGMENT_SECONDS,
        open_segment_records: int = OPEN_SEGMENT_RECORDS,
    ) -> None:
        self.root = str(root)
        self._fs, self._base = filesystem(self.root)
        self._local = isinstance(self._fs, pafs.LocalFileSystem)
        # Row counts by path and, on a local filesystem, file identity: the newest segment
        # may grow (see the module docstring), so a count is only good for the file it came from.
        self._rows: dict[tuple[str, tuple[int, int, int] | None], int] = {}
        self._open: dict[int, _OpenSegment] = {}
        self._open_seconds = open_segment_seconds if self._local else 0.0
        self._open_records = open_segment_records
        meta = self._read_meta()
        if meta is None:
            raise ModeswitchError(
                f"no bucketed log at {self.root!r} ({META_FILE} is missing); "
                "create one with `modeswitch produce --log PATH --buckets N`"
            )
        self._bucket_count = int(meta["buckets"])

    def __str__(self) -> str:
        return self.root

    # -- creation -------------------------------------------------------------------------
    @classmethod
    def create(cls, root: str, *, buckets: int, **options: Any) -> SegmentLog:
        """Create a log with ``buckets`` buckets, or open an existing one with the same count.
        ``options`` are the constructor's keyword arguments."""
        if buckets < 1:
            raise ValueError(f"buckets must be at least 1, got {buckets}")
        fs, base = filesystem(str(root))
        meta_path = f"{base}/{META_FILE}"
        info = fs.get_file_info(meta_path)
        if info.type == pafs.FileType.File:
            existing = cls(root, **options)
            if existing._bucket_count != buckets:
                raise ModeswitchError(
                    f"log {root!r} already has {existing._bucket_count} buckets, not {buckets}"
                )
            return existing
        fs.create_dir(base, recursive=True)
        for bucket in range(buckets):
            fs.create_dir(f"{base}/{bucket}", recursive=True)
        write_meta(
            fs, base, {"format": LOG_FORMAT, "version": LOG_FORMAT_VERSION, "buckets": buckets}
        )
        log.info("created bucketed log at %s with %d buckets", root, buckets)
        return cls(root, **options)

    def add_buckets(self, count: int) -> list[int]:
        """Add ``count`` empty buckets after the existing ones (as a partition is added to a
        Kafka topic); returns the new bucket ids. Readers see them at their next
        :meth:`buckets` call."""
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        first = self._refresh_bucket_count()
        for bucket in range(first, first + count):
            self._fs.create_dir(f"{self._base}/{bucket}", recursive=True)
        write_meta(self._fs, self._base, {**(self._read_meta() or {}), "buckets": first + count})
        self._bucket_count = first + count
        return list(range(first, first + count))

    def _refresh_bucket_count(self) -> int:
        meta = self._read_meta()
        if meta is not None:
            self._bucket_count = int(meta["buckets"])
        return self._bucket_count

    def _read_meta(self) -> dict | None:
        return read_meta(self._fs, self._base)

    # -- reading --------------------------------------------------------------------------
    def buckets(self) -> list[int]:
        """Bucket ids, read from the log's metadata each time: buckets can be added."""
        return list(range(self._refresh_bucket_count()))

    def _check_bucket(self, bucket: int) -> None:
        if bucket >= self._bucket_count:
            self._refresh_bucket_count()
        if not 0 <= bucket < self._bucket_count:
            raise UnknownBucketError(
                f"log {self.root!r}: bucket {bucket} does not exist "
                f"(buckets are 0..{self._bucket_count - 1})"
            )

    def _segment_names(self, bucket: int) -> list[str]:
        """Segment file names of ``bucket``, ascending (:func:`list_segment_names`)."""
        self._check_bucket(bucket)
        return list_segment_names(self._fs, f"{self._base}/{bucket}", local=self._local)

    def _segment(self, bucket: int, name: str) -> Segment:
        return Segment(bucket, int(name[:OFFSET_DIGITS]), f"{self._base}/{bucket}/{name}")

    def segments(self, bucket: int) -> list[Segment]:
        """Published segments of ``bucket``, ascending by base offset."""
        return [self._segment(bucket, name) for name in self._segment_names(bucket)]

    def _identity(self, path: str) -> tuple[int, int, int] | None:
        return file_identity(path, local=self._local)

    def _segment_rows(self, segment: Segment) -> int:
        key = (segment.path, self._identity(segment.path))
        rows = self._rows.get(key)
        if rows is None:
            rows = pq.ParquetFile(segment.path, filesystem=self._fs).metadata.num_rows
            if len(self._rows) > 65_536:
                self._rows.clear()
            self._rows[key] = rows
        return rows

    def _bounds(self, bucket: int) -> tuple[int, int, list[str]]:
        """``(earliest, latest, names)``: opens only the newest segment's footer."""
        names = self._segment_names(bucket)
        if not names:
            return 0, 0, names
        newest = self._segment(bucket, names[-1])
        try:
            end = newest.base + self._segment_rows(newest)
        except FileNotFoundError:
            # Retention removed it between listing and reading: list again.
            return self._bounds(bucket)
        return int(names[0][:OFFSET_DIGITS]), end, names

    def earliest_offsets(self) -> OffsetsMap:
        return {b: self._bounds(b)[0] for b in self.buckets()}

    def latest_offsets(self) -> OffsetsMap:
        return {b: self._bounds(b)[1] for b in self.buckets()}

    def offset_at(self, event_time: datetime) -> OffsetsMap:
        """Per bucket, the first retained offset whose event time is at or after
        ``event_time`` (the latest offset if none is). Records may be late (event time is
        not ordered by offset), so each bucket is searched from its earliest offset; the
        row groups whose footer statistics put every event time before ``event_time`` are
        skipped unread."""
        at = pa.scalar(event_time, type=pa.timestamp("us", tz="UTC")).as_py()
        return {bucket: self._offset_at(bucket, at) for bucket in self.buckets()}

    def _offset_at(self, bucket: int, at: datetime) -> int:
        earliest, latest, _ = self._bounds(bucket)
        for segment, _ in self.covering(bucket, earliest, latest):
            found = first_offset_at(self._fs, segment, at, earliest)
            if found is not None:
                return found
        return latest

    def covering(self, bucket: int, start: int, end: int) -> list[tuple[Segment, int]]:
        """The segments that hold ``[start, end)`` of ``bucket``, each with the offset where the
        next one starts (the latest offset for the newest); a range outside the log is
        refused (:class:`OffsetOutOfRangeError`)."""
        return self._covering(bucket, start, end)[0]

    def _covering(
        self, bucket: int, start: int, end: int
    ) -> tuple[list[tuple[Segment, int]], int | None]:
        """:meth:`covering`, and the base offset of the bucket's newest segment."""
        earliest, latest, names = self._bounds(bucket)
        check_range(
            bucket,
            start,
            end,
            earliest={bucket: earliest},
            latest={bucket: latest},
            what=f"log {self.root!r}",
        )
        newest = int(names[-1][:OFFSET_DIGITS]) if names else None
        covered: list[tuple[Segment, int]] = []
        if start == end:
            return covered, newest
        # The segment holding ``start`` is the last one whose name sorts at or before it.
        first = max(0, bisect.bisect_right(names, segment_name(start)) - 1)
        for i in range(first, len(names)):
            segment = self._segment(bucket, names[i])
            seg_end = int(names[i + 1][:OFFSET_DIGITS]) if i + 1 < len(names) else latest
            if seg_end <= start:
                continue
            if segment.base >= end:
                break
            covered.append((segment, seg_end))
        return covered, newest

    def held_offsets(self, bucket: int, start: int, end: int) -> np.ndarray:
        """Every offset of ``[start, end)`` (the log has no gaps), after the range checks."""
        self._covering(bucket, start, end)
        return np.arange(start, end, dtype=np.int64)

    def read_ranges(self, ranges: Sequence[tuple[int, int, int]]) -> Iterator[pa.RecordBatch]:
        """Each range read in turn (:meth:`read`): files cost nothing to open between them."""
        for bucket, start, end in ranges:
            yield from self.read(bucket, start, end)

    def read(
        self, bucket: int, start: int, end: int, *, batch_rows: int = DEFAULT_BATCH_ROWS
    ) -> Iterator[pa.RecordBatch]:
        """Records ``[start, end)`` of ``bucket`` in offset order, in batches of RECORD_SCHEMA."""
        covered, newest = self._covering(bucket, start, end)
        try:
            index = 0
            while index < len(covered):
                # Runs of whole small segments (a live producer publishes one per flush) are
                # scanned together by pyarrow's multi-threaded reader: one file at a time
                # costs ~1 ms each, which a catch-up over thousands of them cannot afford.
                run = self._whole_segments(covered, index, start, end, batch_rows)
                if len(run) >= SMALL_SEGMENT_RUN:
                    yield from read_whole_segments(self._fs, run, batch_rows, root=self.root)
                    index += len(run)
                    continue
                segment, seg_end = covered[index]
                yield from read_segment(
                    self._fs,
                    segment,
                    seg_end,
                    max(start, segment.base),
                    min(end, seg_end),
                    batch_rows,
                    newest=segment.base == newest,
                    root=self.root,
                )
                index += 1
        except FileNotFoundError as exc:
            raise OffsetOutOfRangeError(
                f"log {self.root!r}: bucket {bucket}: a segment was dropped by retention while "
                f"reading [{start}, {end})"
            ) from exc

    def stable_paths(self, bucket: int, start: int, end: int, *, scratch: str) -> list[str]:
        """The files that hold records ``[start, end)`` of ``bucket``, none of which an
        appender will rewrite: the segments themselves, except the bucket's newest, which may
        still grow; the part of it in the range is copied into a new file under ``scratch`` (a
        path or URI) instead: on a local filesystem a hard link to it (an appender replaces the
        file, never changes it), elsewhere a copy of the range. For readers that cannot follow
        a growing file (Spark's Parquet reader reads none of its rows). A range outside the log
        is refused.

        Calls with the same ``scratch`` share one snapshot of a segment, so the ranges of one
        read must all exist (be planned) before the first call; the reader filters each file
        to the read's ranges."""
        covered, newest = self._covering(bucket, start, end)
        paths = []
        for segment, seg_end in covered:
            if segment.base != newest:
                paths.append(segment.path)
                continue
            fs, folder = filesystem(scratch)
            fs.create_dir(folder, recursive=True)
            if self._local and isinstance(fs, pafs.LocalFileSystem):
                linked = link_snapshot(segment, min(end, seg_end), folder)
                if linked:
                    paths.append(f"{scratch}/{linked}")
                    continue
            lo, hi = max(start, segment.base), min(end, seg_end)
            name = f"{bucket}-{lo}-{hi}.parquet"
            table = pa.Table.from_batches(list(self.read(bucket, lo, hi)), schema=RECORD_SCHEMA)
            pq.write_table(table, f"{folder}/{name}", filesystem=fs, **SEGMENT_WRITE_OPTIONS)
            paths.append(f"{scratch}/{name}")
        return paths

    def _whole_segments(
        self, covered: list, index: int, start: int, end: int, batch_rows: int
    ) -> list[tuple[Segment, int]]:
        """The run of segments from ``index`` that lie wholly in ``[start, end)`` and are
        small (under ``batch_rows`` records each), at most ``SMALL_SEGMENT_SCAN`` of them
        holding at most ``SMALL_SEGMENT_SCAN_RECORDS`` together. Never the last one covered:
        it may be the open segment, which is read on its own."""
        run: list[tuple[Segment, int]] = []
        records = 0
        for segment, seg_end in covered[index : min(len(covered) - 1, index + SMALL_SEGMENT_SCAN)]:
            whole = segment.base >= start and seg_end <= end
            size = seg_end - segment.base
            if not whole or size >= batch_rows or records + size > SMALL_SEGMENT_SCAN_RECORDS:
                break
            run.append((segment, seg_end))
            records += size
        return run

    # -- writing --------------------------------------------------------------------------
    def append(
        self, bucket: int, records: pa.Table | pa.RecordBatch, *, close: bool = False
    ) -> tuple[int, int]:
        """Append ``records`` (columns event_time, key, value) to ``bucket``: to the segment
        this appender still has open (see the module docstring), else as a new segment.
        ``close``: as a segment of their own, closed at once (a backlog of full segments).

        Offsets are assigned here, contiguously after the bucket's latest offset. Returns the
        ``[start, end)`` range written. Appenders on the same bucket are serialized.
        """
        self._check_bucket(bucket)
        if isinstance(records, pa.RecordBatch):
            records = pa.Table.from_batches([records])
        count = records.num_rows
        if count == 0:
            latest = self._bounds(bucket)[1]
            return latest, latest
        with bucket_lock(f"{self._base}/{bucket}", local=self._local):
            _, start, names = self._bounds(bucket)
            table = pa.table(
                {
                    "bucket": pa.array([bucket] * count, pa.int32()),
                    "offset": pa.array(range(start, start + count), pa.int64()),
                    "event_time": records.column("event_time").cast(pa.timestamp("us", "UTC")),
                    "key": records.column("key").cast(pa.string()),
                    "value": records.column("value").cast(pa.string()),
                },
                schema=RECORD_SCHEMA,
            )
            opened = None if close else self._open.get(bucket)
            if opened is not None and self._extends(opened, names, start, count):
                self._extend(bucket, opened, table)
            else:
                self._publish(bucket, start, table, close=close)
        return start, start + count

    def _extends(self, opened: _OpenSegment, names: list[str], start: int, count: int) -> bool:
        """Whether this append goes into ``opened``: still the newest segment, unchanged since
        this appender wrote it, young enough and small enough."""
        if not names or int(names[-1][:OFFSET_DIGITS]) != opened.base:
            return False
        if opened.base + opened.table.num_rows != start:
            return False
        if time.monotonic() - opened.opened_at >= self._open_seconds:
            return False
        if opened.table.num_rows + count > self._open_records:
            return False
        try:
            return self._identity(opened.path) == opened.identity
        except FileNotFoundError:
            return False

    def _extend(self, bucket: int, opened: _OpenSegment, table: pa.Table) -> None:
        """Rewrite the open segment with ``table`` appended, atomically (rename over it)."""
        whole = pa.concat_tables([opened.table, table])
        groups = grown_groups(opened.groups, table.num_rows)
        rewrite_segment(f"{self._base}/{bucket}", opened.path, whole, groups)
        self._remember_open(bucket, opened.path, opened.base, opened.opened_at, whole, groups)

    def _remember_open(
        self,
        bucket: int,
        path: str,
        base: int,
        opened_at: float,
        table: pa.Table,
        groups: tuple[int, ...],
    ) -> None:
        if self._open_seconds <= 0 or table.num_rows >= self._open_records:
            self._open.pop(bucket, None)
            return
        identity = self._identity(path)
        assert identity is not None
        self._open[bucket] = _OpenSegment(path, base, opened_at, table, identity, groups)
        self._rows[(path, identity)] = table.num_rows

    def _publish(self, bucket: int, start: int, table: pa.Table, *, close: bool = False) -> None:
        folder = f"{self._base}/{bucket}"
        what = f"log {self.root!r}: bucket {bucket}"
        final = publish_segment(self._fs, folder, start, table, local=self._local, what=what)
        if self._local and not close:
            self._remember_open(bucket, final, start, time.monotonic(), table, (table.num_rows,))
        else:
            self._open.pop(bucket, None)
            self._rows[(final, self._identity(final))] = table.num_rows

    # -- retention ------------------------------------------------------------------------
    def drop_before(self, offsets: Mapping[int, int]) -> int:
        """Drop, per bucket, the segments that lie entirely below the given offset.

        The newest segment of a bucket is always kept: it carries the latest offset. Returns
        the number of segments deleted. Reading below the new earliest offset is an error.
        """
        dropped = 0
        for bucket, offset in offsets.items():
            with bucket_lock(f"{self._base}/{bucket}", local=self._local):
                segments = self.segments(bucket)
                for i, segment in enumerate(segments[:-1]):
                    if segments[i + 1].base <= offset:
                        self._fs.delete_file(segment.path)
                        dropped += 1
        return dropped
