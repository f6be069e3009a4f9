"""The pipeline's control state: six Delta tables under one root, and the operations on them.

========== =================================================================================
epochs     one row per epoch: mode, why, start / boundary / end offsets, status
splits     the split ledger of batch epochs: (epoch, wave, bucket, [start, end), status)
progress   one row per sink commit: offsets, records, event times, watermark, sink version
decisions  every policy evaluation, its outcome and its inputs (JSON): the audit trail
commands   operator commands and how each was resolved (applied where, or rejected why)
finished   per batch epoch and bucket, when the bucket reached its boundary (once each)
========== =================================================================================

The sink's own Delta log is the truth about what is committed (DESIGN.md, invariant 7);
``progress`` and the split ledger follow it, and :meth:`StateStore.reconcile` repairs them
after a crash between a sink commit and the state write that should have followed it.

Every change is an optimistic compare-and-swap on its table (see :mod:`.tables`), so any number
of processes (Spark drivers, Airflow tasks, the CLI) may use the state at once: epoch and
command ids are never handed out twice, a command is resolved once, a sink commit is recorded
once. A :class:`StateStore` holds only strings; it pickles, and every process builds its own.
"""

from __future__ import annotations

import functools
import json
import logging
import operator
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import pendulum
import pyarrow.compute as pc

from modeswitch.errors import (
    EpochStillOpenError,
    InvalidStateInputError,
    InvalidStateTransitionError,
    StateRecordNotFoundError,
)
from modeswitch.offsets import OffsetsMap, offsets_to_dict
from modeswitch.sinks.commits import (
    SinkCommit,
    latest_sink_commit,
    rewind_txn_version,
    sink_commits,
    txn_version,
)
from modeswitch.sinks.commits import committed_offsets as sink_committed_offsets
from modeswitch.state.codec import (
    command_from_row,
    command_to_row,
    decision_from_row,
    decision_to_row,
    epoch_from_row,
    epoch_to_row,
    progress_from_row,
    progress_to_row,
    split_from_row,
    split_to_row,
)
from modeswitch.state.records import (
    CLOSED_EPOCH_STATUSES,
    COMMAND_KINDS,
    COMMAND_STATUSES,
    MODES,
    SPLIT_STATUSES,
    SPLIT_TRANSITIONS,
    Command,
    CommandKind,
    Epoch,
    EpochStatus,
    LedgerSplit,
    Mode,
    Progress,
    Reconciliation,
    RecordedDecision,
    SplitStatus,
    check_choice,
    check_int,
    check_offsets,
    check_text,
    check_timestamp,
    to_json,
    utc_now,
)
from modeswitch.state.tables import (
    SCHEMAS,
    Change,
    ControlTable,
    Snapshot,
    insert,
    rows_table,
    upsert,
)

if TYPE_CHECKING:
    from modeswitch.config import PipelineSettings

log = logging.getLogger(__name__)

STATE_DIR = "_modeswitch"
_PIPELINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_SPLIT_KEY_COLUMNS = ("epoch", "wave", "bucket", "start_offset", "end_offset")


class SplitLike(Protocol):
    """Anything with ``bucket``, ``start`` and ``end``: a planner ``Split``, a ledger split."""

    @property
    def bucket(self) -> int: ...

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


class WaveLike(Protocol):
    """Anything with an ``index`` and ``splits``: a planner ``Wave``."""

    @property
    def index(self) -> int: ...

    @property
    def splits(self) -> Iterable[SplitLike]: ...


class StateStore:
    """The control tables of one pipeline, and the one sink table whose log they follow.

    ``state_root`` holds the tables (``<root>/epochs``, ``<root>/splits``, ...); local paths are
    made absolute so that every process means the same place. Tables are created on first
    write. ``attempts`` bounds how many commit races one change may lose before
    :class:`~modeswitch.errors.StateConflictError`; a table that reaches
    ``compact_at_files`` data files is compacted by the writer that got it there.

    The store holds only strings and numbers: it pickles, and it opens the tables afresh on
    every call, so one instance may be shared by threads or shipped to another process.
    """

    def __init__(
        self,
        state_root: str,
        sink_table_uri: str,
        pipeline: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        attempts: int = 40,
        compact_at_files: int = 64,
    ) -> None:
        self.state_root = _normalise_uri(
            check_text(state_root, what="state_root", allow_empty=False)
        )
        self.sink_table_uri = _normalise_uri(
            check_text(sink_table_uri, what="sink_table_uri", allow_empty=False)
        )
        self.pipeline = check_text(pipeline, what="pipeline", allow_empty=False)
        self.storage_options = dict(storage_options or {})
        self.attempts = check_int(attempts, what="attempts", minimum=1)
        self.compact_at_files = check_int(compact_at_files, what="compact_at_files", minimum=2)

    @classmethod
    def from_settings(
        cls, settings: PipelineSettings, *, storage_options: Mapping[str, str] | None = None
    ) -> StateStore:
        """The control tables of the pipeline ``settings`` configure. ``storage_options``: the
        tables' (and the sink's) storage options, e.g. an Airflow Connection's extras; None
        reads them from ``MODESWITCH_STORAGE_OPTIONS`` (a job's environment, set by whoever
        started it; :mod:`modeswitch.storage`)."""
        from modeswitch.storage import storage_options as from_environment

        return cls(
            settings.state_root,
            settings.sink,
            settings.pipeline,
            storage_options=from_environment() if storage_options is None else storage_options,
        )

    @classmethod
    def for_warehouse(
        cls,
        warehouse: str,
        pipeline: str,
        sink_table_uri: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        attempts: int = 40,
        compact_at_files: int = 64,
    ) -> StateStore:
        """The store at the default root, ``<warehouse>/_modeswitch/<pipeline>``."""
        if not isinstance(pipeline, str) or not _PIPELINE_NAME.fullmatch(pipeline):
            raise InvalidStateInputError(
                f"pipeline: {pipeline!r} is not a valid name (letters, digits, '_', '.', '-')"
            )
        warehouse = check_text(warehouse, what="warehouse", allow_empty=False)
        root = f"{_normalise_uri(warehouse)}/{STATE_DIR}/{pipeline}"
        return cls(
            root,
            sink_table_uri,
            pipeline,
            storage_options=storage_options,
            attempts=attempts,
            compact_at_files=compact_at_files,
        )

    def __repr__(self) -> str:
        return (
            f"StateStore(state_root={self.state_root!r}, sink_table_uri={self.sink_table_uri!r},"
            f" pipeline={self.pipeline!r})"
        )

    def table_uri(self, name: str) -> str:
        """Where the control table ``name`` (``epochs``, ``splits``, ...) lives."""
        check_choice(name, tuple(SCHEMAS), what="control table")
        return f"{self.state_root}/{name}"

    def _table(self, name: str) -> ControlTable:
        return ControlTable(
            name=name,
            uri=self.table_uri(name),
            schema=SCHEMAS[name],
            storage_options=self.storage_options,
            attempts=self.attempts,
            compact_at_files=self.compact_at_files,
        )

    # --- epochs ------------------------------------------------------------------------------

    def open_epoch(
        self,
        mode: Mode,
        reason: str,
        start: Mapping[int, int],
        boundary: Mapping[int, int] | None = None,
        *,
        supersede: bool = False,
    ) -> int:
        """Open a new epoch and return its id.

        Ids start at 1, strictly increase and are never reused, even by processes opening
        epochs at the same instant; they also stay above every epoch already in the sink's
        log, so a new epoch is never fenced out by an old one. A batch epoch needs its
        ``boundary`` (covering every bucket of ``start``, never below it); a stream epoch has
        none. While another epoch is running the call is refused with
        :class:`~modeswitch.errors.EpochStillOpenError` (the pipeline's fencing), unless
        ``supersede``: then the running epoch is closed as ``superseded`` in the same commit
        that opens the new one.
        """
        mode = check_choice(mode, MODES, what="epoch mode")
        reason = check_text(reason, what="epoch reason")
        start = check_offsets(start, what="epoch start")
        if mode == "batch":
            if boundary is None:
                raise InvalidStateInputError("epoch boundary: a batch epoch needs a boundary")
            boundary = check_offsets(boundary, what="epoch boundary")
            _check_boundary(start, boundary)
        elif boundary is not None:
            raise InvalidStateInputError(
                f"epoch boundary: a stream epoch has no boundary, got {boundary!r}"
            )
        latest = latest_sink_commit(
            self.sink_table_uri, self.pipeline, storage_options=self.storage_options
        )
        sink_floor = latest.epoch if latest else 0
        now = utc_now()

        def plan(snapshot: Snapshot) -> Change[int]:
            epochs = [epoch_from_row(row) for row in snapshot.read().to_pylist()]
            running = [epoch for epoch in epochs if epoch.running]
            new_id = max([sink_floor, *(epoch.id for epoch in epochs)]) + 1
            if running and not supersede:
                other = running[0]
                raise EpochStillOpenError(
                    f"cannot open a {mode} epoch: epoch {other.id} ({other.mode}, started "
                    f"{other.started_at.isoformat()}) is still running; close it first or "
                    f"pass supersede=True"
                )
            new = Epoch(
                id=new_id,
                mode=mode,
                reason=reason,
                status="running",
                started_at=now,
                start=start,
                boundary=boundary,
            )
            if not running:
                return Change(new_id, insert(rows_table(SCHEMAS["epochs"], [epoch_to_row(new)])))
            closed = [
                replace(
                    epoch,
                    status="superseded",
                    ended_at=now,
                    end_reason=f"superseded by epoch {new_id}: {reason}",
                )
                for epoch in running
            ]
            rows = [epoch_to_row(epoch) for epoch in (*closed, new)]
            return Change(
                new_id, upsert(rows_table(SCHEMAS["epochs"], rows), ("id",), insert_missing=True)
            )

        epoch_id = self._table("epochs").transact(f"open_epoch {mode}", plan)
        log.info("pipeline %s: opened %s epoch %d (%s)", self.pipeline, mode, epoch_id, reason)
        return epoch_id

    def close_epoch(
        self,
        epoch: int,
        end: Mapping[int, int],
        status: EpochStatus = "completed",
        reason: str = "",
    ) -> bool:
        """Close a running epoch at the offsets ``end``; True if this call closed it.

        Closing it again with the same status and end offsets is a no-op returning False (an
        Airflow retry); any other change to a closed epoch raises
        :class:`~modeswitch.errors.InvalidStateTransitionError`.
        """
        epoch_id = check_int(epoch, what="epoch", minimum=1)
        end = check_offsets(end, what=f"end of epoch {epoch_id}")
        status = check_choice(status, CLOSED_EPOCH_STATUSES, what="closing status")
        reason = check_text(reason, what="closing reason")
        now = utc_now()

        def plan(snapshot: Snapshot) -> Change[bool]:
            current = _one_epoch(snapshot, epoch_id, self.table_uri("epochs"))
            if not current.running:
                if current.status == status and current.end == end:
                    return Change(False)
                raise InvalidStateTransitionError(
                    f"epoch {epoch_id} is already {current.status} (ended "
                    f"{_iso(current.ended_at)}); it cannot be closed again as {status}"
                )
            closed = replace(current, status=status, ended_at=now, end=end, end_reason=reason)
            rows = rows_table(SCHEMAS["epochs"], [epoch_to_row(closed)])
            return Change(True, upsert(rows, ("id",)))

        closed = self._table("epochs").transact(f"close_epoch {epoch_id}", plan)
        if closed:
            log.info("pipeline %s: closed epoch %d as %s", self.pipeline, epoch_id, status)
        return closed

    def epochs(self) -> list[Epoch]:
        """Every epoch, oldest first."""
        rows = self._table("epochs").read().to_pylist()
        return sorted((epoch_from_row(row) for row in rows), key=lambda epoch: epoch.id)

    def epoch(self, epoch: int) -> Epoch:
        """The epoch ``epoch``; :class:`~modeswitch.errors.StateRecordNotFoundError` if none."""
        epoch_id = check_int(epoch, what="epoch", minimum=1)
        rows = self._table("epochs").read(pc.field("id") == epoch_id).to_pylist()
        if not rows:
            raise StateRecordNotFoundError(
                f"epoch {epoch_id} does not exist in {self.table_uri('epochs')}"
            )
        return epoch_from_row(rows[0])

    def current_epoch(self) -> Epoch | None:
        """The running epoch, or None between epochs."""
        rows = self._table("epochs").read(match=pc.field("status") == "running").to_pylist()
        epochs = sorted((epoch_from_row(row) for row in rows), key=lambda epoch: epoch.id)
        return epochs[-1] if epochs else None

    def latest_epoch(self) -> Epoch | None:
        """The newest epoch, running or closed; None before the first one."""
        epochs = self.epochs()
        return epochs[-1] if epochs else None

    # --- split ledger ------------------------------------------------------------------------

    def record_splits(self, epoch: int, waves: Iterable[WaveLike]) -> int:
        """Add the planned splits of a batch epoch to its ledger as ``pending``; returns how
        many rows were added.

        Every split must lie within the epoch's ``[start, boundary)`` of its bucket, and no two
        live (pending or committed) splits of the epoch may overlap. Recording the same split
        in the same wave again is a no-op (a retried task), so the call is idempotent. After a
        re-plan, mark the old splits ``replanned`` first; a re-plan continues the wave
        numbering, so a new split never repeats a replanned one's wave.
        """
        owner = self.epoch(epoch)
        if owner.mode != "batch" or owner.boundary is None:
            raise InvalidStateInputError(
                f"epoch {owner.id} is a {owner.mode} epoch; only batch epochs have a split ledger"
            )
        wanted: list[tuple[int, int, int, int]] = []
        for wave in waves:
            index = check_int(wave.index, what="wave index")
            for split in wave.splits:
                bucket, start, end = _split_key(split, what=f"split of wave {index}")
                _check_within(owner, bucket, start, end)
                wanted.append((index, bucket, start, end))
        overlap = _first_overlap([(b, s, e) for _, b, s, e in wanted])
        if overlap:
            raise InvalidStateInputError(f"splits of epoch {owner.id} overlap: {overlap}")
        now = utc_now()

        def plan(snapshot: Snapshot) -> Change[int]:
            rows = snapshot.read(pc.field("epoch") == owner.id).to_pylist()
            ledger = [split_from_row(row) for row in rows]
            live = {(s.wave, *s.key) for s in ledger if s.status != "replanned"}
            replanned = {(s.wave, *s.key) for s in ledger if s.status == "replanned"}
            new = [split for split in wanted if split not in live]
            for wave, bucket, start, end in new:
                if (wave, bucket, start, end) in replanned:
                    raise InvalidStateInputError(
                        f"epoch {owner.id}: split bucket {bucket} [{start}, {end}) of wave "
                        f"{wave} was replanned; a re-plan must use new wave numbers"
                    )
            overlap = _first_overlap(
                [(b, s, e) for _, b, s, e in new]
                + [s.key for s in ledger if s.status != "replanned"]
            )
            if overlap:
                raise InvalidStateInputError(
                    f"splits of epoch {owner.id} overlap its ledger: {overlap}"
                )
            if not new:
                return Change(0)
            records = [
                LedgerSplit(owner.id, wave, bucket, start, end, "pending", now, now)
                for wave, bucket, start, end in new
            ]
            rows_new = rows_table(SCHEMAS["splits"], [split_to_row(s) for s in records])
            return Change(len(records), insert(rows_new))

        added = self._table("splits").transact(f"record_splits epoch {owner.id}", plan)
        log.info("pipeline %s: epoch %d ledger +%d splits", self.pipeline, owner.id, added)
        return added

    def mark_splits(
        self,
        epoch: int,
        splits: Iterable[SplitLike | tuple[int, int, int]],
        status: SplitStatus,
    ) -> int:
        """Move live splits of the epoch, given as ``(bucket, start, end)``, to ``status``;
        returns how many changed.

        Allowed moves: pending to committed, pending to replanned. A split already in
        ``status`` is left as it is; an unknown split raises
        :class:`~modeswitch.errors.StateRecordNotFoundError`, any other move
        :class:`~modeswitch.errors.InvalidStateTransitionError`. All changes are one commit.
        """
        epoch_id = check_int(epoch, what="epoch", minimum=1)
        status = check_choice(status, SPLIT_STATUSES, what="split status")
        keys = sorted({_split_key(split, what="split") for split in splits})
        now = utc_now()

        def plan(snapshot: Snapshot) -> Change[int]:
            rows = snapshot.read(pc.field("epoch") == epoch_id).to_pylist()
            ledger = [split_from_row(row) for row in rows]
            changed: list[LedgerSplit] = []
            for key in keys:
                matches = [s for s in ledger if s.key == key]
                if not matches:
                    raise StateRecordNotFoundError(
                        f"epoch {epoch_id} has no split bucket {key[0]} [{key[1]}, {key[2]}) "
                        f"in its ledger"
                    )
                split = next((s for s in matches if s.status != "replanned"), matches[0])
                if split.status == status:
                    continue
                if (split.status, status) not in SPLIT_TRANSITIONS:
                    raise InvalidStateTransitionError(
                        f"split bucket {key[0]} [{key[1]}, {key[2]}) of epoch {epoch_id} is "
                        f"{split.status}; it cannot become {status}"
                    )
                changed.append(replace(split, status=status, updated_at=now))
            if not changed:
                return Change(0)
            rows_changed = rows_table(SCHEMAS["splits"], [split_to_row(s) for s in changed])
            return Change(len(changed), upsert(rows_changed, _SPLIT_KEY_COLUMNS))

        return self._table("splits").transact(f"mark_splits epoch {epoch_id} {status}", plan)

    def splits(self, epoch: int, status: SplitStatus | None = None) -> list[LedgerSplit]:
        """The ledger of an epoch (optionally only one status), by wave, bucket and offset."""
        epoch_id = check_int(epoch, what="epoch", minimum=1)
        match = None
        if status is not None:
            check_choice(status, SPLIT_STATUSES, what="split status")
            match = pc.field("status") == status
        rows = self._table("splits").read(pc.field("epoch") == epoch_id, match=match).to_pylist()
        return sorted(
            (split_from_row(row) for row in rows), key=lambda s: (s.wave, s.bucket, s.start)
        )

    def pending_splits(self, epoch: int) -> list[LedgerSplit]:
        """The splits of the epoch that are neither committed nor replanned."""
        return self.splits(epoch, "pending")

    # --- backlog finished --------------------------------------------------------------------

    def record_backlog_finished(self, epoch: int, buckets: Iterable[int]) -> int:
        """Record that ``buckets`` of batch epoch ``epoch`` reached their boundary (Fluss's
        BacklogFinishEvent); returns how many were new. Each bucket is recorded once per
        epoch: recording it again (a retried job) is a no-op."""
        owner = self.epoch(epoch)
        if owner.mode != "batch" or owner.boundary is None:
            raise InvalidStateInputError(
                f"epoch {owner.id} is a {owner.mode} epoch; only batch epochs finish a backlog"
            )
        wanted = sorted({check_int(b, what="finished bucket") for b in buckets})
        unknown = [b for b in wanted if b not in owner.boundary]
        if unknown:
            raise InvalidStateInputError(
                f"epoch {owner.id}: buckets {unknown} are not in its boundary"
            )
        now = utc_now()

        def plan(snapshot: Snapshot) -> Change[int]:
            rows = snapshot.read(pc.field("epoch") == owner.id).to_pylist()
            known = {row["bucket"] for row in rows}
            new = [b for b in wanted if b not in known]
            if not new:
                return Change(0)
            table = rows_table(
                SCHEMAS["finished"],
                [
                    {
                        "epoch": owner.id,
                        "bucket": b,
                        "boundary_offset": owner.boundary[b],
                        "finished_at": now,
                    }
                    for b in new
                ],
            )
            return Change(len(new), insert(table))

        return self._table("finished").transact(f"record_backlog_finished {owner.id}", plan)

    def finished_buckets(self, epoch: int) -> dict[int, datetime]:
        """The buckets of a batch epoch that reached their boundary, and when."""
        epoch_id = check_int(epoch, what="epoch", minimum=1)
        rows = self._table("finished").read(pc.field("epoch") == epoch_id).to_pylist()
        return {row["bucket"]: row["finished_at"] for row in rows}

    # --- progress ----------------------------------------------------------------------------

    def record_progress(
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
        return self.record_progress_many([commit], watermark=watermark, recorded_by=recorded_by) > 0

    def record_progress_many(
        self,
        commits: Sequence[SinkCommit],
        *,
        watermark: datetime | None = None,
        recorded_by: str = "sink",
    ) -> int:
        """Record several sink commits in one commit of the progress table (a stream records
        its micro-batches this way, about once a second); returns how many were new. Same
        idempotence and refusal as :meth:`record_progress`."""
        rows = [self._progress_of(c, watermark=watermark, recorded_by=recorded_by) for c in commits]
        if not rows:
            return 0
        # Only the files that may hold these keys are read (statistics prune the rest): a
        # long stream adds a file a second, and its recording must not slow down with them.
        where = functools.reduce(
            operator.or_,
            (
                (pc.field("epoch") == epoch)
                & (pc.field("sequence") >= min(p.sequence for p in rows if p.epoch == epoch))
                & (pc.field("sequence") <= max(p.sequence for p in rows if p.epoch == epoch))
                for epoch in sorted({p.epoch for p in rows})
            ),
        )
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
            if not new:
                return Change(0)
            table = rows_table(SCHEMAS["progress"], [progress_to_row(p) for p in new])
            return Change(len(new), insert(table))

        return self._table("progress").transact(f"record_progress {label}", plan)

    def progress(self, epoch: int | None = None) -> list[Progress]:
        """Recorded sink commits (of one epoch, or all), by epoch and sequence."""
        where = None
        if epoch is not None:
            where = pc.field("epoch") == check_int(epoch, what="epoch")
        rows = self._table("progress").read(where).to_pylist()
        return sorted((progress_from_row(row) for row in rows), key=lambda p: (p.epoch, p.sequence))

    def committed_offsets(self) -> OffsetsMap:
        """Per bucket, the end of what is in the sink, read from the sink's own Delta log."""
        return sink_committed_offsets(
            self.sink_table_uri, self.pipeline, storage_options=self.storage_options
        )

    def max_event_times(self) -> dict[int, int]:
        """Per bucket, the max event time (µs) of what is in the sink, from ``progress``.

        A bucket that a rewind moved back counts only commits after the newest rewind of it
        (its later rows were deleted); until one lands it has none, and the policy treats it
        as behind. Rewinds come from the applied ``rewind`` commands (cheap to read: no
        sink history), whose epoch and id give the rewind commit's place among the commits.
        """
        cutoff: dict[int, int] = {}
        for command in self.commands("applied"):
            if command.kind != "rewind" or command.applied_epoch is None:
                continue
            version = rewind_txn_version(command.applied_epoch, command.id)
            for bucket in command.args.get("offsets", {}):
                cutoff[int(bucket)] = max(version, cutoff.get(int(bucket), version))
        latest: dict[int, int] = {}
        for row in self.progress():
            version = txn_version(row.epoch, row.sequence)
            for bucket, micros in row.max_event_time_us.items():
                if version < cutoff.get(bucket, -1):
                    continue
                latest[bucket] = max(micros, latest.get(bucket, micros))
        return latest

    def reconcile(self) -> Reconciliation:
        """Bring ``progress``, the split ledger and the commands up to the sink's Delta log.

        Inserts a progress row (``recorded_by="reconcile"``) for every sink commit of the
        pipeline that ``progress`` lacks, wherever it lies in the log, and marks committed
        every pending split ``[bucket, start, end)`` of an epoch whose newest sink commit has
        reached ``end`` in that bucket. A rewind commit whose command is still pending marks
        it applied (a crash came between the two). Rewinds get no progress row. Returns what
        it repaired; a second call right after repairs nothing.
        """
        every = list(
            sink_commits(self.sink_table_uri, self.pipeline, storage_options=self.storage_options)
        )
        commits = [c for c in every if not c.is_rewind]
        now = utc_now()

        def plan_progress(snapshot: Snapshot) -> Change[tuple[tuple[int, int], ...]]:
            have = snapshot.read().select(["epoch", "sequence"]).to_pylist()
            recorded = {(row["epoch"], row["sequence"]) for row in have}
            missing = [c for c in reversed(commits) if (c.epoch, c.sequence) not in recorded]
            if not missing:
                return Change(())
            rows = [
                progress_to_row(self._progress_of(c, recorded_by="reconcile", now=now))
                for c in missing
            ]
            keys = tuple((c.epoch, c.sequence) for c in missing)
            return Change(keys, insert(rows_table(SCHEMAS["progress"], rows)))

        inserted = self._table("progress").transact("reconcile progress", plan_progress)

        newest_end: dict[int, OffsetsMap] = {}
        for commit in commits:  # newest first: the first one seen of an epoch is its newest
            newest_end.setdefault(commit.epoch, commit.end)

        def plan_splits(snapshot: Snapshot) -> Change[tuple[LedgerSplit, ...]]:
            pending = [
                split_from_row(row)
                for row in snapshot.read(match=pc.field("status") == "pending").to_pylist()
            ]
            covered = tuple(
                replace(split, status="committed", updated_at=now)
                for split in pending
                if split.end <= newest_end.get(split.epoch, {}).get(split.bucket, -1)
            )
            if not covered:
                return Change(())
            rows = rows_table(SCHEMAS["splits"], [split_to_row(s) for s in covered])
            return Change(covered, upsert(rows, _SPLIT_KEY_COLUMNS))

        committed = self._table("splits").transact("reconcile splits", plan_splits)
        pending = {c.id for c in self.pending_commands() if c.kind == "rewind"}
        rewinds = tuple(
            c.command
            for c in reversed(every)
            if c.is_rewind and c.command in pending and self.acknowledge_rewind(c)
        )
        result = Reconciliation(progress=inserted, splits=committed, rewinds=rewinds)
        if result.repaired:
            log.warning(
                "pipeline %s: reconciled the control state with sink %s: %d progress rows "
                "inserted %s, %d splits marked committed, rewind commands %s marked applied",
                self.pipeline,
                self.sink_table_uri,
                len(inserted),
                list(inserted),
                len(committed),
                list(rewinds),
            )
        return result

    def acknowledge_rewind(self, commit: SinkCommit) -> bool:
        """Mark the rewind command of sink commit ``commit`` applied, with the commit's epoch
        and end offsets: the one outcome both ``decide`` and :meth:`reconcile` record. True if
        this call applied it."""
        if not commit.is_rewind or commit.command is None:
            raise InvalidStateInputError(f"sink commit {commit!r} is not a rewind")
        return self.apply_command(commit.command, max(commit.epoch, 1), commit.end)

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
        if commit.pipeline != self.pipeline:
            raise InvalidStateInputError(
                f"sink commit: pipeline {commit.pipeline!r} is not this store's {self.pipeline!r}"
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

    # --- decisions ---------------------------------------------------------------------------

    def record_decision(
        self,
        mode: Mode,
        reason: str,
        inputs: Mapping[str, Any],
        *,
        at: datetime | None = None,
        switched: bool = False,
        epoch: int | None = None,
        decided_by: str = "",
    ) -> RecordedDecision:
        """Append one policy evaluation to the audit trail and return it as stored.

        ``inputs`` is everything the evaluation used (e.g. ``Decision.to_record()``); it is
        stored as JSON text, datetimes as ISO 8601. ``at`` (default now) must be
        timezone-aware.
        """
        if not isinstance(inputs, Mapping):
            raise InvalidStateInputError(f"decision inputs: {inputs!r} is not a mapping")
        if not isinstance(switched, bool):
            raise InvalidStateInputError(f"decision switched: {switched!r} is not a bool")
        decision = RecordedDecision(
            at=utc_now() if at is None else check_timestamp(at, what="decision time"),
            mode=check_choice(mode, MODES, what="decision mode"),
            reason=check_text(reason, what="decision reason"),
            switched=switched,
            inputs=_json_roundtrip(inputs, what="decision inputs"),
            epoch=None if epoch is None else check_int(epoch, what="decision epoch", minimum=1),
            decided_by=check_text(decided_by, what="decided_by"),
        )
        rows = rows_table(SCHEMAS["decisions"], [decision_to_row(decision)])
        self._table("decisions").transact(
            f"record_decision {decision.mode}", lambda _: Change(None, insert(rows))
        )
        return decision

    def decisions(self, limit: int | None = None) -> list[RecordedDecision]:
        """Recorded policy evaluations, newest first (at most ``limit``)."""
        rows = self._table("decisions").read().to_pylist()
        decisions = sorted((decision_from_row(row) for row in rows), key=lambda d: d.at)
        decisions.reverse()
        if limit is not None:
            decisions = decisions[: check_int(limit, what="limit")]
        return decisions

    def latest_decision(self) -> RecordedDecision | None:
        """The newest policy evaluation, or None before the first."""
        newest = self.decisions(limit=1)
        return newest[0] if newest else None

    # --- commands ----------------------------------------------------------------------------

    def submit_command(
        self, kind: CommandKind, args: Mapping[str, Any] | None = None, *, issuer: str
    ) -> int:
        """Queue an operator command as ``pending`` and return its id (1, 2, ...; never
        reused, even when processes submit at the same instant).

        ``rewind`` needs ``args["offsets"]``, a valid offsets map; other kinds take any
        JSON-safe ``args`` (e.g. a note). ``issuer`` names who asked.
        """
        kind = check_choice(kind, COMMAND_KINDS, what="command kind")
        issuer = check_text(issuer, what="command issuer", allow_empty=False)
        if args is None:
            args = {}
        if not isinstance(args, Mapping):
            raise InvalidStateInputError(f"{kind} command args: {args!r} is not a mapping")
        args = dict(args)
        if kind == "rewind":
            if "offsets" not in args:
                raise InvalidStateInputError(
                    f"rewind command args: {args!r} has no 'offsets' to rewind to"
                )
            offsets = check_offsets(args["offsets"], what="rewind command offsets")
            args["offsets"] = offsets_to_dict(offsets)
        stored_args = _json_roundtrip(args, what=f"{kind} command args")
        now = utc_now()

        def plan(snapshot: Snapshot) -> Change[int]:
            ids = snapshot.read().column("id").to_pylist()
            command = Command(
                id=max(ids, default=0) + 1,
                kind=kind,
                args=stored_args,
                issuer=issuer,
                status="pending",
                created_at=now,
            )
            rows = rows_table(SCHEMAS["commands"], [command_to_row(command)])
            return Change(command.id, insert(rows))

        command_id = self._table("commands").transact(f"submit_command {kind}", plan)
        log.info("pipeline %s: command %d %s from %s", self.pipeline, command_id, kind, issuer)
        return command_id

    def apply_command(self, command: int, epoch: int, offsets: Mapping[int, int]) -> bool:
        """Mark a pending command applied in ``epoch`` at the commit boundary ``offsets``.

        True if this call applied it. False if it was no longer pending (already applied, by
        this or a racing process, or rejected): the caller must then not act on it. Of any
        number of processes applying one command at once, exactly one gets True.
        """
        epoch_id = check_int(epoch, what="applied epoch", minimum=1)
        at = check_offsets(offsets, what=f"offsets of command {command}")
        now = utc_now()
        return self._resolve_command(
            command,
            "applied",
            lambda pending: replace(
                pending,
                status="applied",
                applied_at=now,
                applied_epoch=epoch_id,
                applied_offsets=at,
            ),
        )

    def reject_command(self, command: int, reason: str) -> bool:
        """Mark a pending command rejected, saying why; True if this call rejected it, False
        if it was no longer pending."""
        reason = check_text(
            reason, what=f"rejection reason of command {command}", allow_empty=False
        )
        now = utc_now()
        return self._resolve_command(
            command,
            "rejected",
            lambda pending: replace(pending, status="rejected", rejected_at=now, reason=reason),
        )

    def _resolve_command(
        self, command: int, outcome: str, resolve: Callable[[Command], Command]
    ) -> bool:
        command_id = check_int(command, what="command", minimum=1)

        def plan(snapshot: Snapshot) -> Change[bool]:
            rows = snapshot.read(pc.field("id") == command_id).to_pylist()
            if not rows:
                raise StateRecordNotFoundError(
                    f"command {command_id} does not exist in {self.table_uri('commands')}"
                )
            current = command_from_row(rows[0])
            if current.status != "pending":
                return Change(False)
            resolved = resolve(current)
            return Change(
                True, upsert(rows_table(SCHEMAS["commands"], [command_to_row(resolved)]), ("id",))
            )

        done = self._table("commands").transact(f"command {command_id} {outcome}", plan)
        if done:
            log.info("pipeline %s: command %d %s", self.pipeline, command_id, outcome)
        else:
            log.info(
                "pipeline %s: command %d was no longer pending; not %s",
                self.pipeline,
                command_id,
                outcome,
            )
        return done

    def command(self, command: int) -> Command:
        """The command ``command``; :class:`~modeswitch.errors.StateRecordNotFoundError` if
        none."""
        command_id = check_int(command, what="command", minimum=1)
        rows = self._table("commands").read(pc.field("id") == command_id).to_pylist()
        if not rows:
            raise StateRecordNotFoundError(
                f"command {command_id} does not exist in {self.table_uri('commands')}"
            )
        return command_from_row(rows[0])

    def commands(self, status: str | None = None) -> list[Command]:
        """Commands in submission order, optionally only those with ``status``."""
        match = None
        if status is not None:
            check_choice(status, COMMAND_STATUSES, what="command status")
            match = pc.field("status") == status
        rows = self._table("commands").read(match=match).to_pylist()
        return sorted((command_from_row(row) for row in rows), key=lambda c: c.id)

    def pending_commands(self) -> list[Command]:
        """Commands waiting for a commit boundary, oldest first."""
        return self.commands("pending")


# --- helpers ---------------------------------------------------------------------------------


def _normalise_uri(uri: str) -> str:
    uri = uri.rstrip("/")
    if "://" in uri:
        return uri
    return os.path.abspath(uri)


def _iso(value: datetime | None) -> str:
    return "never" if value is None else value.isoformat()


def _json_roundtrip(value: Mapping[str, Any], *, what: str) -> dict[str, Any]:
    """The value as it will read back from its JSON column."""
    return json.loads(to_json(value, what=what))


def _one_epoch(snapshot: Snapshot, epoch_id: int, where: str) -> Epoch:
    rows = snapshot.read(pc.field("id") == epoch_id).to_pylist()
    if not rows:
        raise StateRecordNotFoundError(f"epoch {epoch_id} does not exist in {where}")
    return epoch_from_row(rows[0])


def _check_boundary(start: OffsetsMap, boundary: OffsetsMap) -> None:
    for bucket in start:
        if bucket not in boundary:
            raise InvalidStateInputError(
                f"epoch boundary: {offsets_to_dict(boundary)} lacks bucket {bucket} of the start"
            )
    for bucket, end in boundary.items():
        if end < start.get(bucket, 0):
            raise InvalidStateInputError(
                f"epoch boundary: bucket {bucket} ends at {end}, below its start "
                f"{start.get(bucket, 0)}"
            )


def _split_key(split: SplitLike | tuple[int, int, int], *, what: str) -> tuple[int, int, int]:
    if isinstance(split, tuple):
        if len(split) != 3:
            raise InvalidStateInputError(f"{what}: {split!r} is not (bucket, start, end)")
        bucket, start, end = split
    else:
        try:
            bucket, start, end = split.bucket, split.start, split.end
        except AttributeError as exc:
            raise InvalidStateInputError(f"{what}: {split!r} has no bucket, start and end") from exc
    check_int(bucket, what=f"{what} bucket")
    check_int(start, what=f"{what} start")
    check_int(end, what=f"{what} end")
    if end <= start:
        raise InvalidStateInputError(f"{what}: bucket {bucket} [{start}, {end}) is empty")
    return (bucket, start, end)


def _check_within(epoch: Epoch, bucket: int, start: int, end: int) -> None:
    boundary = epoch.boundary or {}
    if bucket not in boundary:
        raise InvalidStateInputError(
            f"split bucket {bucket} [{start}, {end}): epoch {epoch.id} has no such bucket"
        )
    if start < epoch.start.get(bucket, 0) or end > boundary[bucket]:
        raise InvalidStateInputError(
            f"split bucket {bucket} [{start}, {end}) lies outside epoch {epoch.id}'s range "
            f"[{epoch.start.get(bucket, 0)}, {boundary[bucket]})"
        )


def _first_overlap(splits: Iterable[tuple[int, int, int]]) -> str | None:
    """The first two of ``(bucket, start, end)`` that share records, described; else None.

    The same split listed twice counts as an overlap."""
    reach: dict[int, tuple[int, int]] = {}
    for bucket, start, end in sorted(splits):
        previous = reach.get(bucket)
        if previous and start < previous[1]:
            return f"bucket {bucket} [{previous[0]}, {previous[1]}) and [{start}, {end})"
        reach[bucket] = (start, end)
    return None
