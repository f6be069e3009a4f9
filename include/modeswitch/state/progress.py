"""The ``progress`` table: one row per sink commit, following the sink's own log."""

from __future__ import annotations

import functools
import io
import logging
import operator
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pendulum
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import json as pa_json

from modeswitch.errors import (
    InvalidStateInputError,
    InvalidStateTransitionError,
    StateConflictError,
)
from modeswitch.offsets import OffsetsMap, offsets_to_dict
from modeswitch.sinks.commits import SinkCommit
from modeswitch.sinks.commits import committed_offsets as sink_committed_offsets
from modeswitch.state.base import StateTables
from modeswitch.state.codec import progress_from_row, progress_to_row
from modeswitch.state.records import (
    MODES,
    Progress,
    as_utc,
    check_choice,
    check_int,
    check_offsets,
    check_text,
    check_timestamp,
    utc_now,
)
from modeswitch.state.tables import (
    METADATA_KEY,
    SCHEMAS,
    TIMESTAMP,
    Change,
    Snapshot,
    insert,
    no_rows,
    rows_table,
    sql_timestamp,
)
from modeswitch.storage import retry_commit_races

log = logging.getLogger(__name__)


def progress_keys(commits: Sequence[SinkCommit | Progress]) -> pc.Expression:
    """A scan filter for the progress rows of ``commits`` (at least one): per epoch, its range
    of sequences, which the files' and row groups' statistics prune on."""
    return functools.reduce(
        operator.or_,
        (
            (pc.field("epoch") == epoch)
            & (pc.field("sequence") >= min(c.sequence for c in commits if c.epoch == epoch))
            & (pc.field("sequence") <= max(c.sequence for c in commits if c.epoch == epoch))
            for epoch in sorted({c.epoch for c in commits})
        ),
    )


class ProgressTable:
    """Recording and reading the sink commits; what the sink holds (``store.progress``)."""

    def __init__(self, tables: StateTables) -> None:
        self._tables = tables

    def record(
        self,
        commit: SinkCommit,
        *,
        watermark: datetime | None = None,
        recorded_by: str = "sink",
    ) -> bool:
        """Record one sink commit; True if recorded now, False if it already was.

        Idempotent per ``(epoch, sequence)``; the same key with different offsets is refused
        with :class:`~modeswitch.errors.InvalidStateTransitionError` (the sink log disagrees
        with the state: a bug, never to be papered over).
        """
        return self.record_many([commit], watermark=watermark, recorded_by=recorded_by) > 0

    def record_many(
        self,
        commits: Sequence[SinkCommit],
        *,
        watermark: datetime | None = None,
        recorded_by: str = "sink",
        through: int | None = None,
    ) -> int:
        """Record several sink commits in one commit of the progress table (a stream records
        its micro-batches this way, about once a second); returns how many were new. Same
        idempotence and refusal as :meth:`record`. ``through``: a sink version up to
        which every commit of the pipeline is recorded once these are (the caller read the
        log up to it); it moves :meth:`reconciled_through` forward in the same commit."""
        rows = [self._progress_of(c, watermark=watermark, recorded_by=recorded_by) for c in commits]
        if not rows:
            return 0
        # Only the files that may hold these keys are read (statistics prune the rest): a
        # long stream adds a file a second, and its recording must not slow down with them.
        where = progress_keys(rows)
        label = ", ".join(f"{p.epoch}/{p.sequence}" for p in rows[:3])

        def plan(snapshot: Snapshot) -> Change[int]:
            found = {
                (old.epoch, old.sequence): old
                for old in map(progress_from_row, snapshot.read(where).to_pylist())
            }
            new: list[Progress] = []
            for progress in rows:
                old = found.get((progress.epoch, progress.sequence))
                if old is None:
                    found[(progress.epoch, progress.sequence)] = progress
                    new.append(progress)
                elif (old.start, old.end) != (progress.start, progress.end):
                    raise InvalidStateTransitionError(
                        f"progress of epoch {progress.epoch} sequence {progress.sequence} is "
                        f"recorded as {offsets_to_dict(old.start)} -> {offsets_to_dict(old.end)}"
                        f"; refusing {offsets_to_dict(progress.start)} -> "
                        f"{offsets_to_dict(progress.end)}"
                    )
            held = snapshot.transaction_version(self._reconciled_app)
            mark = None
            if through is not None and through > (-1 if held is None else held):
                mark = (self._reconciled_app, through)
            if not new:
                return Change(0, None if mark is None else no_rows(), mark=mark)
            table = rows_table(SCHEMAS["progress"], [progress_to_row(p) for p in new])
            return Change(len(new), insert(table), mark=mark)

        return self._tables.table("progress").transact(f"record_progress {label}", plan)

    def record_missing(
        self, commits: Sequence[SinkCommit], *, through: int, now: pendulum.DateTime
    ) -> tuple[tuple[int, int], ...]:
        """Record, as ``recorded_by="reconcile"``, those of ``commits`` (newest first) that
        have no progress row, oldest first, and move :meth:`reconciled_through` up to sink
        version ``through`` in the same commit; returns the ``(epoch, sequence)`` recorded.
        A commit already recorded is left as it is (what
        :func:`~modeswitch.state.reconcile` repairs)."""

        def plan(snapshot: Snapshot) -> Change[tuple[tuple[int, int], ...]]:
            recorded = set()
            if commits:
                have = snapshot.read(progress_keys(commits), columns=["epoch", "sequence"])
                recorded = {(row["epoch"], row["sequence"]) for row in have.to_pylist()}
            missing = [c for c in reversed(commits) if (c.epoch, c.sequence) not in recorded]
            held = snapshot.transaction_version(self._reconciled_app)
            advance = through > (-1 if held is None else held)
            if not missing and not advance:
                return Change(())
            rows = [
                progress_to_row(self._progress_of(c, recorded_by="reconcile", now=now))
                for c in missing
            ]
            keys = tuple((c.epoch, c.sequence) for c in missing)
            write = insert(rows_table(SCHEMAS["progress"], rows)) if rows else no_rows()
            return Change(keys, write, mark=(self._reconciled_app, through) if advance else None)

        return self._tables.table("progress").transact("reconcile progress", plan)

    @property
    def _reconciled_app(self) -> str:
        return f"{self._tables.pipeline}/reconciled"

    def reconciled_through(self) -> int:
        """The sink version up to which every commit of the pipeline is recorded in
        ``progress`` (-1 before any): where :func:`~modeswitch.state.reconcile` and a stream's
        supervisor start reading the sink's log."""
        table = self._tables.table("progress").load()
        held = None if table is None else table.transaction_version(self._reconciled_app)
        return -1 if held is None else held

    def downsample(self, horizon: timedelta, *, now: datetime | None = None) -> int:
        """Merge the progress rows recorded more than ``horizon`` ago into one row per epoch
        and hour (its first commit's start, its last commit's end, the records summed, the
        max event times, ``commits`` the number of commits it stands for); returns how many
        rows fewer the table holds.

        Only rows at or below :meth:`reconciled_through` are merged (nothing reads their
        single keys again), and only those recorded since the previous run's cut (kept as an
        application transaction of ``progress``): a run's cost is the rows of the hours that
        passed the horizon since. One replace-where commit; concurrent appends (a stream
        recording) land beside it, and a concurrent rewrite of the same rows (a compaction of
        the table) makes it start over on the new snapshot.
        """
        from deltalake import CommitProperties, Transaction, write_deltalake

        table = self._tables.table("progress")
        hour = timedelta(hours=1)
        now_s = int((as_utc(now) if now is not None else utc_now()).timestamp())
        cut_s = (now_s - int(horizon.total_seconds())) // 3600 * 3600
        app = f"{self._tables.pipeline}/downsampled"

        def attempt(number: int) -> int:
            delta = table.load()
            mark = self.reconciled_through()
            if delta is None or mark < 0:
                return 0
            since_s = delta.transaction_version(app) or 0
            if cut_s <= since_s:
                return 0
            since, cut = (pendulum.from_timestamp(t, tz="UTC") for t in (since_s, cut_s))
            where = (
                (pc.field("recorded_at") >= pa.scalar(since, TIMESTAMP))
                & (pc.field("recorded_at") < pa.scalar(cut, TIMESTAMP))
                & (pc.field("sink_version") <= mark)
            )
            rows = [progress_from_row(r) for r in Snapshot(delta).read(where).to_pylist()]
            groups: dict[tuple[int, int], list[Progress]] = {}
            for row in sorted(rows, key=lambda p: (p.epoch, p.sequence)):
                slot = int(row.recorded_at.timestamp()) // int(hour.total_seconds())
                groups.setdefault((row.epoch, slot), []).append(row)
            merged = [_merge(group) for group in groups.values()]
            predicate = (
                f"recorded_at >= '{sql_timestamp(since)}' AND recorded_at < '{sql_timestamp(cut)}' "
                f"AND sink_version <= {mark}"
            )
            write_deltalake(
                delta,
                rows_table(SCHEMAS["progress"], [progress_to_row(m) for m in merged]),
                mode="overwrite",
                predicate=predicate,
                schema_mode="merge",
                commit_properties=CommitProperties(
                    custom_metadata={METADATA_KEY: "downsample progress"},
                    app_transactions=[Transaction(app, cut_s)],
                ),
            )
            return len(rows) - len(merged)

        removed = retry_commit_races(
            attempt,
            attempts=self._tables.attempts,
            what=f"downsampling progress of pipeline {self._tables.pipeline!r}",
            error=StateConflictError,
        )
        if removed:
            log.info(
                "pipeline %s: progress older than %s merged: %d rows fewer",
                self._tables.pipeline,
                horizon,
                removed,
            )
        return removed

    def list(self, epoch: int | None = None) -> list[Progress]:
        """Recorded sink commits (of one epoch, or all), by epoch and sequence."""
        where = None
        if epoch is not None:
            where = pc.field("epoch") == check_int(epoch, what="epoch")
        rows = self._tables.table("progress").read(where).to_pylist()
        return sorted((progress_from_row(row) for row in rows), key=lambda p: (p.epoch, p.sequence))

    def after_version(self, version: int) -> list[Progress]:
        """Recorded sink commits that wrote a sink table version above ``version`` (rows
        without a recorded version are left out), by epoch and sequence: what landed since a
        reader last looked at ``version``."""
        where = pc.field("sink_version") > check_int(version, what="version", minimum=-1)
        rows = self._tables.table("progress").read(where).to_pylist()
        return sorted((progress_from_row(row) for row in rows), key=lambda p: (p.epoch, p.sequence))

    def epoch_summaries(self, first_epoch: int) -> dict[int, dict[str, Any]]:
        """Per epoch from ``first_epoch`` on: its sink commits (``commits``), ``records`` (in
        the sink), ``quarantined`` (in the quarantine table), its first and last commit times,
        and the first and last sink table versions it wrote (``first_version``,
        ``last_version``; None where no row records one). Reads six columns of the rows of
        those epochs only (older row groups are skipped by their statistics)."""
        rows = self._tables.table("progress").read(
            pc.field("epoch") >= check_int(first_epoch, what="first_epoch"),
            columns=["epoch", "records", "committed_at", "commits", "quarantined", "sink_version"],
        )
        if rows.num_rows == 0:
            return {}
        commits = pc.fill_null(rows.column("commits").cast(pa.int64()), 1)
        quarantined = pc.fill_null(rows.column("quarantined").cast(pa.int64()), 0)
        grouped = (
            rows.set_column(3, "commits", commits)
            .set_column(4, "quarantined", quarantined)
            .group_by("epoch")
            .aggregate(
                [
                    ("commits", "sum"),
                    ("records", "sum"),
                    ("quarantined", "sum"),
                    ("committed_at", "min"),
                    ("committed_at", "max"),
                    ("sink_version", "min"),
                    ("sink_version", "max"),
                ]
            )
        )
        return {
            row["epoch"]: {
                "commits": row["commits_sum"],
                "records": row["records_sum"],
                "quarantined": row["quarantined_sum"],
                "first_commit_at": as_utc(row["committed_at_min"]),
                "last_commit_at": as_utc(row["committed_at_max"]),
                "first_version": row["sink_version_min"],
                "last_version": row["sink_version_max"],
            }
            for row in grouped.to_pylist()
        }

    def committed_offsets(self) -> OffsetsMap:
        """Per bucket, the end of what is in the sink, read from the sink's own Delta log."""
        return sink_committed_offsets(
            self._tables.sink_table_uri,
            self._tables.pipeline,
            storage_options=self._tables.storage_options,
        )

    def epoch_event_maxima(self, epoch: int) -> dict[int, int]:
        """Per bucket, the max event time of one epoch's sink commits: what closing the epoch
        keeps with it. Reads that epoch's rows only (statistics prune the rest)."""
        return self._progress_maxima(pc.field("epoch") == check_int(epoch, what="epoch")).get(
            epoch, {}
        )

    def event_maxima_from(self, first_epoch: int) -> dict[int, dict[int, int]]:
        """Per epoch from ``first_epoch`` on and per bucket, the max event time of its sink
        commits, from their progress rows (older epochs' rows are skipped by statistics)."""
        return self._progress_maxima(pc.field("epoch") >= first_epoch)

    def _progress_maxima(self, where: pc.Expression) -> dict[int, dict[int, int]]:
        """Per epoch and bucket, the max event time of the progress rows ``where`` selects,
        in one vectorised pass (the JSON maps become one column per bucket)."""
        rows = self._tables.table("progress").read(where, columns=["epoch", "max_event_time_us"])
        maxima: dict[int, dict[int, int]] = {}
        if not rows.num_rows:
            return maxima
        text = "\n".join(rows.column("max_event_time_us").to_pylist()).encode()
        times = pa_json.read_json(io.BytesIO(text))
        per_epoch = (
            times.append_column("epoch", rows.column("epoch"))
            .group_by("epoch")
            .aggregate([(name, "max") for name in times.column_names])  # nulls skipped
        )
        for row in per_epoch.to_pylist():
            buckets = maxima.setdefault(row.pop("epoch"), {})
            for name, micros in row.items():
                if micros is not None:
                    buckets[int(name.removesuffix("_max"))] = int(micros)
        return maxima

    def _progress_of(
        self,
        commit: SinkCommit,
        *,
        watermark: datetime | None = None,
        recorded_by: str,
        now: pendulum.DateTime | None = None,
    ) -> Progress:
        if not isinstance(commit, SinkCommit):
            raise InvalidStateInputError(f"sink commit: {commit!r} is not a SinkCommit")
        pipeline = self._tables.pipeline
        if commit.pipeline != pipeline:
            raise InvalidStateInputError(
                f"sink commit: pipeline {commit.pipeline!r} is not this store's {pipeline!r}"
            )
        what = f"sink commit {commit.epoch}/{commit.sequence}"
        committed_at = None
        if commit.committed_at_ms is not None:
            committed_at = pendulum.from_timestamp(commit.committed_at_ms / 1000, tz="UTC")
        return Progress(
            epoch=check_int(commit.epoch, what=f"{what} epoch"),
            sequence=check_int(commit.sequence, what=f"{what} sequence"),
            mode=check_choice(commit.mode, MODES, what=f"{what} mode"),
            start=check_offsets(commit.start, what=f"{what} start"),
            end=check_offsets(commit.end, what=f"{what} end"),
            records=check_int(commit.records, what=f"{what} records"),
            quarantined=check_int(commit.quarantined, what=f"{what} quarantined"),
            max_event_time_us={
                check_int(b, what=f"{what} event-time bucket"): check_int(
                    t, what=f"{what} max event time of bucket {b}", minimum=-(2**63)
                )
                for b, t in commit.max_event_time_us.items()
            },
            watermark=None
            if watermark is None
            else check_timestamp(watermark, what=f"{what} watermark"),
            committed_at=committed_at,
            sink_version=None
            if commit.table_version is None
            else check_int(commit.table_version, what=f"{what} sink table version"),
            recorded_at=now or utc_now(),
            recorded_by=check_text(recorded_by, what="recorded_by", allow_empty=False),
        )


def _merge(rows: list[Progress]) -> Progress:
    """One progress row standing for ``rows``: consecutive commits of one epoch."""
    first, last = rows[0], rows[-1]
    if len(rows) == 1:
        return first
    event_times: dict[int, int] = {}
    for row in rows:
        for bucket, micros in row.max_event_time_us.items():
            event_times[bucket] = max(micros, event_times.get(bucket, micros))
    return replace(
        last,
        start={b: o for r in reversed(rows) for b, o in r.start.items()},  # each bucket's first
        records=sum(r.records for r in rows),
        quarantined=sum(r.quarantined for r in rows),
        max_event_time_us=event_times,
        recorded_by="maintain",
        commits=sum(r.commits for r in rows),
    )
