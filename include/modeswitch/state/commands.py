"""The ``commands`` table: operator commands and how each was resolved."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pyarrow.compute as pc

from modeswitch.errors import (
    BackfillRefusedError,
    InvalidStateInputError,
    MaintenanceRefusedError,
    StateRecordNotFoundError,
)
from modeswitch.offsets import offsets_to_dict
from modeswitch.sinks.commits import SinkCommit
from modeswitch.sinks.history import LogSummary
from modeswitch.state.base import StateTables, json_roundtrip
from modeswitch.state.codec import command_from_row, command_to_row
from modeswitch.state.records import (
    COMMAND_KINDS,
    COMMAND_STATUSES,
    RUN_KINDS,
    Command,
    CommandKind,
    check_choice,
    check_int,
    check_offsets,
    check_text,
    utc_now,
)
from modeswitch.state.tables import SCHEMAS, Change, Snapshot, insert, rows_table, upsert

log = logging.getLogger(__name__)


class CommandTable:
    """Submitting, resolving and reading operator commands, and the backfill and maintenance
    runs recorded as commands (``store.commands``)."""

    def __init__(self, tables: StateTables) -> None:
        self._tables = tables

    def submit(
        self, kind: CommandKind, args: Mapping[str, Any] | None = None, *, issuer: str
    ) -> int:
        """Queue an operator command as ``pending`` and return its id (1, 2, ...; never
        reused, even when processes submit at the same instant).

        ``rewind`` needs ``args["offsets"]``, a valid offsets map; other kinds take any
        JSON-safe ``args`` (e.g. a note). ``issuer`` names who asked.
        """
        kind = check_choice(kind, COMMAND_KINDS, what="command kind")
        if kind in RUN_KINDS:
            raise InvalidStateInputError(
                f"{kind}: not a queued command; a {kind} run records itself with "
                f"claim_{'backfill' if kind == 'backfill' else 'maintenance'} when it starts"
            )
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
        stored_args = json_roundtrip(args, what=f"{kind} command args")
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

        command_id = self._tables.table("commands").transact(f"submit_command {kind}", plan)
        log.info(
            "pipeline %s: command %d %s from %s", self._tables.pipeline, command_id, kind, issuer
        )
        return command_id

    def apply(self, command: int, epoch: int, offsets: Mapping[int, int]) -> bool:
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

    def reject(self, command: int, reason: str) -> bool:
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
        self,
        command: int,
        outcome: str,
        resolve: Callable[[Command], Command],
        *,
        expected: str = "pending",
    ) -> bool:
        command_id = check_int(command, what="command", minimum=1)

        def plan(snapshot: Snapshot) -> Change[bool]:
            rows = snapshot.read(pc.field("id") == command_id).to_pylist()
            if not rows:
                raise StateRecordNotFoundError(
                    f"command {command_id} does not exist in {self._tables.uri('commands')}"
                )
            current = command_from_row(rows[0])
            if current.status != expected:
                return Change(False)
            resolved = resolve(current)
            return Change(
                True, upsert(rows_table(SCHEMAS["commands"], [command_to_row(resolved)]), ("id",))
            )

        done = self._tables.table("commands").transact(f"command {command_id} {outcome}", plan)
        if done:
            log.info("pipeline %s: command %d %s", self._tables.pipeline, command_id, outcome)
        else:
            log.info(
                "pipeline %s: command %d was no longer %s; not %s",
                self._tables.pipeline,
                command_id,
                expected,
                outcome,
            )
        return done

    def get(self, command: int) -> Command:
        """The command ``command``; :class:`~modeswitch.errors.StateRecordNotFoundError` if
        none."""
        command_id = check_int(command, what="command", minimum=1)
        rows = self._tables.table("commands").read(pc.field("id") == command_id).to_pylist()
        if not rows:
            raise StateRecordNotFoundError(
                f"command {command_id} does not exist in {self._tables.uri('commands')}"
            )
        return command_from_row(rows[0])

    def list(self, status: str | None = None, *, last: int | None = None) -> list[Command]:
        """Commands in submission order, optionally only those with ``status``, or only the
        ``last`` ones submitted.

        The table keeps every command (maintenance adds one an hour), so a stream's poll for
        pending commands, twice a second, must not read them all: the ids and statuses are
        read first (two small columns), then only the rows wanted."""
        table = self._tables.table("commands")
        if status is None and last is None:
            rows = table.read().to_pylist()
            return sorted((command_from_row(row) for row in rows), key=lambda c: c.id)
        keys = table.read(columns=["id", "status"])
        if status is not None:
            check_choice(status, COMMAND_STATUSES, what="command status")
            keys = keys.filter(pc.field("status") == status)
        ids = sorted(keys.column("id").to_pylist())
        if last is not None:
            ids = ids[-check_int(last, what="last", minimum=1) :]
        if not ids:
            return []
        where = (pc.field("id") >= ids[0]) & (pc.field("id") <= ids[-1])
        rows = table.read(where, match=pc.field("id").isin(ids)).to_pylist()
        return sorted((command_from_row(row) for row in rows), key=lambda c: c.id)

    def claim_backfill(
        self,
        args: Mapping[str, Any],
        *,
        run_id: str,
        issuer: str,
        overlaps: Callable[[Mapping[str, Any]], bool],
        stale_after: timedelta,
    ) -> int:
        """Record a backfill run as a ``running`` ``backfill`` command and return its id, or
        the id it already holds (a retried task of the same ``run_id`` re-attaches).

        Refused with :class:`~modeswitch.errors.BackfillRefusedError`, nothing written, while
        another run holds a window that ``overlaps`` (called with that run's args) and its
        claim is younger than ``stale_after``; an older claim (its run died without
        finishing) is marked rejected, superseded by this one. The check and the insert are
        one commit of the commands table, so of two runs racing for one window one wins.
        """

        def refuse(held: Command, args: Mapping[str, Any]) -> Exception:
            return BackfillRefusedError(
                f"backfill {describe_backfill(args)} refused: run "
                f"{held.args.get('run_id')!r} (command {held.id}, started "
                f"{held.created_at.isoformat()}) is backfilling "
                f"{describe_backfill(held.args)}, which overlaps it"
            )

        command_id = self._claim_run(
            "backfill", args, run_id, issuer, overlaps, stale_after=stale_after, refuse=refuse
        )
        log.info(
            "pipeline %s: backfill command %d %s (run %s)",
            self._tables.pipeline,
            command_id,
            describe_backfill(args),
            run_id,
        )
        return command_id

    def claim_maintenance(self, *, run_id: str, issuer: str, lease: timedelta) -> int:
        """Take the pipeline's maintenance lease: a ``running`` ``maintain`` command, whose
        id this returns (the id it already holds for a retried ``run_id``). Refused with
        :class:`~modeswitch.errors.MaintenanceRefusedError`, nothing written, while another
        run holds a lease younger than ``lease``; an older one (its run died) is superseded.
        One commit of the commands table: of two runs starting at once, one holds it."""

        def refuse(held: Command, args: Mapping[str, Any]) -> Exception:
            return MaintenanceRefusedError(
                f"maintenance of pipeline {self._tables.pipeline!r} refused: run "
                f"{held.args.get('run_id')!r} (command {held.id}, started "
                f"{held.created_at.isoformat()}) holds the maintenance lease until "
                f"{(held.created_at + lease).isoformat()}"
            )

        return self._claim_run(
            "maintain", {}, run_id, issuer, lambda _: True, stale_after=lease, refuse=refuse
        )

    def _claim_run(
        self,
        kind: str,
        args: Mapping[str, Any],
        run_id: str,
        issuer: str,
        conflicts: Callable[[Mapping[str, Any]], bool],
        *,
        stale_after: timedelta,
        refuse: Callable[[Command, Mapping[str, Any]], Exception],
    ) -> int:
        run_id = check_text(run_id, what=f"{kind} run id", allow_empty=False)
        issuer = check_text(issuer, what="command issuer", allow_empty=False)
        stored_args = json_roundtrip({**args, "run_id": run_id}, what=f"{kind} command args")
        now = utc_now()

        def plan(snapshot: Snapshot) -> Change[int]:
            table = snapshot.read()
            running = [
                command_from_row(row)
                for row in table.filter(
                    (pc.field("kind") == kind) & (pc.field("status") == "running")
                ).to_pylist()
            ]
            superseded = []
            for held in running:
                if held.args.get("run_id") == run_id:
                    return Change(held.id)
                if not conflicts(held.args):
                    continue
                if now - held.created_at < stale_after:
                    raise refuse(held, stored_args)
                superseded.append(
                    replace(
                        held,
                        status="rejected",
                        rejected_at=now,
                        reason=f"superseded by run {run_id!r}: no end recorded after {stale_after}",
                    )
                )
            command = Command(
                id=max(table.column("id").to_pylist(), default=0) + 1,
                kind=kind,  # type: ignore[arg-type]
                args=stored_args,
                issuer=issuer,
                status="running",
                created_at=now,
            )
            rows = rows_table(
                SCHEMAS["commands"], [command_to_row(c) for c in [*superseded, command]]
            )
            return Change(command.id, upsert(rows, ("id",), insert_missing=True))

        return self._tables.table("commands").transact(f"claim_{kind}", plan)

    def finish_backfill(self, command: int, *, error: str | None = None, **outcome: Any) -> bool:
        """Mark a running backfill ``applied`` (its ``outcome``, e.g. records and sink version,
        joins its args) or, with ``error``, ``rejected`` saying why. True if this call ended
        it, False if it was no longer running (superseded by a later run of its window).
        A maintenance run ends the same way (:meth:`finish_run`)."""
        now = utc_now()

        def finish(current: Command) -> Command:
            if error is not None:
                return replace(current, status="rejected", rejected_at=now, reason=error)
            args = json_roundtrip({**current.args, **outcome}, what="backfill outcome")
            return replace(current, status="applied", applied_at=now, args=args)

        return self._resolve_command(
            command, "rejected" if error else "applied", finish, expected="running"
        )

    finish_run = finish_backfill

    def note_run(self, command: int, **outcome: Any) -> bool:
        """Add ``outcome`` to a running run's args while it runs (what it must not lose if it
        dies before it ends). False, nothing written, if it no longer holds its claim."""

        def note(current: Command) -> Command:
            return replace(current, args=json_roundtrip({**current.args, **outcome}, what="run"))

        return self._resolve_command(command, "noted", note, expected="running")

    def log_summaries(self) -> list[LogSummary]:
        """What maintenance runs kept of the sink's log before cleaning it, oldest first
        (:mod:`modeswitch.sinks.history`): what the exactly-once audit reads in its place.
        A run that died after keeping its summary counts too."""
        rows = self._tables.table("commands").read(match=pc.field("kind") == "maintain")
        found = []
        for command in map(command_from_row, rows.to_pylist()):
            raw = command.args.get("log_summary")
            if raw is not None:
                found.append(LogSummary.from_dict(raw))
        return sorted(found, key=lambda s: s.through)

    def pending(self) -> list[Command]:
        """Commands waiting for a commit boundary, oldest first."""
        return self.list("pending")

    def acknowledge_rewind(self, commit: SinkCommit) -> bool:
        """Mark the rewind command of sink commit ``commit`` applied, with the commit's epoch
        and end offsets: the one outcome both ``decide`` and
        :func:`~modeswitch.state.reconcile` record. True if this call applied it."""
        if not commit.is_rewind or commit.command is None:
            raise InvalidStateInputError(f"sink commit {commit!r} is not a rewind")
        return self.apply(commit.command, max(commit.epoch, 1), commit.end)


# --- helpers ---------------------------------------------------------------------------------


def describe_backfill(args: Mapping[str, Any]) -> str:
    """``reprocess [start, end)`` of a backfill command's args, for messages."""
    buckets = args.get("buckets")
    which = f" buckets {buckets}" if buckets else ""
    return f"{args.get('mode')} [{args.get('start')}, {args.get('end')}){which}"
