"""Watermark lag and offset lag of a pipeline now, from its control tables and its source.

What the lag sensor and its trigger watch. The same inputs as ``decide`` (committed offsets,
the latest offsets, the max event time committed per bucket) and the same watermark as the
policy (:func:`modeswitch.control.backlog.compute_watermark`); no Spark, a few milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

import pendulum

from modeswitch.control.backlog import compute_watermark
from modeswitch.control.settings import PipelineSettings
from modeswitch.runners.lifecycle import observe
from modeswitch.state import StateStore


@dataclass(frozen=True)
class LagReading:
    """Lag at ``at``. ``watermark_state`` is ``defined``, ``idle`` (no lag) or ``undefined``
    (a bucket with data has nothing committed: infinitely behind, as for the policy)."""

    at: datetime
    watermark_state: str
    watermark_lag: timedelta | None
    offset_lag: int

    def crosses(
        self, *, watermark_lag_threshold: timedelta | None, offset_lag_threshold: int | None
    ) -> str | None:
        """Why the lag crosses a threshold (a threshold of None is off), or None."""
        if watermark_lag_threshold is not None:
            if self.watermark_state == "undefined":
                return "watermark undefined (a bucket with data has nothing committed)"
            if self.watermark_lag is not None and self.watermark_lag > watermark_lag_threshold:
                return f"watermark lag {self.watermark_lag} > {watermark_lag_threshold}"
        if offset_lag_threshold is not None and self.offset_lag > offset_lag_threshold:
            return f"offset lag {self.offset_lag} records > {offset_lag_threshold}"
        return None

    def to_event(self) -> dict:
        """JSON-safe, for a TriggerEvent or an XCom."""
        return {
            "at": self.at.isoformat(),
            "watermark_state": self.watermark_state,
            "watermark_lag_seconds": (
                None if self.watermark_lag is None else self.watermark_lag.total_seconds()
            ),
            "offset_lag": self.offset_lag,
        }


def measure_lag(
    settings: PipelineSettings,
    *,
    now: datetime | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> LagReading:
    """The pipeline's watermark lag and total offset lag now (``storage_options``: the
    tables', None for the environment's)."""
    now = now or pendulum.now("UTC")
    store = StateStore.from_settings(settings, storage_options=storage_options)
    observation, committed = observe(settings, store, now)
    unread = {b: max(0, n - committed.get(b, 0)) for b, n in observation.latest.items()}
    watermark = compute_watermark(
        now,
        max_event_time=observation.max_event_time,
        last_data_at=observation.last_data_at,
        idle_timeout=settings.policy.idle_timeout,
        allowed_lateness=settings.policy.allowed_lateness,
        unread=unread,
    )
    return LagReading(now, watermark.state, watermark.lag, sum(unread.values()))
