"""The backlog strategies (Flink FLIP-328) and the watermark one of them reads.

Each strategy is a pure function of plain values (offsets maps, timezone-aware datetimes,
thresholds, the clock value ``now``) returning a :class:`Signal` (backlog true / false / no
opinion, with a reason):

- :func:`offset_boundary_signal`: in a batch epoch, some bucket is still below its boundary.
- :func:`watermark_lag_signal`: now - watermark exceeds a threshold; the watermark
  (:func:`compute_watermark`) is the minimum over non-idle buckets of the max committed event
  time, minus the allowed lateness; an idle source is not backlog.
- :func:`offset_lag_signal`: records behind the latest offsets (total or worst bucket)
  exceed a threshold.

:func:`combine_signals` ORs them. What to do about the backlog (the hysteresis, an operator's
command) is :func:`modeswitch.control.policy.decide_mode`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from modeswitch.control.values import parse_threshold_count, parse_threshold_duration
from modeswitch.errors import ConfigError, InvalidTimestampError
from modeswitch.offsets import OffsetsMap, offsets_from_dict

WatermarkState = Literal["defined", "undefined", "idle"]


@dataclass(frozen=True)
class Signal:
    """One strategy's verdict: ``backlog`` is True, False, or None for "no opinion" (the
    strategy is off or has nothing to judge)."""

    strategy: str
    backlog: bool | None
    reason: str


@dataclass(frozen=True)
class Watermark:
    """The event-time watermark and its lag at ``now``.

    - ``state == "defined"``: ``value`` and ``lag`` are set; ``holding_bucket`` is the bucket
      whose event time sets the watermark.
    - ``state == "idle"``: every bucket is idle (or there is none): not backlog, lag None.
    - ``state == "undefined"``: a non-idle bucket has nothing committed yet, so the watermark
      cannot advance (Flink holds it at the minimum): counts as infinitely far behind;
      ``holding_bucket`` is that bucket.
    """

    state: WatermarkState
    value: datetime | None
    lag: timedelta | None
    holding_bucket: int | None
    idle_buckets: frozenset[int]

    def lag_above(self, threshold: timedelta) -> bool:
        """True if the lag exceeds ``threshold``; an undefined watermark always does, an idle
        source never does."""
        if self.state == "undefined":
            return True
        return self.lag is not None and self.lag > threshold

    def lag_at_most(self, threshold: timedelta) -> bool:
        """True if the lag is at most ``threshold``; an idle source always is, an undefined
        watermark never is."""
        if self.state == "idle":
            return True
        return self.lag is not None and self.lag <= threshold

    def describe(self) -> str:
        """A short phrase for decision reasons."""
        if self.state == "idle":
            return "source idle"
        if self.state == "undefined":
            return f"watermark undefined (bucket {self.holding_bucket} has nothing committed)"
        return f"watermark lag {describe_duration(self.lag)} (held by bucket {self.holding_bucket})"


# --- strategies ------------------------------------------------------------------------------


def offset_boundary_signal(
    committed: Mapping[int, int], boundary: Mapping[int, int] | None
) -> Signal:
    """Backlog while some bucket's committed offset is below its boundary (a batch epoch).

    No boundary (not in a batch epoch): no opinion. A bucket missing from ``committed`` is at 0.
    """
    name = "offset_boundary"
    if boundary is None:
        return Signal(name, None, "no batch epoch boundary")
    committed = offsets_from_dict(committed, source="committed")
    boundary = offsets_from_dict(boundary, source="boundary")
    behind = {
        b: end - committed.get(b, 0) for b, end in boundary.items() if committed.get(b, 0) < end
    }
    if not behind:
        return Signal(name, False, f"all {len(boundary)} buckets reached the boundary")
    worst = max(behind, key=lambda b: (behind[b], -b))
    return Signal(
        name,
        True,
        f"{len(behind)} of {len(boundary)} buckets below the boundary "
        f"({sum(behind.values())} records to go; bucket {worst} has {behind[worst]})",
    )


def compute_watermark(
    now: datetime,
    *,
    max_event_time: Mapping[int, datetime],
    last_data_at: Mapping[int, datetime],
    idle_timeout: timedelta | None,
    allowed_lateness: timedelta = timedelta(0),
    unread: Mapping[int, int] | None = None,
) -> Watermark:
    """The watermark over the buckets that have had data: the keys of ``max_event_time`` and
    ``last_data_at``, and the buckets with ``unread`` records.

    A bucket is idle when it has nothing unread (``unread``, if given, is 0 for it) and no new
    data arrived for at least ``idle_timeout`` (``None``: never idle; a bucket absent from
    ``last_data_at`` has had no new data). The watermark is the
    minimum over non-idle buckets of ``max_event_time``, minus ``allowed_lateness``; lag is
    ``now - watermark``. See :class:`Watermark` for the idle and undefined cases.
    """
    require_aware(now, what="now")
    unread = unread or {}
    buckets = sorted(
        set(max_event_time) | set(last_data_at) | {b for b, n in unread.items() if n > 0}
    )
    idle: set[int] = set()
    if idle_timeout is not None:
        for bucket in buckets:
            arrived = last_data_at.get(bucket)
            quiet = arrived is None or now - arrived >= idle_timeout
            if quiet and unread.get(bucket, 0) == 0:
                idle.add(bucket)
    active = [b for b in buckets if b not in idle]
    if not active:
        return Watermark("idle", None, None, None, frozenset(idle))
    missing = [b for b in active if b not in max_event_time]
    if missing:
        return Watermark("undefined", None, None, missing[0], frozenset(idle))
    holder = min(active, key=lambda b: (max_event_time[b], b))
    value = max_event_time[holder] - allowed_lateness
    return Watermark("defined", value, now - value, holder, frozenset(idle))


def watermark_lag_signal(
    now: datetime,
    *,
    max_event_time: Mapping[int, datetime],
    last_data_at: Mapping[int, datetime],
    threshold: timedelta | None,
    idle_timeout: timedelta | None,
    allowed_lateness: timedelta = timedelta(0),
    unread: Mapping[int, int] | None = None,
) -> Signal:
    """Backlog while watermark lag (now - watermark) exceeds ``threshold`` (FLIP-328).

    ``threshold`` None turns the strategy off (no opinion); otherwise it must be > 0
    (:class:`ConfigError`). An idle source is not backlog; an undefined watermark (a non-idle
    bucket with nothing committed) is. See :func:`compute_watermark` for the other arguments.
    """
    name = "watermark_lag"
    threshold = parse_threshold_duration(threshold, setting="watermark_lag_threshold")
    if threshold is None:
        return Signal(name, None, "strategy off (watermark_lag_threshold is None)")
    watermark = compute_watermark(
        now,
        max_event_time=max_event_time,
        last_data_at=last_data_at,
        idle_timeout=idle_timeout,
        allowed_lateness=allowed_lateness,
        unread=unread,
    )
    if watermark.state == "idle":
        return Signal(name, False, "source idle: every bucket is idle")
    backlog = watermark.lag_above(threshold)
    relation = "above" if backlog else "at most"
    return Signal(
        name, backlog, f"{watermark.describe()} {relation} {describe_duration(threshold)}"
    )


def offset_lag_signal(
    committed: Mapping[int, int],
    latest: Mapping[int, int],
    *,
    threshold: int | None,
    measure: Literal["total", "max_bucket"] = "total",
) -> Signal:
    """Backlog while the records behind ``latest`` exceed ``threshold``: summed over buckets
    (``measure="total"``) or in the worst bucket (``"max_bucket"``).

    ``threshold`` None turns the strategy off; otherwise it must be a whole number > 0
    (:class:`ConfigError`). A bucket missing from ``committed`` is at 0.
    """
    name = "offset_lag"
    threshold = parse_threshold_count(threshold, setting="offset_lag_threshold")
    if threshold is None:
        return Signal(name, None, "strategy off (offset_lag_threshold is None)")
    lag = offset_lag(committed, latest)
    if measure == "total":
        value, what = sum(lag.values()), "records behind in total"
    elif measure == "max_bucket":
        worst = max(lag, key=lambda b: (lag[b], -b), default=None)
        value = 0 if worst is None else lag[worst]
        what = f"records behind in bucket {worst}"
    else:
        raise ConfigError(f"offset_lag_measure: {measure!r} is not one of total, max_bucket")
    backlog = value > threshold
    relation = "above" if backlog else "at most"
    return Signal(name, backlog, f"{value} {what}, {relation} {threshold}")


def combine_signals(signals: Iterable[Signal]) -> Signal:
    """OR (FLIP-328): backlog if any strategy says backlog; not backlog if none does and at
    least one says not; no opinion if every strategy has none."""
    signals = tuple(signals)
    yes = [s for s in signals if s.backlog is True]
    if yes:
        return Signal("combined", True, "; ".join(f"{s.strategy}: {s.reason}" for s in yes))
    no = [s for s in signals if s.backlog is False]
    if no:
        return Signal("combined", False, "; ".join(f"{s.strategy}: {s.reason}" for s in no))
    return Signal("combined", None, "no strategy has an opinion")


def offset_lag(committed: Mapping[int, int], latest: Mapping[int, int]) -> OffsetsMap:
    """Per bucket of ``latest``, the records between ``committed`` (0 where missing) and it."""
    committed = offsets_from_dict(committed, source="committed")
    latest = offsets_from_dict(latest, source="latest")
    return {b: max(0, end - committed.get(b, 0)) for b, end in latest.items()}


def require_aware(value: Any, *, what: str) -> None:
    """An :class:`InvalidTimestampError` naming ``what`` unless ``value`` is a timezone-aware
    datetime."""
    if not isinstance(value, datetime):
        raise InvalidTimestampError(f"{what}: {value!r} is not a datetime")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidTimestampError(
            f"{what}: {value!r} is naive; pass a timezone-aware UTC datetime"
        )


def describe_duration(duration: timedelta | None) -> str:
    """A duration as decision reasons write it: seconds under 2 minutes, minutes under 2
    hours, else hours; ``None`` is ``none``."""
    if duration is None:
        return "none"
    seconds = duration.total_seconds()
    if abs(seconds) < 120:
        return f"{seconds:g}s"
    if abs(seconds) < 7200:
        return f"{seconds / 60:g}m"
    return f"{seconds / 3600:g}h"
