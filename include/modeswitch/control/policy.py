"""When to run BATCH and when to run STREAM: the backlog strategies' verdict, with hysteresis.

Every function here is pure: it takes plain values (offsets maps, timezone-aware datetimes,
thresholds, the clock value ``now``, the previous :class:`PolicyState`) and returns a value.
No I/O, no global clock: the Airflow ``decide`` task and the stream job's exit test call the
same :func:`decide_mode` with what they observed, and persist the returned state.

The strategies (Flink FLIP-328: offset boundary, watermark lag, offset lag) and their OR are
:mod:`modeswitch.control.backlog`. :func:`decide_mode` adds what FLIP-328 leaves out,
switching back: stream -> batch only after the backlog signal has held for ``enter_dwell``
with watermark lag above ``enter_threshold``; batch -> stream once the backlog is drained and
watermark lag is at most ``exit_threshold``; never sooner than the minimum time in the
current mode. An operator command overrides all of it, and the decision says so; the
:class:`Decision` records everything it used (tests/unit/test_policy.py, one scenario at a
time).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from modeswitch.control.backlog import (
    Signal,
    Watermark,
    combine_signals,
    compute_watermark,
    describe_duration,
    offset_boundary_signal,
    offset_lag,
    offset_lag_signal,
    require_aware,
    watermark_lag_signal,
)
from modeswitch.control.setting_groups import PolicySettings
from modeswitch.errors import ConfigError, InvalidTimestampError
from modeswitch.offsets import offsets_from_dict, offsets_to_dict

log = logging.getLogger(__name__)

Mode = Literal["batch", "stream", "paused"]
CommandAction = Literal["force_batch", "force_stream", "pause", "resume"]

_COMMAND_MODES: dict[str, Mode] = {
    "force_batch": "batch",
    "force_stream": "stream",
    "pause": "paused",
}
RESUME = "resume"
"""The command that lifts a pause: the policy decides again. Nothing else does."""


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
        require_aware(self.now, what="now")
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
        require_aware(self.mode_since, what="mode_since")
        if self.backlog_since is not None:
            require_aware(self.backlog_since, what="backlog_since")

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
    unread = offset_lag(obs.committed, obs.latest)
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
                f"enter_threshold {describe_duration(enter)}"
            )
        return "stream", f"{start}: no backlog ({combined.reason})"

    in_mode = now - previous.mode_since
    if previous.mode == "stream":
        if backlog_since is None:
            if backlog:
                return "stream", (
                    f"backlog signal but {watermark.describe()} not above enter_threshold "
                    f"{describe_duration(enter)}"
                )
            return "stream", f"no backlog ({combined.reason})"
        held = now - backlog_since
        if held < settings.enter_dwell:
            return "stream", (
                f"backlog for {describe_duration(held)}, less than enter_dwell "
                f"{describe_duration(settings.enter_dwell)} ({combined.reason})"
            )
        if in_mode < settings.min_time_in_stream:
            return "stream", (
                f"backlog for {describe_duration(held)}, but in stream for "
                f"{describe_duration(in_mode)}, less than min_time_in_stream "
                f"{describe_duration(settings.min_time_in_stream)}"
            )
        return "batch", (
            f"backlog held for {describe_duration(held)} "
            f"(enter_dwell {describe_duration(settings.enter_dwell)}): {combined.reason}"
        )

    # batch
    if backlog:
        return "batch", f"backlog not drained: {combined.reason}"
    exit_ = settings.exit_threshold
    if exit_ is not None and not watermark.lag_at_most(exit_):
        return "batch", (
            f"backlog drained but {watermark.describe()} above exit_threshold "
            f"{describe_duration(exit_)}"
        )
    if in_mode < settings.min_time_in_batch:
        return "batch", (
            f"backlog drained, but in batch for {describe_duration(in_mode)}, less than "
            f"min_time_in_batch {describe_duration(settings.min_time_in_batch)}"
        )
    return "stream", f"backlog drained and {watermark.describe()}: {combined.reason}"


# --- internals -------------------------------------------------------------------------------


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
        require_aware(value, what=f"{what} of bucket {bucket}")
        result[bucket] = value
    return dict(sorted(result.items()))
