"""When to run BATCH and when to run STREAM: backlog strategies, OR-combined, with hysteresis.

Every function here is pure: it takes plain values (offsets maps, timezone-aware datetimes,
thresholds, the clock value ``now``, the previous :class:`PolicyState`) and returns a value.
No I/O, no global clock: the Airflow ``decide`` task and the stream job's exit test call the
same :func:`decide_mode` with what they observed, and persist the returned state.

Strategies (Flink FLIP-328), each returning a :class:`Signal` (backlog true / false / no
opinion, with a reason):

- :func:`offset_boundary_signal`: in a batch epoch, some bucket is still below its boundary.
- :func:`watermark_lag_signal`: now - watermark exceeds a threshold; the watermark is the
  minimum over non-idle buckets of the max committed event time, minus the allowed lateness;
  an idle source is not backlog.
- :func:`offset_lag_signal`: records behind the latest offsets (total or worst bucket)
  exceed a threshold.

:func:`combine_signals` ORs them. :func:`decide_mode` adds what FLIP-328 leaves out, switching
back: stream -> batch only after the backlog signal has held for ``enter_dwell`` with watermark
lag above ``enter_threshold``; batch -> stream once the backlog is drained and watermark lag is
at most ``exit_threshold``; never sooner than the minimum time in the current mode. An
operator command overrides all of it, and the decision says so.

Why one module of ~600 lines: the strategies, the watermark, the hysteresis and the decision
record are one decision, read together when a threshold is tuned; every function is pure and
tested one scenario at a time (tests/unit/test_policy.py), and none is used elsewhere alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from modeswitch.control.settings import (
    PolicySettings,
    parse_threshold_count,
    parse_threshold_duration,
)
from modeswitch.errors import ConfigError, InvalidTimestampError
from modeswitch.offsets import OffsetsMap, offsets_from_dict, offsets_to_dict

log = logging.getLogger(__name__)

Mode = Literal["batch", "stream", "paused"]
CommandAction = Literal["force_batch", "force_stream", "pause", "resume"]
WatermarkState = Literal["defined", "undefined", "idle"]

_COMMAND_MODES: dict[str, Mode] = {
    "force_batch": "batch",
    "force_stream": "stream",
    "pause": "paused",
}
RESUME = "resume"
"""The command that lifts a pause: the policy decides again. Nothing else does."""


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
        return f"watermark lag {_fmt(self.lag)} (held by bucket {self.holding_bucket})"


@dataclass(frozen=True)
class Observation:
    """What the caller observed, as plain values; the inputs of :func:`decide_mode`.

    - ``now``: the clock value, timezone-aware (UTC).
    - ``committed``: per bucket, the end of the contiguous range in the sink.
    - ``latest``: per bucket, the source's latest offset (next offset to be written).
    - ``boundary``: the running or just-ended batch epoch's boundary; None outside batch.
    - ``max_event_time``: per bucket, the max event time among committed records (buckets
      with nothing committed are absent).
    - ``last_data_at``: per bucket, when new data last arrived in the source (buckets that
      never had data are absent).

    Offsets maps are validated (string or int keys); datetimes must be timezone-aware.
    """

    now: datetime
    committed: Mapping[int, int]
    latest: Mapping[int, int]
    boundary: Mapping[int, int] | None = None
    max_event_time: Mapping[int, datetime] = field(default_factory=dict)
    last_data_at: Mapping[int, datetime] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _require_aware(self.now, what="now")
        set_ = object.__setattr__
        set_(self, "committed", offsets_from_dict(self.committed, source="committed"))
        set_(self, "latest", offsets_from_dict(self.latest, source="latest"))
        if self.boundary is not None:
            set_(self, "boundary", offsets_from_dict(self.boundary, source="boundary"))
        set_(self, "max_event_time", _times(self.max_event_time, what="max_event_time"))
        set_(self, "last_data_at", _times(self.last_data_at, what="last_data_at"))

    def to_record(self) -> dict[str, Any]:
        """JSON-safe form: ISO-8601 timestamps, offsets maps with string keys."""
        return {
            "now": self.now.isoformat(),
            "committed": offsets_to_dict(self.committed),
            "latest": offsets_to_dict(self.latest),
            "boundary": None if self.boundary is None else offsets_to_dict(self.boundary),
            "max_event_time": {str(b): t.isoformat() for b, t in self.max_event_time.items()},
            "last_data_at": {str(b): t.isoformat() for b, t in self.last_data_at.items()},
        }


@dataclass(frozen=True)
class PolicyState:
    """What hysteresis remembers between decisions; callers persist it and pass it back.

    ``mode_since`` is when ``mode`` was entered; ``backlog_since`` is since when the enter
    condition (backlog signal, with watermark lag above ``enter_threshold``) has held without
    a break, or None.
    """

    mode: Mode
    mode_since: datetime
    backlog_since: datetime | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("batch", "stream", "paused"):
            raise ConfigError(f"mode: {self.mode!r} is not one of batch, stream, paused")
        _require_aware(self.mode_since, what="mode_since")
        if self.backlog_since is not None:
            _require_aware(self.backlog_since, what="backlog_since")

    def to_record(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {
            "mode": self.mode,
            "mode_since": self.mode_since.isoformat(),
            "backlog_since": None if self.backlog_since is None else self.backlog_since.isoformat(),
        }


@dataclass(frozen=True)
class OperatorCommand:
    """An operator's standing override; ``note`` (who and why) is recorded in the reason."""

    action: CommandAction
    note: str = ""

    def __post_init__(self) -> None:
        if self.action not in (*_COMMAND_MODES, RESUME):
            actions = ", ".join(sorted((*_COMMAND_MODES, RESUME)))
            raise ConfigError(f"command: {self.action!r} is not one of {actions}")


@dataclass(frozen=True)
class Decision:
    """The mode to run, why, and everything the decision used.

    ``state`` is the state to persist and pass back as ``previous`` next time; ``switched``
    tells whether the mode differs from the previous one (a first decision is a switch).
    """

    mode: Mode
    reason: str
    switched: bool
    state: PolicyState
    previous: PolicyState | None
    command: OperatorCommand | None
    signals: tuple[Signal, ...]
    combined: Signal
    watermark: Watermark
    observation: Observation

    def to_record(self) -> dict[str, Any]:
        """JSON-safe form for the decisions table and logs."""
        return {
            "mode": self.mode,
            "reason": self.reason,
            "switched": self.switched,
            "state": self.state.to_record(),
            "previous": None if self.previous is None else self.previous.to_record(),
            "command": None
            if self.command is None
            else {"action": self.command.action, "note": self.command.note},
            "signals": [
                {"strategy": s.strategy, "backlog": s.backlog, "reason": s.reason}
                for s in (*self.signals, self.combined)
            ],
            "watermark": {
                "state": self.watermark.state,
                "value": None if self.watermark.value is None else self.watermark.value.isoformat(),
                "lag_seconds": None
                if self.watermark.lag is None
                else self.watermark.lag.total_seconds(),
                "holding_bucket": self.watermark.holding_bucket,
                "idle_buckets": sorted(self.watermark.idle_buckets),
            },
            "observation": self.observation.to_record(),
        }


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
    _require_aware(now, what="now")
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
    return Signal(name, backlog, f"{watermark.describe()} {relation} {_fmt(threshold)}")


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
    lag = _offset_lag(committed, latest)
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


# --- the decision ----------------------------------------------------------------------------


def decide_mode(
    observation: Observation,
    *,
    settings: PolicySettings,
    previous: PolicyState | None = None,
    command: OperatorCommand | None = None,
) -> Decision:
    """The mode to run now: the one function the Airflow ``decide`` task and the stream job
    both call. Pure: everything it uses is in its arguments, and it is all in the result.

    1. A ``command`` decides, whatever the signals (``pause`` gives mode ``"paused"``); a
       ``resume`` lifts a pause and leaves the choice to the rules below.
    2. Paused, the pipeline stays paused until a ``resume`` (or another command) comes.
    3. With no previous state, or resumed after a pause: batch if the enter condition
       (backlog signal and watermark lag above ``enter_threshold``) holds now, else stream.
       No dwell: there is nothing to flap from.
    4. In stream: switch to batch once the enter condition has held for ``enter_dwell``
       and the stream has run for ``min_time_in_stream``.
    5. In batch: switch to stream once the backlog is drained (no strategy says backlog, so
       the epoch's boundary is reached), watermark lag is at most ``exit_threshold`` and the
       batch mode has lasted ``min_time_in_batch``.

    ``previous`` is the state returned by the last decision; the new one is in the result.
    """
    obs = observation
    now = obs.now
    unread = _offset_lag(obs.committed, obs.latest)
    signals = (
        offset_boundary_signal(obs.committed, obs.boundary),
        watermark_lag_signal(
            now,
            max_event_time=obs.max_event_time,
            last_data_at=obs.last_data_at,
            threshold=settings.watermark_lag_threshold,
            idle_timeout=settings.idle_timeout,
            allowed_lateness=settings.allowed_lateness,
            unread=unread,
        ),
        offset_lag_signal(
            obs.committed,
            obs.latest,
            threshold=settings.offset_lag_threshold,
            measure=settings.offset_lag_measure,
        ),
    )
    combined = combine_signals(signals)
    watermark = compute_watermark(
        now,
        max_event_time=obs.max_event_time,
        last_data_at=obs.last_data_at,
        idle_timeout=settings.idle_timeout,
        allowed_lateness=settings.allowed_lateness,
        unread=unread,
    )

    lag_high = settings.enter_threshold is None or watermark.lag_above(settings.enter_threshold)
    entering = combined.backlog is True and lag_high
    if not entering:
        backlog_since = None
    elif previous is not None and previous.backlog_since is not None:
        backlog_since = previous.backlog_since
    else:
        backlog_since = now

    mode, reason = _choose(obs, settings, previous, command, combined, watermark, backlog_since)
    switched = previous is None or previous.mode != mode
    state = PolicyState(
        mode=mode,
        mode_since=now if switched or previous is None else previous.mode_since,
        backlog_since=backlog_since,
    )
    if switched:
        log.info("mode %s -> %s: %s", previous.mode if previous else None, mode, reason)
    return Decision(
        mode=mode,
        reason=reason,
        switched=switched,
        state=state,
        previous=previous,
        command=command,
        signals=signals,
        combined=combined,
        watermark=watermark,
        observation=obs,
    )


def _choose(
    obs: Observation,
    settings: PolicySettings,
    previous: PolicyState | None,
    command: OperatorCommand | None,
    combined: Signal,
    watermark: Watermark,
    backlog_since: datetime | None,
) -> tuple[Mode, str]:
    now = obs.now
    backlog = combined.backlog is True
    note = f" ({command.note})" if command is not None and command.note else ""
    if command is not None and command.action != RESUME:
        policy_view = "backlog" if backlog else "no backlog"
        return (
            _COMMAND_MODES[command.action],
            f"operator command {command.action}{note} overrides the policy "
            f"(signals: {policy_view}; {combined.reason})",
        )
    if previous is not None and previous.mode == "paused" and command is None:
        return "paused", "paused by an operator's command until a resume"

    enter = settings.enter_threshold
    if previous is None or previous.mode == "paused":
        start = "first decision" if previous is None else f"resumed after pause{note}"
        if backlog_since is not None:
            return "batch", f"{start}: backlog ({combined.reason})"
        if backlog:
            return "stream", (
                f"{start}: backlog signal but {watermark.describe()} not above "
                f"enter_threshold {_fmt(enter)}"
            )
        return "stream", f"{start}: no backlog ({combined.reason})"

    in_mode = now - previous.mode_since
    if previous.mode == "stream":
        if backlog_since is None:
            if backlog:
                return "stream", (
                    f"backlog signal but {watermark.describe()} not above enter_threshold "
                    f"{_fmt(enter)}"
                )
            return "stream", f"no backlog ({combined.reason})"
        held = now - backlog_since
        if held < settings.enter_dwell:
            return "stream", (
                f"backlog for {_fmt(held)}, less than enter_dwell {_fmt(settings.enter_dwell)} "
                f"({combined.reason})"
            )
        if in_mode < settings.min_time_in_stream:
            return "stream", (
                f"backlog for {_fmt(held)}, but in stream for {_fmt(in_mode)}, less than "
                f"min_time_in_stream {_fmt(settings.min_time_in_stream)}"
            )
        return "batch", (
            f"backlog held for {_fmt(held)} (enter_dwell {_fmt(settings.enter_dwell)}): "
            f"{combined.reason}"
        )

    # batch
    if backlog:
        return "batch", f"backlog not drained: {combined.reason}"
    exit_ = settings.exit_threshold
    if exit_ is not None and not watermark.lag_at_most(exit_):
        return "batch", (
            f"backlog drained but {watermark.describe()} above exit_threshold {_fmt(exit_)}"
        )
    if in_mode < settings.min_time_in_batch:
        return "batch", (
            f"backlog drained, but in batch for {_fmt(in_mode)}, less than min_time_in_batch "
            f"{_fmt(settings.min_time_in_batch)}"
        )
    return "stream", f"backlog drained and {watermark.describe()}: {combined.reason}"


# --- internals -------------------------------------------------------------------------------


def _offset_lag(committed: Mapping[int, int], latest: Mapping[int, int]) -> OffsetsMap:
    committed = offsets_from_dict(committed, source="committed")
    latest = offsets_from_dict(latest, source="latest")
    return {b: max(0, end - committed.get(b, 0)) for b, end in latest.items()}


def _require_aware(value: Any, *, what: str) -> None:
    if not isinstance(value, datetime):
        raise InvalidTimestampError(f"{what}: {value!r} is not a datetime")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidTimestampError(
            f"{what}: {value!r} is naive; pass a timezone-aware UTC datetime"
        )


def _times(values: Mapping[Any, datetime], *, what: str) -> dict[int, datetime]:
    if not isinstance(values, Mapping):
        raise InvalidTimestampError(
            f"{what}: expected a mapping of bucket -> datetime, got {values!r}"
        )
    result: dict[int, datetime] = {}
    for key, value in values.items():
        try:
            bucket = int(key)
        except (TypeError, ValueError) as exc:
            raise InvalidTimestampError(f"{what}: bucket {key!r} is not an integer") from exc
        _require_aware(value, what=f"{what} of bucket {bucket}")
        result[bucket] = value
    return dict(sorted(result.items()))


def _fmt(duration: timedelta | None) -> str:
    if duration is None:
        return "none"
    seconds = duration.total_seconds()
    if abs(seconds) < 120:
        return f"{seconds:g}s"
    if abs(seconds) < 7200:
        return f"{seconds / 60:g}m"
    return f"{seconds / 3600:g}h"
