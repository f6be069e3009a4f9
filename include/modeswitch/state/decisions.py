"""The ``decisions`` table: every policy evaluation, its outcome and inputs (the audit trail)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from modeswitch.errors import InvalidStateInputError
from modeswitch.state.base import ControlState, _json_roundtrip
from modeswitch.state.codec import decision_from_row, decision_to_row
from modeswitch.state.records import (
    MODES,
    Mode,
    RecordedDecision,
    check_choice,
    check_int,
    check_text,
    check_timestamp,
    utc_now,
)
from modeswitch.state.tables import SCHEMAS, Change, insert, rows_table

log = logging.getLogger(__name__)


class DecisionsState(ControlState):
    """Recording and reading decisions."""

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
