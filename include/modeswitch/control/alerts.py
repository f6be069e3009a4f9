"""Lag alerts: when to tell someone that a pipeline is behind, and that it caught up again.

Apart from the switching thresholds (which decide modes), the settings ``alert_watermark_lag``
and ``alert_offset_lag`` say how much lag is too much, and ``alert_after`` how long it must last
before anyone is told: a lag that crosses a threshold for a minute while a burst is drained is
not a page at 3 a.m. :func:`next_alert` is the state machine, one reading at a time:

- over a threshold, not yet alerted: the breach is noted from its first reading over; once it has
  lasted ``alert_after``, one ``breach`` event;
- over, alerted: nothing (however long it lasts, and whichever threshold is over);
- under, alerted: one ``recovery`` event;
- under, not alerted: the breach (if one had begun) is forgotten, nothing is said.

So each breach that lasts is told exactly twice, and a lag that flaps around a threshold for
less than ``alert_after`` never. The state is small and JSON (:meth:`AlertState.to_json`): the
``modeswitch_lag_alerts`` DAG keeps it in its task's XCom from one run to the next.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import pendulum

AlertEvent = Literal["breach", "recovery"]


@dataclass(frozen=True)
class AlertRules:
    """The alert settings of a pipeline: a threshold of None is off."""

    watermark_lag: timedelta | None
    offset_lag: int | None
    after: timedelta

    @classmethod
    def from_settings(cls, settings: Any) -> AlertRules:
        return cls(settings.alert_watermark_lag, settings.alert_offset_lag, settings.alert_after)

    @property
    def enabled(self) -> bool:
        return self.watermark_lag is not None or self.offset_lag is not None


@dataclass(frozen=True)
class AlertState:
    """Where the alert stands: since when the lag has been over (None: it is not), whether the
    notifiers were told of this breach, and why it is over (the first reading's reason)."""

    over_since: datetime | None = None
    alerted: bool = False
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "over_since": self.over_since.isoformat() if self.over_since else None,
            "alerted": self.alerted,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Any) -> AlertState:
        """The state a previous run kept; a fresh one for anything else (no previous run)."""
        if not isinstance(data, dict):
            return cls()
        since = data.get("over_since")
        return cls(
            pendulum.parse(since) if isinstance(since, str) else None,
            bool(data.get("alerted")),
            str(data.get("reason") or ""),
        )


def next_alert(
    rules: AlertRules, state: AlertState, now: datetime, over: str | None
) -> tuple[AlertState, AlertEvent | None]:
    """The state after a reading at ``now`` (``over``: why the lag is over a threshold, None if
    it is not), and the event to send, if any; see the module docstring."""
    if over is None:
        return AlertState(), ("recovery" if state.alerted else None)
    if state.over_since is None:
        state = AlertState(now, False, over)
    if not state.alerted and now - state.over_since >= rules.after:
        return AlertState(state.over_since, True, state.reason), "breach"
    return state, None


__all__ = ["AlertEvent", "AlertRules", "AlertState", "next_alert"]
