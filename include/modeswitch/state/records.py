"""The rows of the control tables, as frozen dataclasses, and the checks their inputs pass.

Every timestamp is a timezone-aware UTC :class:`pendulum.DateTime`. Offsets maps are
``{bucket: offset}`` dicts in memory and JSON objects with string keys in the tables.
Every check raises an error that names the input and the bad value.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, Literal, get_args

import pendulum

from modeswitch.errors import InvalidStateInputError
from modeswitch.offsets import OffsetsMap, offsets_from_dict, offsets_from_json, offsets_to_json

Mode = Literal["batch", "stream"]
EpochStatus = Literal["running", "completed", "failed", "superseded"]
SplitStatus = Literal["pending", "committed", "replanned"]
CommandKind = Literal[
    "switch_to_batch", "switch_to_stream", "pause", "resume", "rewind", "backfill", "maintain"
]
CommandStatus = Literal["pending", "running", "applied", "rejected"]
"""``running``: a backfill run holding its window (backfills never wait in ``pending``)."""

MODES: tuple[str, ...] = get_args(Mode)
EPOCH_STATUSES: tuple[str, ...] = get_args(EpochStatus)
CLOSED_EPOCH_STATUSES: tuple[str, ...] = tuple(s for s in EPOCH_STATUSES if s != "running")
SPLIT_STATUSES: tuple[str, ...] = get_args(SplitStatus)
COMMAND_KINDS: tuple[str, ...] = get_args(CommandKind)
STREAM_EXIT = "stream-exit"
"""``decided_by`` of the decision a stream records when it stops (its reason, its end, and
the command it applied, if one stopped it)."""
RUN_KINDS: tuple[str, ...] = ("backfill", "maintain")
"""Kinds that are not queued for a pipeline but record a run of their own while it runs
(``running``), claimed when it starts: a backfill's window, the maintenance lease."""
COMMAND_STATUSES: tuple[str, ...] = get_args(CommandStatus)

# A split leaves "pending" once: committed by the sink, or replaced by a re-plan.
SPLIT_TRANSITIONS: frozenset[tuple[str, str]] = frozenset(
    {("pending", "committed"), ("pending", "replanned")}
)


# --- input checks ----------------------------------------------------------------------------


def check_choice(value: Any, choices: tuple[str, ...], *, what: str) -> str:
    """``value`` if it is one of ``choices``, else :class:`InvalidStateInputError`."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidStateInputError(f"{what}: {value!r} is not one of {', '.join(choices)}")
    return value


def check_int(value: Any, *, what: str, minimum: int = 0) -> int:
    """``value`` if it is an int (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidStateInputError(f"{what}: {value!r} is not an integer >= {minimum}")
    return value


def check_text(value: Any, *, what: str, allow_empty: bool = True) -> str:
    """``value`` if it is a string (non-empty unless ``allow_empty``)."""
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        kind = "a string" if allow_empty else "a non-empty string"
        raise InvalidStateInputError(f"{what}: {value!r} is not {kind}")
    return value


def check_offsets(value: Any, *, what: str) -> OffsetsMap:
    """A validated ``{bucket: offset}`` map (string or int keys accepted); raises
    :class:`~modeswitch.errors.InvalidOffsetsError` naming ``what``."""
    return offsets_from_dict(value, source=what)


def check_timestamp(value: Any, *, what: str) -> pendulum.DateTime:
    """A timezone-aware datetime, converted to UTC; naive datetimes are refused."""
    if not isinstance(value, datetime):
        raise InvalidStateInputError(f"{what}: {value!r} is not a datetime")
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise InvalidStateInputError(f"{what}: {value!r} is naive; give a timezone-aware time")
    return pendulum.instance(value).in_timezone("UTC")


def utc_now() -> pendulum.DateTime:
    """The current time, timezone-aware UTC, to the microsecond the tables store."""
    return pendulum.now("UTC")


def to_json(value: Any, *, what: str) -> str:
    """Compact, key-sorted JSON text; datetimes become ISO 8601, durations seconds.

    Refuses values JSON cannot hold (NaN, arbitrary objects) with an error naming ``what``.
    """
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), allow_nan=False, default=_json_default
        )
    except (TypeError, ValueError) as exc:
        raise InvalidStateInputError(f"{what}: not JSON-serialisable ({exc})") from exc


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, set | frozenset):
        return sorted(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{value!r} of type {type(value).__name__} is not JSON-serialisable")


def offsets_or_none(text: str | None, *, source: str) -> OffsetsMap | None:
    """Parse a nullable offsets column."""
    return None if text is None else offsets_from_json(text, source=source)


def json_or_none(offsets: Mapping[int, int] | None) -> str | None:
    """Serialise a nullable offsets map."""
    return None if offsets is None else offsets_to_json(offsets)


def as_utc(value: datetime | None) -> pendulum.DateTime | None:
    """A timestamp read back from Arrow, as a pendulum UTC time (None stays None)."""
    return None if value is None else pendulum.instance(value).in_timezone("UTC")


# --- rows ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Epoch:
    """One stretch of the pipeline in one mode (row of ``epochs``).

    ``start`` is where the epoch begins reading, per bucket; ``boundary`` (batch epochs only)
    where it must stop; ``end`` where it actually ended, once closed; ``max_event_time_us``
    the max event time (µs) per bucket of its sink commits, recorded when it closed (None for
    a running epoch, or one closed before it was recorded).
    """

    id: int
    mode: Mode
    reason: str
    status: EpochStatus
    started_at: pendulum.DateTime
    start: OffsetsMap
    boundary: OffsetsMap | None = None
    ended_at: pendulum.DateTime | None = None
    end: OffsetsMap | None = None
    end_reason: str | None = None
    max_event_time_us: dict[int, int] | None = None

    @property
    def running(self) -> bool:
        """True until the epoch is closed."""
        return self.status == "running"


@dataclass(frozen=True)
class LedgerSplit:
    """One split of a batch epoch's ledger (row of ``splits``): records ``[start, end)`` of
    ``bucket``, read in ``wave``."""

    epoch: int
    wave: int
    bucket: int
    start: int
    end: int
    status: SplitStatus
    recorded_at: pendulum.DateTime
    updated_at: pendulum.DateTime

    @property
    def key(self) -> tuple[int, int, int]:
        """``(bucket, start, end)``: what identifies a live split within its epoch."""
        return (self.bucket, self.start, self.end)


@dataclass(frozen=True)
class Progress:
    """One sink commit as the control state knows it (row of ``progress``).

    ``recorded_by`` is ``"sink"`` when the writer recorded it after its commit, or
    ``"reconcile"`` when :func:`~modeswitch.state.reconcile` repaired it from the sink's Delta log;
    ``"maintain"`` for a row that stands for ``commits`` consecutive commits of its epoch,
    merged past the progress horizon (:meth:`.ProgressTable.downsample`).
    """

    epoch: int
    sequence: int
    mode: Mode
    start: OffsetsMap
    end: OffsetsMap
    records: int
    max_event_time_us: dict[int, int]
    watermark: pendulum.DateTime | None
    committed_at: pendulum.DateTime | None
    sink_version: int | None
    recorded_at: pendulum.DateTime
    recorded_by: str
    commits: int = 1
    quarantined: int = 0
    """Records of the commit's range that went to the quarantine table, not in ``records``."""


@dataclass(frozen=True)
class RecordedDecision:
    """One policy evaluation (row of ``decisions``): the outcome and every input it used."""

    at: pendulum.DateTime
    mode: Mode
    reason: str
    switched: bool
    inputs: dict[str, Any]
    epoch: int | None
    decided_by: str


@dataclass(frozen=True)
class Command:
    """An operator's request to the running pipeline (row of ``commands``).

    It moves once, from ``pending`` to ``applied`` (with the epoch and offsets at which it took
    effect) or to ``rejected`` (with a reason). A ``backfill`` is recorded when its run starts,
    as ``running``, and moves once to ``applied`` or ``rejected`` (failed, or superseded by a
    later run of its window); it never waits in ``pending`` (:mod:`modeswitch.modes.backfill`).
    """

    id: int
    kind: CommandKind
    args: dict[str, Any]
    issuer: str
    status: CommandStatus
    created_at: pendulum.DateTime
    applied_at: pendulum.DateTime | None = None
    applied_epoch: int | None = None
    applied_offsets: OffsetsMap | None = None
    rejected_at: pendulum.DateTime | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Reconciliation:
    """What :func:`~modeswitch.state.reconcile` repaired: progress rows it inserted, as
    ``(epoch, sequence)``, the splits it marked committed, and the rewind commands it marked
    applied."""

    progress: tuple[tuple[int, int], ...] = ()
    splits: tuple[LedgerSplit, ...] = field(default_factory=tuple)
    rewinds: tuple[int, ...] = ()

    @property
    def repaired(self) -> bool:
        """True if anything was missing."""
        return bool(self.progress or self.splits or self.rewinds)
