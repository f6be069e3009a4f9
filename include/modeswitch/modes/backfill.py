"""Backfills: load or re-derive one event-time window of the log into the sink, beside the
live pipeline, in one Delta commit per table.

A backfill run (one run of the ``modeswitch_backfill`` DAG, or ``modeswitch backfill``) takes a
window ``[start, end)`` of event time and a mode:

- ``fill``: the records the live pipeline never read, those below where it started reading
  each bucket (a pipeline started with ``start_from = latest`` goes live at once and loads its
  history this way);
- ``reprocess``: the records the sink already holds, re-derived (after a transform fix).

**Which records belong to a window.** A record belongs to the window that holds its event
time, the ``event_time`` the sink and the quarantine hold for it: ``start <= event_time <
end``. That is the log's ``event_time``, or with ``event_time_field`` set the payload field's
time (:mod:`modeswitch.control.value_schema`: on every row whose value is a JSON object
holding one, quarantined or not; the log's elsewhere), a function of the record alone
(:class:`PayloadEventTime`). Its offset and when it arrived do not matter, so a late record
belongs to the window of its own event time, and each record to exactly one window of a
schedule. Per bucket the run considers offsets ``[lo, hi)``:

- ``lo``: the first retained offset whose event time is at or after ``start``, from the log's
  time index (:meth:`~modeswitch.sources.base.BucketedLog.offset_at`: the embedded log's
  row-group event-time statistics; Kafka's ``offsets_for_times``). No record below it belongs
  to the window. The log's index does not index a payload's time: with ``event_time_field``
  set, or a Kafka topic read with ``event_time=<field>``, ``lo`` is the earliest retained
  offset (a payload's time says nothing of where its record sits in the log).
- ``hi``: the bound: in ``reprocess`` the sink's committed offsets, in ``fill`` the offsets
  where the pipeline's oldest sink commit started (what the live pipeline will never read).
  Records above it are the live pipeline's.

A late record can sit anywhere above ``lo``, so there is no upper index: the whole
``[lo, hi)`` is read and filtered on event time (on the embedded log, Spark's Parquet reader
skips the row groups whose event-time statistics lie outside the window).

**The write** (:mod:`modeswitch.modes.backfill_job`): the batch engine reads those records, runs the
pipeline's transform, keeps the rows whose (transformed) event time is in the window, and ONE
Delta replace-where commit per table replaces what the table holds at those positions
(:func:`window_predicate`), under :data:`~modeswitch.sinks.history.BACKFILL_KEY`
(:class:`~modeswitch.modes.backfill_commits.BackfillCommit`), beside the live pipeline's
commits. A record is deleted only to be written again: before committing, the job checks that
every row the predicate would delete is among the rows it writes, and that no row it writes is
held already outside the window (:func:`~modeswitch.modes.backfill_job.check_replace_is_exact`);
a table whose rows got their event time by another rule (``event_time_field`` changed since
they were written) fails that check, and the run is refused with nothing written. Nothing of
the live pipeline (committed offsets, fencing, the watermark) sees a backfill commit;
``modeswitch verify`` counts the filled windows
(:func:`~modeswitch.modes.backfill_commits.backfilled_positions`, by the rule each fill
recorded).

**Guards**, before anything is written (:class:`~modeswitch.errors.BackfillRefusedError`): a
window that ends in the future, a window whose records may have been dropped by retention, a
pipeline with nothing in its sink, unknown buckets, and a run whose window overlaps one that
another run is backfilling (the ``backfill`` command it recorded, :meth:`claim_backfill`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

import pendulum

from modeswitch.control.settings import PipelineSettings
from modeswitch.control.value_schema import (
    SCHEMA_TRANSFORM,
    find_event_time_field,
    parse_value_schema,
)
from modeswitch.errors import BackfillRefusedError
from modeswitch.sinks.commits import sink_commits
from modeswitch.sources import open_log
from modeswitch.sources.base import BucketedLog
from modeswitch.state import StateStore
from modeswitch.state.records import Command
from modeswitch.state.tables import sql_timestamp

log = logging.getLogger(__name__)

BackfillMode = Literal["fill", "reprocess"]
BACKFILL_MODES: tuple[str, ...] = get_args(BackfillMode)
CLAIM_EXPIRES = timedelta(hours=4)
"""A ``running`` backfill older than this (its job's timeout is 3 h) no longer holds its
window: its run died without recording an end."""


@dataclass(frozen=True)
class Window:
    """An event-time window ``[start, end)``, both aware UTC."""

    start: datetime
    end: datetime

    @classmethod
    def parse(cls, start: Any, end: Any) -> Window:
        """A window from datetimes or ISO-8601 strings; :class:`BackfillRefusedError` naming
        the bad value otherwise."""

        def moment(value: Any, what: str) -> pendulum.DateTime:
            if isinstance(value, datetime):
                return pendulum.instance(value).in_timezone("UTC")
            try:
                parsed = pendulum.parse(str(value), strict=False)
            except (ValueError, TypeError) as exc:  # pendulum's ParserError is a ValueError
                raise BackfillRefusedError(f"window {what} {value!r}: not a date-time") from exc
            if not isinstance(parsed, datetime):
                raise BackfillRefusedError(f"window {what} {value!r}: not a date-time")
            return parsed.in_timezone("UTC")

        window = cls(moment(start, "start"), moment(end, "end"))
        if window.start >= window.end:
            raise BackfillRefusedError(
                f"window [{window.start.isoformat()}, {window.end.isoformat()}): the start is "
                "not before the end"
            )
        return window

    def overlaps(self, other: Window) -> bool:
        return self.start < other.end and other.start < self.end

    def __str__(self) -> str:
        return f"[{self.start.isoformat()}, {self.end.isoformat()})"


def backfill_app_id(pipeline: str, window: Window) -> str:
    """The Delta app-transaction id of a pipeline's backfill commits of one window: runs of
    other windows commit at the same time without fencing each other out."""
    return f"{pipeline}/backfill/{sql_timestamp(window.start)}/{sql_timestamp(window.end)}"


@dataclass(frozen=True)
class PayloadEventTime:
    """The rule ``event_time_field`` gives a record's event time by: the payload ``field``'s
    time (``kind``: ``timestamp``, or ``long`` epoch milliseconds) where the value is a JSON
    object holding one, the log's elsewhere. A function of the record and this rule alone,
    so that a backfill and the audit match records to windows without the pipeline's
    schema; each backfill plan and commit records it."""

    field: str
    kind: str

    @classmethod
    def of(cls, settings: PipelineSettings) -> PayloadEventTime | None:
        """The settings' rule; None when the event time is the log's."""
        if settings.transform != SCHEMA_TRANSFORM:
            return None
        found = find_event_time_field(
            parse_value_schema(settings.value_schema), settings.event_time_field
        )
        return None if found is None else cls(found.name, found.type)

    @classmethod
    def parse(cls, body: Any) -> PayloadEventTime | None:
        return None if not body else cls(str(body["field"]), str(body["type"]))

    def to_json(self) -> dict[str, str]:
        return {"field": self.field, "type": self.kind}

    def times(self, batch: Any) -> Any:
        """The event times of a batch of log records (``value`` and ``event_time``)."""
        from modeswitch.transforms.arrow import payload_event_times

        return payload_event_times(
            batch.column("value"), batch.column("event_time"), field=self.field, kind=self.kind
        )

    def __str__(self) -> str:
        return f"event_time_field={self.field!r} ({self.kind})"


def event_times(batch: Any, rule: PayloadEventTime | None) -> Any:
    """The event times of a batch of log records by ``rule`` (None: the log's)."""
    return batch.column("event_time") if rule is None else rule.times(batch)


@dataclass(frozen=True)
class BackfillPlan:
    """A claimed backfill run: what the job reads and replaces."""

    pipeline: str
    command: int
    run_id: str
    mode: BackfillMode
    window: Window
    ranges: dict[int, tuple[int, int]]
    """Per bucket, ``[lo, hi)``: the offsets that may hold a record of the window."""
    event_time: PayloadEventTime | None = None
    """The rule of the records' event time when it is a payload field's; None: the log's."""

    @classmethod
    def of(cls, pipeline: str, command: Command) -> BackfillPlan:
        args = command.args
        return cls(
            pipeline=pipeline,
            command=command.id,
            run_id=str(args["run_id"]),
            mode=args["mode"],
            window=Window.parse(args["start"], args["end"]),
            ranges={int(b): (int(lo), int(hi)) for b, (lo, hi) in args["ranges"].items()},
            event_time=PayloadEventTime.parse(args.get("event_time")),
        )

    @property
    def records_bound(self) -> int:
        """An upper bound of the records read (offsets may have gaps)."""
        return sum(hi - lo for lo, hi in self.ranges.values())

    def predicate(self) -> str:
        return window_predicate(self.window, self.ranges)


# --- window -> offset ranges -------------------------------------------------------------------


def window_ranges(
    source: BucketedLog,
    window: Window,
    bound: Mapping[int, int],
    *,
    buckets: Iterable[int] | None = None,
    indexed: bool = True,
) -> dict[int, tuple[int, int]]:
    """Per bucket, ``[lo, hi)``: the offsets below ``bound`` that may hold a record of
    ``window`` (the module docstring's rule). Buckets with nothing there are left out, and so
    are buckets missing from ``bound``. ``indexed=False``: the log's time index does not index
    the event time (a Kafka JSON field), so ``lo`` is the earliest retained offset."""
    earliest = source.earliest_offsets()
    floor = source.offset_at(window.start) if indexed else earliest
    chosen = source.buckets() if buckets is None else sorted(set(buckets))
    ranges = {}
    for bucket in chosen:
        if bucket not in bound:
            continue
        lo = max(floor.get(bucket, 0), earliest.get(bucket, 0))
        hi = bound[bucket]
        if lo < hi:
            ranges[bucket] = (lo, hi)
    return ranges


def window_predicate(window: Window, ranges: Mapping[int, tuple[int, int]]) -> str:
    """The replace-where predicate of a backfill: the window's event times within each
    bucket's range. The event-time bounds also keep live files (recent event times) out of
    the commit's conflict check."""
    if not ranges:
        return "false"
    start, end = (sql_timestamp(moment) for moment in (window.start, window.end))
    positions = " OR ".join(
        f'(bucket = {int(b)} AND "offset" >= {int(lo)} AND "offset" < {int(hi)})'
        for b, (lo, hi) in sorted(ranges.items())
    )
    return f"event_time >= '{start}' AND event_time < '{end}' AND ({positions})"


# --- planning and guards -----------------------------------------------------------------------


def plan_backfill(
    settings: PipelineSettings,
    window: Window,
    mode: str,
    *,
    run_id: str,
    issuer: str,
    buckets: Sequence[int] | None = None,
    now: datetime | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> BackfillPlan:
    """Check a backfill run and record it (a ``running`` ``backfill`` command); a retried run
    gets back the plan it recorded. Raises :class:`BackfillRefusedError`, nothing written, for
    any guard of the module docstring."""
    if mode not in BACKFILL_MODES:
        raise BackfillRefusedError(
            f"backfill mode {mode!r}: not one of {', '.join(BACKFILL_MODES)}"
        )
    now = pendulum.instance(now) if now is not None else pendulum.now("UTC")
    what = f"backfill {mode} {window} of pipeline {settings.pipeline!r}"
    if window.end > now:
        raise BackfillRefusedError(
            f"{what} refused: the window ends in the future (now is {now.isoformat()}); its "
            "records may not all exist yet"
        )
    options = dict(storage_options or {})
    store = StateStore.from_settings(settings, storage_options=options)
    for held in store.commands.list("running"):
        if held.kind == "backfill" and held.args.get("run_id") == run_id:
            return BackfillPlan.of(settings.pipeline, held)  # a retried task re-attaches
    commits = list(sink_commits(settings.sink, settings.pipeline, storage_options=options))
    if not commits:
        raise BackfillRefusedError(
            f"{what} refused: the pipeline has committed nothing to {settings.sink}; "
            "check the pipeline setting, or start the pipeline first"
        )
    from modeswitch.sinks.history import expected_ranges

    starts, committed = expected_ranges(commits)
    source = open_log(settings.source)
    known = source.buckets()
    unknown = sorted(set(buckets or ()) - set(known))
    if unknown:
        raise BackfillRefusedError(
            f"{what} refused: buckets {unknown} are not buckets of the source (it has {known})"
        )
    chosen = sorted(set(buckets)) if buckets else known
    rule = PayloadEventTime.of(settings)
    _check_retention(source, window, chosen, what, rule)
    bound = committed if mode == "reprocess" else starts
    indexed = source.event_time_indexed and rule is None
    ranges = window_ranges(source, window, bound, buckets=chosen, indexed=indexed)
    args: dict[str, Any] = {
        "mode": mode,
        "start": window.start.isoformat(),
        "end": window.end.isoformat(),
        "buckets": list(buckets or []),
        "ranges": {str(b): [lo, hi] for b, (lo, hi) in sorted(ranges.items())},
    }
    if rule is not None:
        args["event_time"] = rule.to_json()

    def overlaps(other: Mapping[str, Any]) -> bool:
        theirs = Window.parse(other["start"], other["end"])
        their_buckets = set(other.get("buckets") or known)
        return window.overlaps(theirs) and bool(set(chosen) & their_buckets)

    command = store.commands.claim_backfill(
        args, run_id=run_id, issuer=issuer, overlaps=overlaps, stale_after=CLAIM_EXPIRES
    )
    plan = BackfillPlan.of(settings.pipeline, store.commands.get(command))
    log.info(
        "%s: command %d, up to %d records in %d buckets",
        what,
        plan.command,
        plan.records_bound,
        len(plan.ranges),
    )
    return plan


def end_unfinished_backfill(store: StateStore, command_id: int) -> Command:
    """After a backfill job: a command it left ``running`` (the job records its own success)
    is marked rejected, its job having failed; returns the command as it now stands."""
    command = store.commands.get(command_id)
    if command.status == "running":
        store.commands.finish_backfill(command_id, error="the backfill job failed (see its log)")
        command = store.commands.get(command_id)
    return command


def _check_retention(
    source: BucketedLog,
    window: Window,
    buckets: Sequence[int],
    what: str,
    rule: PayloadEventTime | None = None,
) -> None:
    """Refuse a window that may begin among records retention dropped: a bucket that lost
    records and whose oldest retained record is younger than the window's start (its event
    time by ``rule``: a guess when that is a payload's time, which need not follow the log's
    order)."""
    earliest, latest = source.earliest_offsets(), source.latest_offsets()
    for bucket in buckets:
        first = earliest.get(bucket, 0)
        if first == 0 or first >= latest.get(bucket, 0):
            continue
        oldest = _first_event_time(source, bucket, first, latest[bucket], rule)
        if oldest is not None and oldest > window.start:
            raise BackfillRefusedError(
                f"{what} refused: the window is beyond retention in bucket {bucket}: records "
                f"below offset {first} were dropped and the oldest one kept is from "
                f"{oldest.isoformat()}"
            )


def _first_event_time(
    source: BucketedLog, bucket: int, start: int, end: int, rule: PayloadEventTime | None
) -> datetime | None:
    for batch in source.read(bucket, start, min(end, start + 1024)):
        if batch.num_rows:
            return event_times(batch.slice(0, 1), rule)[0].as_py()
    return None


__all__ = [
    "BACKFILL_MODES",
    "BackfillPlan",
    "PayloadEventTime",
    "Window",
    "backfill_app_id",
    "end_unfinished_backfill",
    "event_times",
    "plan_backfill",
    "window_predicate",
    "window_ranges",
]
