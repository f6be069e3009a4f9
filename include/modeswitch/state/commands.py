"""The ``commands`` table: operator commands and how each was resolved."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pyarrow.compute as pc

from modeswitch.errors import InvalidStateInputError, StateRecordNotFoundError
from modeswitch.offsets import offsets_to_dict
from modeswitch.state.base import ControlState, _json_roundtrip
from modeswitch.state.codec import command_from_row, command_to_row
from modeswitch.state.records import (
    COMMAND_KINDS,
    COMMAND_STATUSES,
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


class CommandsState(ControlState):
    """Submitting, resolving and reading operator commands."""

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
