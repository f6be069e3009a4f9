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
each table and the counting is a sort and a diff (about 2 M rows in well under a second;
:func:`~modeswitch.ops.audit_counts.count_positions`).

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
from modeswitch.ops.audit_counts import BucketAudit, count_positions
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

POSITION_COLUMNS = ["bucket", "offset"]


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
    (:meth:`CommandTable.log_summaries`); they stand for the commits up to their newest
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
    "QuarantineMismatch",
    "SpotCheck",
    "audit",
]
