"""Rewinds: move the sink's committed offsets back, in one commit, so that records are
reprocessed from there exactly once.

A ``rewind`` command to ``{bucket: offset}`` means "reprocess from these offsets". Under
exactly-once that must not duplicate anything, so :func:`rewind_sink` deletes every row of
those buckets with ``offset >=`` the rewind offset, in ONE sink commit (deltalake
``DeltaTable.delete``, or an empty commit when no row matches) whose metadata records it
(:class:`~modeswitch.sinks.commits.SinkCommit` of mode ``"rewind"``): the offsets it moves
back to (the new committed end), the offsets it moved from, the command id and its epoch. The
commit carries the app transaction ``(pipeline, rewind_txn_version(epoch, command))`` and is
fenced like every sink commit (:func:`modeswitch.sinks.fencing.check_fencing`): checked on one
snapshot, committed on exactly that snapshot with ``max_commit_retries=0``, checked again if
anything landed in between. The next epoch then starts at the rewound offsets, and the
sink's continuity check accepts it.

The quarantine table loses the same rows, in its own commit with the same app-transaction
version, right after the sink's. The sink commit is the truth: a crash between the two is
repaired by :func:`modeswitch.sinks.committer.sync_quarantine` (called before every sink commit
and by ``decide``), which never deletes twice.

Never applied twice: before committing, the log is searched for a rewind that already carries
the command id (a crash between the sink commit and the commands-table update); if one is
there, nothing is written and that commit is returned. ``modeswitch.state.reconcile`` marks such a
command applied.

A bad rewind is refused with :class:`~modeswitch.errors.RewindRefusedError` before anything
is written: an unknown bucket, an offset above the committed offset (a rewind never moves
forward), an offset below the source's earliest retained offset (those records are gone).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from modeswitch.errors import FencedError, RewindRefusedError
from modeswitch.faults import pause_point
from modeswitch.offsets import offsets_to_json
from modeswitch.sinks.commits import (
    REWIND_SEQUENCE_BASE,
    SinkCommit,
    find_rewind,
    newest_commit_in,
    rewind_txn_version,
    split_txn_version,
)
from modeswitch.storage import retry_commit_races

log = logging.getLogger(__name__)

COMMIT_ATTEMPTS = 20


@dataclass(frozen=True)
class RewindOutcome:
    """What :func:`rewind_sink` did: ``committed`` now, or ``already_applied`` earlier (then
    ``commit`` is the earlier commit and nothing was written)."""

    status: Literal["committed", "already_applied"]
    commit: SinkCommit
    table_version: int | None
    deleted: int = 0


def check_rewind(
    command: int,
    offsets: Mapping[int, int],
    *,
    committed: Mapping[int, int],
    earliest: Mapping[int, int],
    buckets: Iterable[int],
) -> None:
    """Refuse a bad rewind with :class:`RewindRefusedError` naming the command, the bucket and
    the value. ``committed`` is per bucket the sink's end (the earliest offset where nothing
    is committed); ``earliest`` the source's earliest retained offsets; ``buckets`` the
    source's buckets."""
    known = sorted(buckets)
    problems = []
    if not offsets:
        problems.append("no offsets to rewind to")
    for bucket, offset in sorted(offsets.items()):
        if bucket not in known:
            problems.append(f"bucket {bucket} is not a bucket of the source (it has {known})")
            continue
        at = committed.get(bucket, earliest.get(bucket, 0))
        if offset > at:
            problems.append(
                f"bucket {bucket}: offset {offset} is above the committed offset {at}; a "
                "rewind moves back to reprocess, never forward"
            )
        elif offset < earliest.get(bucket, 0):
            problems.append(
                f"bucket {bucket}: offset {offset} is below the source's earliest retained "
                f"offset {earliest[bucket]}; those records are gone"
            )
    if problems:
        raise RewindRefusedError(
            f"rewind command #{command} to {offsets_to_json(offsets)} refused: "
            + "; ".join(problems)
        )


def rewind_predicate(offsets: Mapping[int, int]) -> str:
    """The delete predicate of a rewind: the rows at or above the offsets, per bucket."""
    return " OR ".join(
        f'(bucket = {int(b)} AND "offset" >= {int(o)})' for b, o in sorted(offsets.items())
    )


def rewind_sink(
    sink_uri: str,
    pipeline: str,
    *,
    command: int,
    epoch: int,
    offsets: Mapping[int, int],
    earliest: Mapping[int, int],
    buckets: Iterable[int],
    quarantine_uri: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    issued_at: datetime | None = None,
) -> RewindOutcome:
    """Apply ``rewind`` command ``command`` to the sink (and the quarantine), once.

    ``epoch`` is the newest epoch, closed: the rewind is applied between epochs (by
    ``decide``), and fences out that epoch's zombies. Raises :class:`RewindRefusedError`
    (nothing written) for a bad rewind or a sink that holds nothing of the pipeline, and
    :class:`~modeswitch.errors.FencedError` if a later epoch already committed.
    ``issued_at``: when the command was issued; the search for its commit (applied before a
    crash) then reads only the log since (:func:`~modeswitch.sinks.commits.find_rewind`).
    """
    from deltalake import CommitProperties, DeltaTable, Transaction
    from deltalake.exceptions import CommitFailedError, TableNotFoundError

    options = dict(storage_options or {})
    buckets = list(buckets)
    version = rewind_txn_version(epoch, command)

    def attempt(number: int) -> RewindOutcome:
        try:
            table = DeltaTable(sink_uri, storage_options=options)
        except TableNotFoundError as exc:
            raise RewindRefusedError(
                f"rewind command #{command} refused: the sink {sink_uri} does not exist yet; "
                "there is nothing to rewind"
            ) from exc
        done = find_rewind(table, pipeline, command, issued_at=issued_at)
        if done is not None:
            log.info(
                "rewind command #%d is already in the sink (version %s): not applied again",
                command,
                done.table_version,
            )
            if quarantine_uri:
                rewind_quarantine(quarantine_uri, pipeline, done, storage_options=options)
            return RewindOutcome("already_applied", done, done.table_version)
        previous = newest_commit_in(table, pipeline)
        if previous is None:
            raise RewindRefusedError(
                f"rewind command #{command} refused: the sink {sink_uri} holds nothing of "
                f"pipeline {pipeline!r} yet; there is nothing to rewind"
            )
        check_rewind(
            command,
            offsets,
            committed={**earliest, **previous.end},
            earliest=earliest,
            buckets=buckets,
        )
        current = table.transaction_version(pipeline)
        if current is not None and current >= version:
            held_epoch, held_sequence = split_txn_version(current)
            raise FencedError(
                f"sink {sink_uri}: refused rewind command #{command} after epoch {epoch}: the "
                f"table already holds epoch {held_epoch} sequence {held_sequence}"
            )
        moved = {b: o for b, o in offsets.items() if b in previous.end}
        commit = SinkCommit(
            pipeline=pipeline,
            epoch=epoch,
            mode="rewind",
            sequence=REWIND_SEQUENCE_BASE + command,
            start=dict(moved),
            end={**previous.end, **moved},
            records=0,
            command=command,
            rewound_from={b: previous.end[b] for b in moved},
        )
        properties = CommitProperties(
            max_commit_retries=0,
            app_transactions=[Transaction(pipeline, version)],
            custom_metadata=commit.to_metadata(),
        )
        pause_point("rewind.between_check_and_commit")
        try:
            deleted, landed = _delete_or_mark(
                table, rewind_predicate(moved) if moved else None, properties
            )
        except CommitFailedError:
            raise  # lost the race: retry_commit_races checks again
        commit = replace(commit, table_version=landed)
        log.info(
            "rewind command #%d: sink %s moved back to %s (%d rows deleted), table version %d",
            command,
            sink_uri,
            offsets_to_json(commit.end),
            deleted,
            landed,
        )
        pause_point("rewind.after_sink_commit")
        if quarantine_uri:
            rewind_quarantine(quarantine_uri, pipeline, commit, storage_options=options)
        return RewindOutcome("committed", commit, landed, deleted)

    return retry_commit_races(
        attempt, attempts=COMMIT_ATTEMPTS, what=f"sink {sink_uri}: rewind command #{command}"
    )


def _delete_or_mark(table: Any, predicate: str | None, properties: Any) -> tuple[int, int]:
    """Delete the predicate's rows in one commit on the table's snapshot; if none match
    (delta-rs then makes no commit), make an empty commit with the same properties, so that
    the rewind is recorded either way. Returns ``(rows deleted, table version)``: with no
    automatic retry, the commit is exactly the snapshot's version + 1."""
    import pyarrow as pa

    before = table.version()
    deleted = 0
    if predicate is not None:
        metrics = table.delete(predicate, commit_properties=properties)
        deleted = int(metrics.get("num_deleted_rows", 0))
    if table.version() == before:
        schema = pa.schema(table.schema().to_arrow())
        table.create_write_transaction([], "append", schema, commit_properties=properties)
    return deleted, before + 1


def rewind_quarantine(
    quarantine_uri: str,
    pipeline: str,
    rewind: SinkCommit,
    *,
    storage_options: Mapping[str, str] | None = None,
) -> bool:
    """Delete the rewound rows from the quarantine table, once, with the rewind's
    app-transaction version; True if this call committed it.

    Call it only while ``rewind`` is the pipeline's newest sink commit (as
    :func:`~modeswitch.sinks.committer.sync_quarantine` does): after that, records reprocessed
    into the quarantine must not be deleted again. The version check makes a repeat a no-op.
    """
    from deltalake import CommitProperties, DeltaTable, Transaction
    from deltalake.exceptions import CommitFailedError, TableNotFoundError

    assert rewind.is_rewind

    def attempt(number: int) -> bool:
        try:
            table = DeltaTable(quarantine_uri, storage_options=dict(storage_options or {}))
        except TableNotFoundError:
            return False  # nothing was ever quarantined
        current = table.transaction_version(pipeline)
        if current is not None and current >= rewind.txn_version:
            return False
        properties = CommitProperties(
            max_commit_retries=0,
            app_transactions=[Transaction(pipeline, rewind.txn_version)],
            custom_metadata=rewind.to_metadata(),
        )
        try:
            deleted, _ = _delete_or_mark(
                table, rewind_predicate(rewind.start) if rewind.start else None, properties
            )
        except CommitFailedError:
            raise  # lost the race: retry_commit_races checks again
        log.info(
            "rewind command #%s: %d quarantined rows deleted from %s",
            rewind.command,
            deleted,
            quarantine_uri,
        )
        return True

    return retry_commit_races(
        attempt,
        attempts=COMMIT_ATTEMPTS,
        what=f"quarantine {quarantine_uri}: rewind command #{rewind.command}",
    )


__all__ = [
    "RewindOutcome",
    "check_rewind",
    "rewind_predicate",
    "rewind_quarantine",
    "rewind_sink",
]
