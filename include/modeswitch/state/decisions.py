"""The ``decisions`` table: every policy evaluation, its outcome and inputs (the audit trail)."""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import numpy as np
import pendulum
import pyarrow as pa
import pyarrow.compute as pc

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
from modeswitch.state.tables import SCHEMAS, TIMESTAMP, Change, insert, rows_table

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

    def decisions(
        self,
        limit: int | None = None,
        *,
        offset: int = 0,
        since: datetime | None = None,
        until: datetime | None = None,
        inputs: bool = True,
    ) -> list[RecordedDecision]:
        """Recorded policy evaluations, newest first: the ``limit`` after the newest
        ``offset`` ones (all without ``limit``) of those made at or after ``since`` and at or
        before ``until``. Without ``inputs`` their inputs (the largest column) are neither
        read nor decoded: each decision's ``inputs`` is then ``{}``.

        Bounded by what it returns, not by the table: the times are read first (one column),
        and only the rows from the oldest wanted one on are read and decoded (compacted files
        hold row groups in time order, so older ones are skipped by their statistics)."""
        offset = check_int(offset, what="offset")
        table = self._table("decisions")
        low = None if since is None else check_timestamp(since, what="since")
        high = None if until is None else check_timestamp(until, what="until")
        if limit is not None:
            wanted = offset + check_int(limit, what="limit")
            if wanted == 0:
                return []
            times = table.read(columns=["at"]).column("at")
            if high is not None:
                times = times.filter(pc.less_equal(times, pa.scalar(high, TIMESTAMP)))
            times = times.to_numpy()
            if len(times) > wanted:
                oldest = np.partition(times, len(times) - wanted)[len(times) - wanted]
                at = pendulum.instance(oldest.astype("datetime64[us]").item(), tz="UTC")
                low = at if low is None else max(low, at)
        conditions = []
        if low is not None:
            conditions.append(pc.field("at") >= pa.scalar(low, TIMESTAMP))
        if high is not None:
            conditions.append(pc.field("at") <= pa.scalar(high, TIMESTAMP))
        where = functools.reduce(operator.and_, conditions) if conditions else None
        columns = None if inputs else [n for n in SCHEMAS["decisions"].names if n != "inputs"]
        rows = table.read(where, columns=columns)  # the scan applies ``where`` to the rows
        order = pc.sort_indices(rows, [("at", "descending")])
        end = None if limit is None else offset + limit
        picked = rows.take(order[offset:end]).to_pylist()
        return [decision_from_row(row if inputs else {**row, "inputs": "{}"}) for row in picked]

    def decision_count(self) -> int:
        """How many decisions are recorded (one column read)."""
        return self._table("decisions").read(columns=["at"]).num_rows

    def latest_decision(self) -> RecordedDecision | None:
        """The newest policy evaluation, or None before the first."""
        newest = self.decisions(limit=1)
        return newest[0] if newest else None

    # --- commands ----------------------------------------------------------------------------
