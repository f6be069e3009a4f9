"""The split ledger (``splits``) of batch epochs, and the ``finished`` buckets of each.

The ledger reads the epoch a split belongs to (its start and boundary) from the epochs table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Protocol

import pyarrow.compute as pc

from modeswitch.errors import (
    InvalidStateInputError,
    InvalidStateTransitionError,
    StateRecordNotFoundError,
)
from modeswitch.offsets import OffsetsMap
from modeswitch.state.base import StateTables
from modeswitch.state.codec import split_from_row, split_to_row
from modeswitch.state.epochs import EpochTable
from modeswitch.state.records import (
    SPLIT_STATUSES,
    SPLIT_TRANSITIONS,
    Epoch,
    LedgerSplit,
    SplitStatus,
    check_choice,
    check_int,
    utc_now,
)
from modeswitch.state.tables import SCHEMAS, Change, Snapshot, insert, rows_table, upsert

log = logging.getLogger(__name__)


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


class SplitLedger:
    """The split ledger and the buckets that reached their boundary (``store.ledger``);
    ``epochs`` gives each batch epoch's range."""

    def __init__(self, tables: StateTables, *, epochs: EpochTable) -> None:
        self._tables = tables
        self._epochs = epochs

    def record(self, epoch: int, waves: Iterable[WaveLike]) -> int:
        """Add the planned splits of a batch epoch to its ledger as ``pending``; returns how
        many rows were added.

        Every split must lie within the epoch's ``[start, boundary)`` of its bucket, and no two
        live (pending or committed) splits of the epoch may overlap. Recording the same split
        in the same wave again is a no-op (a retried task), so the call is idempotent. After a
        re-plan, mark the old splits ``replanned`` first; a re-plan continues the wave
        numbering, so a new split never repeats a replanned one's wave.
        """
        owner = self._epochs.get(epoch)
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

        added = self._tables.table("splits").transact(f"record_splits epoch {owner.id}", plan)
        log.info("pipeline %s: epoch %d ledger +%d splits", self._tables.pipeline, owner.id, added)
        return added

    def mark(
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

        return self._tables.table("splits").transact(f"mark_splits epoch {epoch_id} {status}", plan)

    def splits(self, epoch: int, status: SplitStatus | None = None) -> list[LedgerSplit]:
        """The ledger of an epoch (optionally only one status), by wave, bucket and offset."""
        epoch_id = check_int(epoch, what="epoch", minimum=1)
        match = None
        if status is not None:
            check_choice(status, SPLIT_STATUSES, what="split status")
            match = pc.field("status") == status
        rows = (
            self._tables.table("splits")
            .read(pc.field("epoch") == epoch_id, match=match)
            .to_pylist()
        )
        return sorted(
            (split_from_row(row) for row in rows), key=lambda s: (s.wave, s.bucket, s.start)
        )

    def record_finished(self, epoch: int, buckets: Iterable[int]) -> int:
        """Record that ``buckets`` of batch epoch ``epoch`` reached their boundary (Fluss's
        BacklogFinishEvent); returns how many were new. Each bucket is recorded once per
        epoch: recording it again (a retried job) is a no-op."""
        owner = self._epochs.get(epoch)
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

        return self._tables.table("finished").transact(f"record_backlog_finished {owner.id}", plan)

    def finished(self, epoch: int) -> dict[int, datetime]:
        """The buckets of a batch epoch that reached their boundary, and when."""
        epoch_id = check_int(epoch, what="epoch", minimum=1)
        rows = self._tables.table("finished").read(pc.field("epoch") == epoch_id).to_pylist()
        return {row["bucket"]: row["finished_at"] for row in rows}

    def commit_reached(
        self, newest_end: Mapping[int, OffsetsMap], *, now: datetime
    ) -> tuple[LedgerSplit, ...]:
        """Mark committed every pending split ``[bucket, start, end)`` of an epoch whose newest
        sink commit ended at ``end`` or beyond in that bucket (``newest_end``: per epoch, that
        commit's end offsets); returns the splits marked, in one commit (what
        :func:`~modeswitch.state.reconcile` repairs)."""

        def plan(snapshot: Snapshot) -> Change[tuple[LedgerSplit, ...]]:
            if not newest_end:
                return Change(())
            pending = [
                split_from_row(row)
                for row in snapshot.read(
                    pc.field("epoch") >= min(newest_end), match=pc.field("status") == "pending"
                ).to_pylist()
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

        return self._tables.table("splits").transact("reconcile splits", plan)


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
