"""The ``decisions`` table: every policy evaluation, its outcome and inputs (the audit trail)."""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pendulum
import pyarrow as pa
import pyarrow.compute as pc

from modeswitch.errors import InvalidStateInputError
from modeswitch.state.base import StateTables, json_roundtrip
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
from modeswitch.state.tables import SCHEMAS, TIMESTAMP, Change, Snapshot, insert, rows_table

log = logging.getLogger(__name__)


class DecisionTable:
    """Recording and reading decisions (``store.decisions``)."""

    def __init__(self, tables: StateTables) -> None:
        self._tables = tables

    def record(
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
            inputs=json_roundtrip(inputs, what="decision inputs"),
            epoch=None if epoch is None else check_int(epoch, what="decision epoch", minimum=1),
            decided_by=check_text(decided_by, what="decided_by"),
        )
        rows = rows_table(SCHEMAS["decisions"], [decision_to_row(decision)])
        self._tables.table("decisions").transact(
            f"record_decision {decision.mode}", lambda _: Change(None, insert(rows))
        )
        return decision

    def record_beside_newest(
        self,
        reason: str,
        added: Mapping[str, Any],
        *,
        decided_by: str,
        first_mode: Callable[[], Mode],
        at: datetime | None = None,
    ) -> RecordedDecision:
        """A row that is not a policy evaluation (a lag alert, a schema change): under the
        newest decision's mode and with its inputs, ``added`` to them, so that what is read from
        the newest row (the policy's memory, a pause) stays as it was; ``first_mode()`` before
        any decision. No epoch: an epoch's end reason is its own decisions'."""
        latest = self.latest()
        return self.record(
            latest.mode if latest else first_mode(),
            reason,
            {**(latest.inputs if latest else {}), **added},
            at=at,
            decided_by=decided_by,
        )

    def list(
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

        Bounded by what it returns, not by the table: the times of the newest stretch are read
        first (one column; a stretch twice as long as needed, found from the newest time on and
        widened until it holds ``limit``), then only the rows from the oldest wanted one on
        (compacted files hold row groups in time order, so older ones are skipped by their
        statistics)."""
        offset = check_int(offset, what="offset")
        delta = self._tables.table("decisions").load()
        if delta is None:
            return []
        snapshot = Snapshot(delta)
        low = None if since is None else check_timestamp(since, what="since")
        high = None if until is None else check_timestamp(until, what="until")
        if limit is not None:
            wanted = offset + check_int(limit, what="limit")
            if wanted == 0:
                return []
            oldest = _oldest_of_newest(snapshot, wanted, high)
            if oldest is not None:
                low = oldest if low is None else max(low, oldest)
        conditions = []
        if low is not None:
            conditions.append(pc.field("at") >= pa.scalar(low, TIMESTAMP))
        if high is not None:
            conditions.append(pc.field("at") <= pa.scalar(high, TIMESTAMP))
        where = functools.reduce(operator.and_, conditions) if conditions else None
        columns = None if inputs else [n for n in SCHEMAS["decisions"].names if n != "inputs"]
        rows = snapshot.read(where, columns=columns)  # the scan applies ``where`` to the rows
        order = pc.sort_indices(rows, [("at", "descending")])
        end = None if limit is None else offset + limit
        picked = rows.take(order[offset:end]).to_pylist()
        return [decision_from_row(row if inputs else {**row, "inputs": "{}"}) for row in picked]

    def count(self) -> int:
        """How many decisions are recorded (one column read)."""
        return self._tables.table("decisions").read(columns=["at"]).num_rows

    def latest(self) -> RecordedDecision | None:
        """The newest policy evaluation, or None before the first."""
        newest = self.list(limit=1)
        return newest[0] if newest else None


_FIRST_STRETCH = timedelta(minutes=1)


def _oldest_of_newest(snapshot: Snapshot, wanted: int, high: datetime | None) -> Any:
    """The time of the ``wanted``-th newest decision at or before ``high`` (None: there are
    no more than ``wanted``). Reads the ``at`` column of a stretch back from the newest time,
    doubled until it holds ``wanted`` rows or reaches the oldest (file statistics give both
    ends); older row groups are never read."""
    actions = pa.table(snapshot.table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return None
    newest = pc.max(actions.column("max.at")).as_py()
    first = pc.min(actions.column("min.at")).as_py()
    if newest is None or first is None:
        return None
    top = newest if high is None else min(high, newest + timedelta(milliseconds=1))
    stretch = _FIRST_STRETCH
    while True:
        # Statistics are in milliseconds: a millisecond of slack at each end.
        start = top - stretch
        where = pc.field("at") >= pa.scalar(start - timedelta(milliseconds=1), TIMESTAMP)
        if high is not None:
            where = where & (pc.field("at") <= pa.scalar(high, TIMESTAMP))
        times = snapshot.read(where, columns=["at"]).column("at").to_numpy()
        if len(times) >= wanted:
            oldest = np.partition(times, len(times) - wanted)[len(times) - wanted]
            return pendulum.instance(oldest.astype("datetime64[us]").item(), tz="UTC")
        if start <= first:
            return None
        stretch *= 8
