"""The ``epochs`` table: one row per epoch (mode, why, start / boundary / end, status).

Closing an epoch keeps with it the max event times of its sink commits (read from
``progress``); :meth:`EpochTable.max_event_times` reads them back, with the running epoch's
from ``progress`` and the rewinds from ``commands``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from modeswitch.errors import (
    EpochStillOpenError,
    InvalidStateInputError,
    InvalidStateTransitionError,
    StateRecordNotFoundError,
)
from modeswitch.offsets import OffsetsMap, offsets_to_dict
from modeswitch.sinks.commits import latest_sink_commit, rewind_txn_version, split_txn_version
from modeswitch.state.base import StateTables
from modeswitch.state.codec import epoch_from_row, epoch_to_row
from modeswitch.state.commands import CommandTable
from modeswitch.state.progress import ProgressTable
from modeswitch.state.records import (
    CLOSED_EPOCH_STATUSES,
    MODES,
    Epoch,
    EpochStatus,
    Mode,
    check_choice,
    check_int,
    check_offsets,
    check_text,
    check_timestamp,
    utc_now,
)
from modeswitch.state.tables import (
    SCHEMAS,
    TIMESTAMP,
    Change,
    Snapshot,
    insert,
    rows_table,
    upsert,
)

log = logging.getLogger(__name__)


class EpochTable:
    """Opening, closing and reading epochs (``store.epochs``). ``progress`` gives a closing
    epoch the max event times it keeps; ``commands`` the rewinds that
    :meth:`max_event_times` leaves out."""

    def __init__(
        self, tables: StateTables, *, progress: ProgressTable, commands: CommandTable
    ) -> None:
        self._tables = tables
        self._progress = progress
        self._commands = commands

    def open(
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
            self._tables.sink_table_uri,
            self._tables.pipeline,
            storage_options=self._tables.storage_options,
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

        epoch_id = self._tables.table("epochs").transact(f"open_epoch {mode}", plan)
        log.info(
            "pipeline %s: opened %s epoch %d (%s)", self._tables.pipeline, mode, epoch_id, reason
        )
        return epoch_id

    def close(
        self,
        epoch: int,
        end: Mapping[int, int],
        status: EpochStatus = "completed",
        reason: str = "",
    ) -> bool:
        """Close a running epoch at the offsets ``end``, with the max event times of its sink
        commits; True if this call closed it.

        Closing it again with the same status and end offsets is a no-op returning False (an
        Airflow retry); any other change to a closed epoch raises
        :class:`~modeswitch.errors.InvalidStateTransitionError`.
        """
        epoch_id = check_int(epoch, what="epoch", minimum=1)
        end = check_offsets(end, what=f"end of epoch {epoch_id}")
        status = check_choice(status, CLOSED_EPOCH_STATUSES, what="closing status")
        reason = check_text(reason, what="closing reason")
        now = utc_now()
        # Kept with the epoch, so that the watermark's inputs are read from the epochs table
        # and the running epoch's rows, not from every progress row the pipeline ever wrote.
        maxima = self._progress.epoch_event_maxima(epoch_id)

        def plan(snapshot: Snapshot) -> Change[bool]:
            current = _one_epoch(snapshot, epoch_id, self._tables.uri("epochs"))
            if not current.running:
                if current.status == status and current.end == end:
                    return Change(False)
                raise InvalidStateTransitionError(
                    f"epoch {epoch_id} is already {current.status} (ended "
                    f"{_iso(current.ended_at)}); it cannot be closed again as {status}"
                )
            closed = replace(
                current,
                status=status,
                ended_at=now,
                end=end,
                end_reason=reason,
                max_event_time_us=maxima,
            )
            rows = rows_table(SCHEMAS["epochs"], [epoch_to_row(closed)])
            return Change(True, upsert(rows, ("id",)))

        closed = self._tables.table("epochs").transact(f"close_epoch {epoch_id}", plan)
        if closed:
            log.info("pipeline %s: closed epoch %d as %s", self._tables.pipeline, epoch_id, status)
        return closed

    def list(self, *, last: int | None = None, since: datetime | None = None) -> list[Epoch]:
        """Every epoch, oldest first; or only the ``last`` newest, and those that ran at or
        after ``since`` (still running, or ended then). Bounded by what it returns: the ids
        and times are read first, then the rows of the epochs wanted only."""
        table = self._tables.table("epochs")
        where = None
        if last is not None or since is not None:
            times = table.read(columns=["id", "ended_at"])
            ids = times.column("id").to_numpy()
            wanted = ids.max(initial=0) + 1
            if last is not None and check_int(last, what="last") > 0 and len(ids):
                wanted = min(wanted, int(np.sort(ids)[-min(last, len(ids))]))
            if since is not None:
                at = pa.scalar(check_timestamp(since, what="since"), TIMESTAMP)
                ended = times.column("ended_at")
                recent = pc.or_kleene(pc.is_null(ended), pc.greater_equal(ended, at))
                ran = times.filter(recent).column("id").to_numpy()
                if len(ran):
                    wanted = min(wanted, int(ran.min()))
            where = pc.field("id") >= int(wanted)
        rows = table.read(where).to_pylist()
        return sorted((epoch_from_row(row) for row in rows), key=lambda epoch: epoch.id)

    def get(self, epoch: int) -> Epoch:
        """The epoch ``epoch``; :class:`~modeswitch.errors.StateRecordNotFoundError` if none."""
        epoch_id = check_int(epoch, what="epoch", minimum=1)
        rows = self._tables.table("epochs").read(pc.field("id") == epoch_id).to_pylist()
        if not rows:
            raise StateRecordNotFoundError(
                f"epoch {epoch_id} does not exist in {self._tables.uri('epochs')}"
            )
        return epoch_from_row(rows[0])

    def current(self) -> Epoch | None:
        """The running epoch, or None between epochs."""
        rows = self._tables.table("epochs").read(match=pc.field("status") == "running").to_pylist()
        epochs = sorted((epoch_from_row(row) for row in rows), key=lambda epoch: epoch.id)
        return epochs[-1] if epochs else None

    def latest(self) -> Epoch | None:
        """The newest epoch, running or closed; None before the first one."""
        epochs = self.list(last=1)
        return epochs[-1] if epochs else None

    def max_event_times(self) -> dict[int, int]:
        """Per bucket, the max event time (µs) of what is in the sink, from ``progress``.

        A bucket that a rewind moved back counts only commits after the newest rewind of it
        (its later rows were deleted); until one lands it has none, and the policy treats it
        as behind. Rewinds come from the applied ``rewind`` commands (cheap to read: no
        sink history), whose epoch and id give the rewind commit's place among the commits.
        """
        cutoff: dict[int, int] = {}
        for command in self._commands.list("applied"):
            if command.kind != "rewind" or command.applied_epoch is None:
                continue
            version = rewind_txn_version(command.applied_epoch, command.id)
            for bucket in command.args.get("offsets", {}):
                cutoff[int(bucket)] = max(version, cutoff.get(int(bucket), version))
        # Rows of epoch e count for bucket b unless a rewind of b was applied after an epoch
        # >= e: a data commit's version txn_version(e, seq) is below rewind_txn_version(a, c)
        # exactly when e <= a.
        after = {bucket: split_txn_version(v)[0] for bucket, v in cutoff.items()}
        latest: dict[int, int] = {}
        for epoch, maxima in self._event_maxima_by_epoch().items():
            for bucket, micros in maxima.items():
                if epoch > after.get(bucket, 0):
                    latest[bucket] = max(micros, latest.get(bucket, micros))
        return latest

    def _event_maxima_by_epoch(self) -> dict[int, dict[int, int]]:
        """Per epoch and bucket, the max event time of its sink commits: a closed epoch's
        from the epochs table (kept when it closed), the others' (the running one, and any
        closed before the maxima were kept) from their progress rows only."""
        epochs = self.list()
        kept = {e.id: e.max_event_time_us for e in epochs if e.max_event_time_us is not None}
        unkept = [e.id for e in epochs if e.id not in kept]
        lowest = min([*unkept, max(kept, default=0) + 1])
        read = self._progress.event_maxima_from(lowest)
        return {**read, **kept}  # type: ignore[dict-item]


def _iso(value: datetime | None) -> str:
    return "never" if value is None else value.isoformat()


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
