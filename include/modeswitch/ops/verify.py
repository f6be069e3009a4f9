"""The exactly-once audit: is every committed source record in the sink or quarantine, once?

For one pipeline, :func:`audit` compares the sink table plus the quarantine table with the
source log up to the committed offsets (DESIGN.md, invariant 1). Per bucket, the *expected
range* is ``[start, committed)``:

- ``start``: the ``start`` offset of the bucket in the pipeline's oldest sink commit that
  covers the bucket (where the pipeline began reading it), or a rewind's offset if one went
  lower;
- ``committed``: the bucket's end in the pipeline's newest sink commit
  (:func:`~modeswitch.sinks.commits.committed_offsets`), a rewind's included.

A rewind commit deleted the rows at or above its offsets, so after it (and after the records
are reprocessed) every offset of the range is again present exactly once. The audit also
checks invariant 3 over the commits: committed offsets never decrease except by a rewind
(:func:`~modeswitch.sinks.commits.offset_regressions`), reported as problems.

On a compacted Kafka topic the cleaner removes records after the pipeline has read them: the
sink's and the quarantine's rows in the range count as held beside what the topic holds now
(:func:`_held_offsets`).

A bucket that no commit covers has an empty range. Every row of either table, identified by
``(bucket, offset)``, then falls in one of these:

- **out of range**: its offset is outside its bucket's range (every copy counts);
- in range, first copy: one of the expected records;
- **duplicated**: in range, an extra copy of an offset already seen, in either table.

and **missing** counts the offsets of the range found in neither table. So, per bucket,
``sink + quarantine == expected - missing + duplicated + out_of_range``. The source log
takes part by its offsets: a committed offset beyond the log's latest offset (records the
source never had) is reported as a problem; with ``spot_check=N`` up to N quarantined
records are also compared, key and value, with the source records at their offsets.

Only ``deltalake`` and pyarrow/numpy are used, no Spark; two integer columns are read from
each table and the counting is a sort and a diff (about 2 M rows in well under a second).

The ranges come from the sink's Delta history, read in full (one JSON file per commit): once
Delta log cleanup has removed the oldest commits, ``start`` is that of the oldest commit left,
and the records committed before it count as out of range.

**Backfills** (:mod:`modeswitch.modes.backfill`): a ``fill`` run loads a window's records below
the live range's start. Those offsets, read back from the log (each backfill commit's window
within its ranges), are expected too: committed = the live range and the filled windows. A
``reprocess`` run replaces records inside the live range, which are already expected.

The sink table is read at one snapshot, and only commits up to that snapshot count. The
quarantine table has its own log, committed just after the sink commit it belongs to: audit
a pipeline at rest, since records of a sink commit whose quarantine commit has not landed
yet show up as missing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from modeswitch.errors import ModeswitchError, OffsetOutOfRangeError
from modeswitch.modes.backfill_commits import (
    backfill_commits,
    backfilled_positions,
    summarised_backfills,
)
from modeswitch.offsets import OffsetsMap
from modeswitch.sinks.commits import offset_regressions, sink_commits
from modeswitch.sinks.erasures import Erasure, erased_positions
from modeswitch.sinks.history import (
    LogSummary,
    erasures_since,
    expected_ranges,
    join_summaries,
    unsummarised_cleanup,
)
from modeswitch.sources import open_log
from modeswitch.sources.base import BucketedLog

log = logging.getLogger(__name__)

SAMPLE = 5
"""How many offsets (or ranges) of each kind of discrepancy a bucket's row keeps as examples."""

POSITION_COLUMNS = ["bucket", "offset"]


@dataclass(frozen=True)
class BucketAudit:
    """One bucket's counts. ``start`` / ``committed`` are None when nothing is committed."""

    bucket: int
    start: int | None
    committed: int | None
    expected: int
    in_sink: int
    in_quarantine: int
    missing: int
    duplicated: int
    out_of_range: int
    missing_ranges: tuple[tuple[int, int], ...] = ()
    """Up to :data:`SAMPLE` of the first missing ``[lo, hi)`` ranges."""
    duplicated_offsets: tuple[int, ...] = ()
    """Up to :data:`SAMPLE` of the lowest offsets that are present more than once."""
    out_of_range_offsets: tuple[int, ...] = ()
    """Up to :data:`SAMPLE` of the lowest out-of-range offsets."""
    erased: int = 0
    """Offsets of the range in neither table because another writer's commit removed them (an
    erasure, :mod:`modeswitch.sinks.erasures`): expected, absent, and not counted as missing."""

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.duplicated == 0 and self.out_of_range == 0


@dataclass(frozen=True)
class AuditTotals:
    """Sums over every bucket."""

    expected: int
    in_sink: int
    in_quarantine: int
    missing: int
    duplicated: int
    out_of_range: int
    erased: int = 0


@dataclass(frozen=True)
class QuarantineMismatch:
    """A quarantined record whose key or value is not the source's at its offset."""

    bucket: int
    offset: int
    column: str
    quarantined: str | None
    source: str | None


@dataclass(frozen=True)
class SpotCheck:
    """The result of comparing quarantined records with the source records at their offsets."""

    checked: int
    skipped: int
    """Sampled records no longer in the source (dropped by retention): not compared."""
    mismatches: tuple[QuarantineMismatch, ...] = ()


@dataclass(frozen=True)
class AuditReport:
    """What :func:`audit` found: per-bucket rows (ascending), totals, problems, a verdict."""

    pipeline: str
    sink_uri: str
    quarantine_uri: str
    sink_version: int | None
    """The sink snapshot audited; None if the table does not exist."""
    quarantine_version: int | None
    buckets: tuple[BucketAudit, ...]
    problems: tuple[str, ...] = ()
    """Findings that are not per-record counts (committed offsets beyond the source)."""
    spot_check: SpotCheck | None = None
    seconds: float = 0.0
    sink_commits: int = field(default=0)
    """How many of the pipeline's sink commits the expected ranges come from."""
    backfill_commits: int = 0
    """How many backfill commits (:mod:`modeswitch.modes.backfill`) added filled windows."""
    erasures: tuple[Erasure, ...] = ()
    """Other writers' commits that removed rows of either table (a user's ``DELETE``)."""

    @property
    def totals(self) -> AuditTotals:
        return AuditTotals(
            expected=sum(b.expected for b in self.buckets),
            in_sink=sum(b.in_sink for b in self.buckets),
            in_quarantine=sum(b.in_quarantine for b in self.buckets),
            missing=sum(b.missing for b in self.buckets),
            duplicated=sum(b.duplicated for b in self.buckets),
            out_of_range=sum(b.out_of_range for b in self.buckets),
            erased=sum(b.erased for b in self.buckets),
        )

    @property
    def ok(self) -> bool:
        """True when every bucket is exact, nothing else is wrong, and the spot check (if
        any) found no mismatch."""
        spot_ok = self.spot_check is None or not self.spot_check.mismatches
        return all(b.ok for b in self.buckets) and not self.problems and spot_ok


def audit(
    source_root: str,
    sink_uri: str,
    quarantine_uri: str,
    pipeline: str,
    *,
    spot_check: int = 0,
    storage_options: Mapping[str, str] | None = None,
    summaries: Sequence[LogSummary] = (),
) -> AuditReport:
    """Audit ``pipeline``'s sink and quarantine tables against the log at ``source_root``.

    A table that does not exist counts as empty. ``spot_check`` > 0 compares up to that many
    quarantined records (spread evenly over them) with the source. Raises
    :class:`ModeswitchError` if a table lacks the ``bucket`` / ``offset`` columns.

    ``summaries``: what maintenance runs kept of the sink's log before cleaning it
    (:meth:`StateStore.log_summaries`); they stand for the commits up to their newest
    version, so the audit does not depend on commit files log cleanup removed. Commit files
    missing with no summary for them are reported as a problem.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    began = time.monotonic()
    options = dict(storage_options or {})
    source = open_log(source_root)
    try:
        sink = DeltaTable(sink_uri, storage_options=options)
    except TableNotFoundError:
        sink = None
    sink_version = sink.version() if sink is not None else None
    before, history_problems = join_summaries(summaries)
    through = before.through if before is not None else -1
    commits = [
        c
        for c in sink_commits(sink_uri, pipeline, storage_options=options)
        if sink_version is not None
        and (c.table_version is None or through < c.table_version <= sink_version)
    ]
    if sink is not None:
        history_problems += unsummarised_cleanup(sink_uri, through)
    starts, committed = expected_ranges(commits, before=before)

    sink_positions = _positions(sink, "sink", sink_uri)
    try:
        quarantine = DeltaTable(quarantine_uri, storage_options=options)
    except TableNotFoundError:
        quarantine = None
    quarantine_version = quarantine.version() if quarantine is not None else None
    columns = POSITION_COLUMNS + (["key", "value"] if spot_check > 0 else [])
    quarantine_rows = _read(quarantine, "quarantine", quarantine_uri, columns)
    quarantine_positions = _position_arrays(quarantine_rows)

    held = (
        None
        if source.contiguous
        else _held_offsets(source, starts, committed, sink_positions, quarantine_positions)
    )
    fills = [
        c
        for c in backfill_commits(sink_uri, pipeline, storage_options=options)
        if sink_version is not None
        and (c.table_version is None or through < c.table_version <= sink_version)
    ]
    if before is not None:
        fills = summarised_backfills(before) + fills
    if fills:
        starts, committed, held = _with_backfills(
            backfilled_positions(source, fills, below=starts), starts, committed, held
        )
    erasures, erasure_problems = erasures_since(
        before, sink=(sink_uri, sink_version), quarantine=(quarantine_uri, quarantine_version)
    )
    buckets = count_positions(
        sink_positions,
        quarantine_positions,
        starts=starts,
        committed=committed,
        known_buckets=source.buckets(),
        held=held,
        erased=erased_positions(erasures),
    )
    baseline = [] if before is None or not before.end else [before.as_commit()]
    problems = (
        history_problems
        + erasure_problems
        + _source_problems(source, source_root, committed)
        + offset_regressions(commits + baseline)
    )
    checked = _spot_check(source, quarantine_rows, spot_check) if spot_check > 0 else None
    report = AuditReport(
        pipeline=pipeline,
        sink_uri=sink_uri,
        quarantine_uri=quarantine_uri,
        sink_version=sink_version,
        quarantine_version=quarantine_version,
        buckets=tuple(buckets),
        problems=tuple(problems),
        spot_check=checked,
        seconds=time.monotonic() - began,
        sink_commits=len(commits) + (before.commits if before is not None else 0),
        backfill_commits=len(fills),
        erasures=tuple(erasures),
    )
    totals = report.totals
    log.info(
        "audit of %s: %d expected, %d in sink, %d in quarantine, %d missing, %d duplicated, "
        "%d out of range, %d erased by other writers (%.2f s)",
        pipeline,
        totals.expected,
        totals.in_sink,
        totals.in_quarantine,
        totals.missing,
        totals.duplicated,
        totals.out_of_range,
        totals.erased,
        report.seconds,
    )
    return report


def _with_backfills(
    filled: Mapping[int, np.ndarray],
    starts: Mapping[int, int],
    committed: Mapping[int, int],
    held: Mapping[int, np.ndarray] | None,
) -> tuple[OffsetsMap, OffsetsMap, dict[int, np.ndarray]]:
    """The expected positions once backfilled windows below the live range count too: per
    bucket with filled offsets, the held offsets become those of the live range (all of them
    on a contiguous log) and the filled ones, and the range stretches over both."""
    starts, committed, held = dict(starts), dict(committed), dict(held or {})
    for bucket, offsets in filled.items():
        if not len(offsets):
            continue
        if bucket in committed:
            live = held.get(bucket)
            if live is None:
                live = np.arange(starts[bucket], committed[bucket], dtype=np.int64)
            offsets = np.union1d(live, offsets)
        held[bucket] = offsets
        starts[bucket] = min(int(offsets[0]), starts.get(bucket, int(offsets[0])))
        committed[bucket] = max(int(offsets[-1]) + 1, committed.get(bucket, 0))
    return starts, committed, held


def count_positions(
    sink: tuple[np.ndarray, np.ndarray],
    quarantine: tuple[np.ndarray, np.ndarray],
    *,
    starts: Mapping[int, int],
    committed: Mapping[int, int],
    known_buckets: Sequence[int] = (),
    held: Mapping[int, np.ndarray] | None = None,
    erased: Mapping[int, np.ndarray] | None = None,
) -> list[BucketAudit]:
    """Per-bucket counts from ``(buckets, offsets)`` arrays of the two tables.

    Buckets reported: ``known_buckets`` (the log's), the committed ones, and any found in the
    tables, ascending. Pure numpy: a sort of the in-range positions and a diff.

    ``held``: for a log with gaps (Kafka), per bucket the sorted offsets of its committed range
    that hold a record. Those are what is expected; a table row at an offset that holds no
    record counts as out of range. Without it a range ``[start, committed)`` is contiguous.

    ``erased``: per bucket, sorted offsets another writer's commit removed
    (:mod:`modeswitch.sinks.erasures`); those of the range found in neither table count as
    ``erased``, not missing.
    """
    held = dict(held or {})
    erased = dict(erased or {})
    sink_b, sink_o = sink
    q_b, q_o = quarantine
    b = np.concatenate([sink_b, q_b]).astype(np.int64, copy=False)
    o = np.concatenate([sink_o, q_o]).astype(np.int64, copy=False)
    n_sink = len(sink_b)
    ids = np.union1d(
        np.array(sorted(set(known_buckets) | set(committed)), dtype=np.int64), np.unique(b)
    )
    n = len(ids)
    lo = np.array([starts.get(int(i), 0) if int(i) in committed else 0 for i in ids], np.int64)
    hi = np.array([committed.get(int(i), 0) for i in ids], np.int64)
    idx = np.searchsorted(ids, b)
    in_range = (o >= lo[idx]) & (o < hi[idx])
    for bucket, offsets in held.items():  # a position on a gap is no record of the log
        at = np.flatnonzero(in_range & (ids[idx] == bucket))
        in_range[at] = np.isin(o[at], offsets)

    in_sink = np.bincount(idx[:n_sink], minlength=n)
    in_quarantine = np.bincount(idx[n_sink:], minlength=n)
    outside = ~in_range
    out_of_range = np.bincount(idx[outside], minlength=n)

    r_idx, r_off = idx[in_range], o[in_range]
    # One sortable int64 per position: bucket index * width + offset (in range, so
    # 0 <= offset < width).
    width = max(int(hi.max()) if n else 0, 1)
    if n * width < 2**62:
        keys = r_idx * width + r_off
        keys.sort()
        key_idx, key_off = keys // width, keys % width
    else:  # offsets too large to pack with the bucket index
        order = np.lexsort((r_off, r_idx))
        key_idx, key_off = r_idx[order], r_off[order]
    first = np.ones(len(key_idx), dtype=bool)
    if len(key_idx) > 1:
        first[1:] = (key_idx[1:] != key_idx[:-1]) | (key_off[1:] != key_off[:-1])
    distinct = np.bincount(key_idx[first], minlength=n)
    duplicated = np.bincount(key_idx, minlength=n) - distinct
    expected = hi - lo
    for i, bucket in enumerate(ids.tolist()):
        if bucket in held:
            expected[i] = len(held[bucket])
    missing = expected - distinct
    # Out-of-range positions sorted by (bucket index, offset), for the examples.
    order = np.lexsort((o[outside], idx[outside]))
    out_idx, out_off = idx[outside][order], o[outside][order]

    rows = []
    for i, bucket in enumerate(ids.tolist()):
        has_range = bucket in committed
        in_left, in_right = np.searchsorted(key_idx, [i, i + 1])
        out_left, out_right = np.searchsorted(out_idx, [i, i + 1])
        present, copies = key_off[in_left:in_right], first[in_left:in_right]
        accounted = present[copies]
        gone = 0
        if bucket in erased and has_range:
            removed = erased[bucket]
            removed = removed[(removed >= lo[i]) & (removed < hi[i])]
            if bucket in held:
                removed = removed[np.isin(removed, held[bucket])]
            removed = np.setdiff1d(removed, accounted)  # back since (a rewind reprocessed it)
            gone = len(removed)
            missing[i] -= gone
            accounted = np.union1d(accounted, removed)
        rows.append(
            BucketAudit(
                bucket=bucket,
                start=int(lo[i]) if has_range else None,
                committed=int(hi[i]) if has_range else None,
                expected=int(expected[i]),
                in_sink=int(in_sink[i]),
                in_quarantine=int(in_quarantine[i]),
                missing=int(missing[i]),
                duplicated=int(duplicated[i]),
                out_of_range=int(out_of_range[i]),
                missing_ranges=(
                    ()
                    if not missing[i]
                    else _unheld(held[bucket], accounted)
                    if bucket in held
                    else _gaps(accounted, int(lo[i]), int(hi[i]))
                ),
                duplicated_offsets=_lowest(present[~copies]),
                out_of_range_offsets=_lowest(out_off[out_left:out_right]),
                erased=gone,
            )
        )
    return rows


def _gaps(present: np.ndarray, lo: int, hi: int) -> tuple[tuple[int, int], ...]:
    """The first :data:`SAMPLE` ``[a, b)`` ranges of ``[lo, hi)`` not in sorted ``present``."""
    edges = np.concatenate([[lo - 1], present, [hi]])
    gaps = np.flatnonzero(np.diff(edges) > 1)[:SAMPLE]
    return tuple((int(edges[g] + 1), int(edges[g + 1])) for g in gaps)


def _unheld(held: np.ndarray, present: np.ndarray) -> tuple[tuple[int, int], ...]:
    """The first :data:`SAMPLE` runs of ``held`` offsets not in ``present``, as ``[a, b)``
    (a run is consecutive offsets; a log's gap ends a run)."""
    absent = np.setdiff1d(held, present)
    if len(absent) == 0:
        return ()
    breaks = np.flatnonzero(np.diff(absent) > 1) + 1
    starts = np.concatenate([[0], breaks])[:SAMPLE]
    ends = np.concatenate([breaks, [len(absent)]])[:SAMPLE]
    pairs = zip(starts, ends, strict=True)
    return tuple((int(absent[a]), int(absent[b - 1]) + 1) for a, b in pairs)


def _lowest(sorted_offsets: np.ndarray) -> tuple[int, ...]:
    """The first :data:`SAMPLE` distinct values of a sorted array."""
    if len(sorted_offsets) == 0:
        return ()
    new = np.ones(len(sorted_offsets), dtype=bool)
    new[1:] = sorted_offsets[1:] != sorted_offsets[:-1]
    return tuple(int(x) for x in sorted_offsets[new][:SAMPLE])


def _read(table: object | None, what: str, uri: str, columns: list[str]) -> pa.Table | None:
    if table is None:
        return None
    names = set(table.schema().to_arrow().names)  # type: ignore[attr-defined]
    lacking = [c for c in columns if c not in names]
    if lacking:
        raise ModeswitchError(
            f"{what} table {uri}: has no column(s) {', '.join(lacking)} "
            f"(columns: {', '.join(sorted(names))}); cannot audit it"
        )
    return table.to_pyarrow_table(columns=columns)  # type: ignore[attr-defined]


def _positions(table: object | None, what: str, uri: str) -> tuple[np.ndarray, np.ndarray]:
    return _position_arrays(_read(table, what, uri, POSITION_COLUMNS))


def _position_arrays(rows: pa.Table | None) -> tuple[np.ndarray, np.ndarray]:
    """``(buckets, offsets)`` as numpy; a null bucket or offset becomes -1 (out of range)."""
    if rows is None or rows.num_rows == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    buckets = pc.fill_null(rows.column("bucket").cast(pa.int64()), -1)
    offsets = pc.fill_null(rows.column("offset").cast(pa.int64()), -1)
    return buckets.to_numpy(), offsets.to_numpy()


def _held_offsets(
    source: BucketedLog,
    starts: Mapping[int, int],
    committed: Mapping[int, int],
    *tables: tuple[np.ndarray, np.ndarray],
) -> dict[int, np.ndarray]:
    """Per committed bucket, the offsets of ``[start, committed)`` that hold a record in a log
    with gaps (read from the log). Below the log's retention nothing can be read: there the
    tables' own positions are taken as held (what retention dropped cannot be checked). A
    compacting log (:attr:`~modeswitch.sources.base.BucketedLog.compacting`) may since have
    removed records the pipeline read anywhere in the range: there the tables' positions are
    taken as held too, beside what the log holds now (a row at an offset the cleaner removed
    cannot be told from one the log never held; every offset the log holds is still checked,
    and every copy beyond the first)."""
    earliest, latest = source.earliest_offsets(), source.latest_offsets()
    held = {}
    for bucket, end in committed.items():
        if bucket not in latest or end > latest[bucket]:
            continue  # reported by _source_problems
        start = starts.get(bucket, 0)
        first = min(max(start, earliest[bucket]), end)
        bound = end if source.compacting else first
        taken = [o[(b == bucket) & (o >= start) & (o < bound)] for b, o in tables]
        parts = [source.held_offsets(bucket, first, end), *taken]
        held[bucket] = np.unique(np.concatenate(parts)).astype(np.int64)
    return held


def _source_problems(source: BucketedLog, name: str, committed: Mapping[int, int]) -> list[str]:
    latest = source.latest_offsets()
    problems = []
    for bucket, offset in sorted(committed.items()):
        if bucket not in latest:
            problems.append(
                f"bucket {bucket}: committed up to offset {offset}, but the log "
                f"{name} has no bucket {bucket}"
            )
        elif offset > latest[bucket]:
            problems.append(
                f"bucket {bucket}: committed up to offset {offset}, beyond the log's latest "
                f"offset {latest[bucket]}: the sink claims records the source never had"
            )
    return problems


def _spot_check(source: BucketedLog, rows: pa.Table | None, limit: int) -> SpotCheck:
    """Compare up to ``limit`` quarantined records, spread evenly, with the source's."""
    if rows is None or rows.num_rows == 0:
        return SpotCheck(checked=0, skipped=0)
    rows = rows.sort_by([("bucket", "ascending"), ("offset", "ascending")])
    picks = np.unique(np.linspace(0, rows.num_rows - 1, num=min(limit, rows.num_rows)).round())
    sample = rows.take(pa.array(picks.astype(np.int64)))
    buckets = set(source.buckets())
    checked = skipped = 0
    mismatches: list[QuarantineMismatch] = []
    for row in sample.to_pylist():
        bucket, offset = row["bucket"], row["offset"]
        if bucket is None or offset is None or bucket not in buckets:
            skipped += 1
            continue
        try:
            batches = list(source.read(bucket, offset, offset + 1))
        except OffsetOutOfRangeError:
            skipped += 1
            continue
        record = pa.Table.from_batches(batches).to_pylist()[0]
        checked += 1
        for column in ("key", "value"):
            if row[column] != record[column]:
                mismatches.append(
                    QuarantineMismatch(bucket, offset, column, row[column], record[column])
                )
    return SpotCheck(checked=checked, skipped=skipped, mismatches=tuple(mismatches))


__all__ = [
    "AuditReport",
    "AuditTotals",
    "BucketAudit",
    "QuarantineMismatch",
    "SpotCheck",
    "audit",
    "count_positions",
]
