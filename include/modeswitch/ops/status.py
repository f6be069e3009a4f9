"""What a pipeline is doing and why, from its control tables: the facts behind
``modeswitch status`` and the Airflow page's JSON API (``plugins/modeswitch_plugin.py``).

:func:`pipeline_status` gathers, in one JSON-safe mapping:

- ``mode``: the running epoch (or the last one, closed), since when, and the reason of the
  decision that opened it; ``paused`` when the newest decision paused the pipeline;
- ``next``: the policy evaluated now on a fresh observation, as the next ``decide`` would see
  it (unless a command overrides it): each strategy's signal, the watermark lag, and how long
  the dwell and the mode's minimum time still hold a switch back;
- ``buckets``: per bucket, committed / boundary / latest offsets, offset lag, event-time lag
  and whether the running batch epoch has finished the bucket's backlog: all of them by
  bucket number, or one page of them (``bucket_limit``, ``bucket_offset``), worst-lagging
  first with ``bucket_order="lag"``; ``bucket_summary``: what all of them add up to (how
  many, how many lag, the total and worst offset lag, how many are finished), so that a page
  of 50 of 1 000 buckets still says how the rest stand;
- ``thresholds``: the policy's thresholds, in seconds and records;
- ``epochs``, ``decisions``, ``commands``: the newest of each, newest first; each epoch with
  its ``quarantined`` records, their most common ``quarantine_reasons``, the quarantined
  ``quarantine_share`` of all it committed and ``quarantines_most`` (more than the
  ``quarantine_warn_fraction`` setting: :mod:`modeswitch.control.quarantine`);
- ``warnings``: what an operator should look at, in words: the newest shown epoch that
  quarantined most of its records (with the count of older ones that did too);
- ``settings``: every effective setting and where its value came from.

Nothing here writes: the policy is evaluated with :func:`~modeswitch.control.policy.decide_mode`, a
pure function, and no decision is recorded. The buckets' rows, order and summary are built by
:mod:`modeswitch.ops.status_buckets`, the epochs' quarantine figures and the warnings by
:mod:`modeswitch.ops.status_quarantine`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import pendulum

from modeswitch.control.policy import decide_mode
from modeswitch.control.setting_groups import PolicySettings
from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError, ModeswitchError
from modeswitch.offsets import offsets_to_dict
from modeswitch.ops.status_buckets import (
    BUCKET_ORDERS,
    BucketOrder,
    bucket_rows,
    bucket_summary,
    lag_first,
)
from modeswitch.ops.status_quarantine import quarantine_warnings, with_quarantine
from modeswitch.runners.lifecycle import observe, operator_override, policy_state_of
from modeswitch.sinks.commits import event_time_from_micros
from modeswitch.state import StateStore
from modeswitch.state.commands import describe_backfill
from modeswitch.state.records import Command, Epoch, RecordedDecision

log = logging.getLogger(__name__)

DEFAULT_ROWS = 20
"""Decisions, commands and epochs shown by default."""


def pipeline_status(
    settings: PipelineSettings,
    *,
    origins: Mapping[str, str] | None = None,
    now: datetime | None = None,
    storage_options: Mapping[str, str] | None = None,
    rows: int = DEFAULT_ROWS,
    bucket_order: BucketOrder = "bucket",
    bucket_offset: int = 0,
    bucket_limit: int | None = None,
) -> dict[str, Any]:
    """The pipeline's state now, JSON-safe (module docstring). ``origins``: where each set
    setting came from (:func:`~modeswitch.control.settings_layers.setting_origins`); the others are
    defaults. The source is asked for its latest offsets; if it cannot answer, ``next`` and the lags
    say why instead, and the rest is still shown. ``buckets`` holds the ``bucket_limit``
    buckets (all without it) after the first ``bucket_offset`` in ``bucket_order``."""
    if bucket_order not in BUCKET_ORDERS:
        raise ConfigError(
            f"bucket_order: {bucket_order!r} is not one of {', '.join(BUCKET_ORDERS)}"
        )
    if bucket_offset < 0 or (bucket_limit is not None and bucket_limit < 1):
        raise ConfigError(
            f"bucket_offset {bucket_offset!r}, bucket_limit {bucket_limit!r}: the offset must "
            "be 0 or more and the limit 1 or more"
        )
    now = now or pendulum.now("UTC")
    store = StateStore.from_settings(settings, storage_options=storage_options)
    epochs = store.epochs.list(last=rows + 1)
    decisions = store.decisions.list(limit=rows)  # with inputs: a pause shows as one
    if not epochs and not decisions:
        raise ModeswitchError(
            f"pipeline {settings.pipeline!r}: no epochs or decisions under {settings.state_root} "
            "(it has not run yet, or its warehouse / state_root is elsewhere)"
        )
    current = next((e for e in reversed(epochs) if e.running), None)
    shown = current or (epochs[-1] if epochs else None)
    commands = store.commands.list(last=rows)[::-1]
    latest_decision = store.decisions.latest()
    opened_by = None
    if shown is not None:
        opening = store.decisions.list(limit=1, until=shown.started_at, inputs=False)
        opened_by = opening[0].decided_by if opening else None

    evaluation: dict[str, Any]
    latest: dict[int, int] | None = None
    committed: dict[int, int] | None = None
    event_times: dict[int, datetime] | None = None
    try:
        observation, committed = observe(settings, store, now)
        latest = dict(observation.latest)
        event_times = dict(observation.max_event_time)
        pending = [(c.id, c.kind) for c in store.commands.pending()]
        command, _ = operator_override(pending, "auto")
        decision = decide_mode(
            observation,
            settings=settings.policy,
            previous=policy_state_of(latest_decision),
            command=command,
        )
        evaluation = _next(decision.to_record(), settings.policy, now)
    except ModeswitchError as exc:  # the source is unreachable, or retention passed us
        log.warning("status of %s: %s", settings.pipeline, exc)
        evaluation = {"error": str(exc)}
    if committed is None:
        committed = dict(store.progress.committed_offsets())
    if event_times is None:
        event_times = {
            b: event_time_from_micros(us) for b, us in store.epochs.max_event_times().items()
        }
    buckets = bucket_rows(store, current, committed, latest, event_times, now)
    if bucket_order == "lag":
        buckets.sort(key=lag_first)
    end = None if bucket_limit is None else bucket_offset + bucket_limit
    shown_epochs = with_quarantine(
        _epochs(epochs, store)[-rows:][::-1], settings, committed, storage_options
    )

    return {
        "pipeline": settings.pipeline,
        "at": now.isoformat(),
        "source": settings.source,
        "sink": settings.sink,
        "mode": _mode(shown, latest_decision, opened_by),
        "next": evaluation,
        "buckets": buckets[bucket_offset:end],
        "bucket_summary": bucket_summary(buckets, bucket_order, bucket_offset, bucket_limit),
        "thresholds": _thresholds(settings.policy),
        "epochs": shown_epochs,
        "warnings": quarantine_warnings(shown_epochs, settings),
        "decisions": [decision_summary(d) for d in decisions],
        "commands": [_command(c) for c in commands[:rows]],
        "settings": {
            name: {"value": value, "from": (origins or {}).get(name, "default")}
            for name, value in sorted(settings.to_mapping().items())
        },
    }


def pipeline_history(
    settings: PipelineSettings,
    *,
    window: timedelta = timedelta(hours=1),
    now: datetime | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The chart's data from ``since`` to ``until`` (default: the ``window`` up to now): each
    decision's watermark lag and offset lag (what the policy saw when it decided), the epochs
    that ran then as mode bands with their throughput and the handoff before each, and the
    thresholds to draw against. Every decision of the range is a point (none are dropped or
    averaged), so a narrower range shows the same points spread wider."""
    now = now or pendulum.now("UTC")
    until = until or now
    since = since or until - window
    store = StateStore.from_settings(settings, storage_options=storage_options)
    points = []
    for decision in reversed(store.decisions.list(since=since, until=until)):
        observation = decision.inputs.get("observation") or {}
        committed, latest = observation.get("committed", {}), observation.get("latest", {})
        watermark = decision.inputs.get("watermark") or {}
        points.append(
            {
                "at": decision.at.isoformat(),
                "mode": decision.inputs.get("mode", decision.mode),
                "switched": decision.switched,
                "decided_by": decision.decided_by,
                "watermark_lag_seconds": watermark.get("lag_seconds"),
                "offset_lag": sum(max(0, n - committed.get(b, 0)) for b, n in latest.items()),
            }
        )
    ran = store.epochs.list(since=since)  # those still running or ended since, to the newest
    shown = {e.id for e in ran if e.started_at <= until}
    # One more, for the handoff before the first shown.
    bands = _epochs(store.epochs.list(last=len(ran) + 1), store) if shown else []
    return {
        "pipeline": settings.pipeline,
        "at": now.isoformat(),
        "since": since.isoformat(),
        "until": until.isoformat(),
        "points": points,
        "epochs": [e for e in bands if e["epoch"] in shown],
        "thresholds": _thresholds(settings.policy),
    }


HISTORY_MAX = timedelta(days=31)
"""The longest range the chart's data covers (``hours`` up to 744)."""


def history_range(
    *,
    now: datetime,
    hours: float | None = None,
    since: str | None = None,
    until: str | None = None,
) -> tuple[datetime, datetime]:
    """The chart's range from the history route's params: ``until`` (default ``now``) and
    ``since``, or ``hours`` back from ``until`` (default 1); times in ISO-8601, UTC unless
    they say otherwise. A :class:`~modeswitch.errors.ConfigError` naming the param for a
    value that is not a time, for both ``since`` and ``hours``, and for an empty range or
    one longer than 31 days."""
    if since is not None and hours is not None:
        raise ConfigError("params since and hours: give one of them, not both")
    if hours is not None and not 0 < hours <= HISTORY_MAX / timedelta(hours=1):
        raise ConfigError(f"param hours: {hours!r} is not within (0, 744]")
    end = now if until is None else _instant("until", until)
    if since is None:
        try:
            return end - timedelta(hours=1 if hours is None else hours), end
        except OverflowError as exc:
            raise ConfigError(f"param until: {until!r} is too early for hours={hours}") from exc
    start = _instant("since", since)
    if start >= end:
        raise ConfigError(
            f"param since: {since!r} is not before until ({end.isoformat()}): the range is empty"
        )
    if end - start > HISTORY_MAX:
        raise ConfigError(f"params since and until: {since!r} to {end.isoformat()} is over 31 days")
    return start, end


def _instant(param: str, value: str) -> datetime:
    try:
        at = pendulum.parse(value, exact=True)  # a bare time or date is not taken as today
    except (ValueError, TypeError, OverflowError) as exc:
        raise ConfigError(f"param {param}: {value!r} is not an ISO-8601 time") from exc
    if not isinstance(at, datetime):
        raise ConfigError(f"param {param}: {value!r} is not a date and time")
    return pendulum.instance(at).in_timezone("UTC")


def _mode(
    epoch: Epoch | None, decision: RecordedDecision | None, opened_by: str | None
) -> dict[str, Any]:
    if decision is not None and decision.inputs.get("mode") == "paused":
        return {
            "mode": "paused",
            "epoch": None,
            "running": False,
            "since": decision.at.isoformat(),
            "reason": decision.reason,
            "decided_by": decision.decided_by,
        }
    if epoch is None:
        return {"mode": "none", "epoch": None, "running": False, "since": None, "reason": None}
    return {
        "mode": epoch.mode,
        "epoch": epoch.id,
        "running": epoch.running,
        "since": epoch.started_at.isoformat(),
        "reason": epoch.reason,
        # The decision that opened it: the newest one made before it started.
        "decided_by": opened_by,
        "ended_at": None if epoch.ended_at is None else epoch.ended_at.isoformat(),
        "end_reason": epoch.end_reason,
    }


def _next(record: Mapping[str, Any], policy: PolicySettings, now: datetime) -> dict[str, Any]:
    """The policy's answer now, with what still holds a switch back."""
    state = record["state"]
    mode = state["mode"]
    since = pendulum.parse(state["mode_since"])
    minimum = policy.min_time_in_batch if mode == "batch" else policy.min_time_in_stream
    backlog_since = state.get("backlog_since")
    dwell_left = None
    if mode == "stream" and backlog_since:
        dwell_left = _left(pendulum.parse(backlog_since) + policy.enter_dwell, now)
    return {
        "mode": record["mode"],
        "switch": record["switched"],
        "reason": record["reason"],
        "signals": record["signals"],
        "watermark": record["watermark"],
        "backlog_since": backlog_since,
        "dwell_left_seconds": dwell_left,
        "min_time_left_seconds": _left(since + minimum, now),
        "command": record["command"],
    }


def _left(until: datetime, now: datetime) -> float:
    return max(0.0, (until - now).total_seconds())


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def _thresholds(policy: PolicySettings) -> dict[str, Any]:
    return {
        "watermark_lag_seconds": _seconds(policy.watermark_lag_threshold),
        "enter_seconds": _seconds(policy.enter_threshold),
        "exit_seconds": _seconds(policy.exit_threshold),
        "offset_lag_records": policy.offset_lag_threshold,
        "offset_lag_measure": policy.offset_lag_measure,
        "enter_dwell_seconds": policy.enter_dwell.total_seconds(),
        "min_time_in_stream_seconds": policy.min_time_in_stream.total_seconds(),
        "min_time_in_batch_seconds": policy.min_time_in_batch.total_seconds(),
    }


def _epochs(epochs: list[Epoch], store: StateStore) -> list[dict[str, Any]]:
    """Each epoch's figures, oldest first, with the handoff before it: from the previous
    epoch's last sink commit to this one's first (None where either has none). The progress
    table is read from the first of them on only."""
    summaries = store.progress.epoch_summaries(epochs[0].id) if epochs else {}
    out: list[dict[str, Any]] = []
    for epoch in epochs:
        figures = _epoch(epoch, summaries.get(epoch.id))
        before = out[-1]["last_commit_at"] if out else None
        first = figures["first_commit_at"]
        figures["handoff_seconds"] = (
            (pendulum.parse(first) - pendulum.parse(before)).total_seconds()
            if before and first
            else None
        )
        out.append(figures)
    return out


def _epoch(epoch: Epoch, summary: Mapping[str, Any] | None) -> dict[str, Any]:
    summary = summary or {}
    records = summary.get("records", 0)
    first, last = summary.get("first_commit_at"), summary.get("last_commit_at")
    end = epoch.ended_at or last
    seconds = (end - epoch.started_at).total_seconds() if end is not None else None
    return {
        "epoch": epoch.id,
        "mode": epoch.mode,
        "status": epoch.status,
        "reason": epoch.reason,
        "started_at": epoch.started_at.isoformat(),
        "ended_at": None if epoch.ended_at is None else epoch.ended_at.isoformat(),
        "end_reason": epoch.end_reason,
        "commits": summary.get("commits", 0),
        "records": records,
        "first_commit_at": None if first is None else first.isoformat(),
        "last_commit_at": None if last is None else last.isoformat(),
        "records_per_second": records / seconds if seconds else None,
        "start": offsets_to_dict(epoch.start),
        "boundary": None if epoch.boundary is None else offsets_to_dict(epoch.boundary),
        "end": None if epoch.end is None else offsets_to_dict(epoch.end),
    }


def decision_summary(decision: RecordedDecision) -> dict[str, Any]:
    """A decision as the status and the API show it (its inputs left out)."""
    return {
        "at": decision.at.isoformat(),
        "mode": decision.inputs.get("mode", decision.mode),
        "switched": decision.switched,
        "reason": decision.reason,
        "decided_by": decision.decided_by,
        "epoch": decision.epoch,
    }


def _command(command: Command) -> dict[str, Any]:
    return {
        "id": command.id,
        "kind": command.kind,
        "args": command.args
        if command.kind != "maintain"
        else {k: v for k, v in command.args.items() if k not in ("log_summary", "tables")},
        "issuer": command.issuer,
        "status": command.status,
        "created_at": command.created_at.isoformat(),
        "applied_at": None if command.applied_at is None else command.applied_at.isoformat(),
        "applied_epoch": command.applied_epoch,
        "applied_offsets": None
        if command.applied_offsets is None
        else offsets_to_dict(command.applied_offsets),
        "rejected_at": None if command.rejected_at is None else command.rejected_at.isoformat(),
        "reason": command.reason,
        "outcome": _backfill_outcome(command)
        if command.kind == "backfill"
        else _maintain_outcome(command)
        if command.kind == "maintain"
        else None,
    }


def _maintain_outcome(command: Command) -> str:
    """What a maintenance run did, in words: files per table before and after."""
    if command.status == "running":
        return "maintaining (holds the lease)"
    if command.status == "rejected":
        return f"failed: {command.reason}"
    tables = ", ".join(
        f"{t['table']} {t['files_before']:,} -> {t['files_after']:,} files"
        for t in command.args.get("tables", [])
        if t["files_before"] != t["files_after"]
    )
    return (
        f"{tables or 'nothing to compact'}; {command.args.get('progress_merged', 0):,} progress "
        f"rows merged ({command.args.get('seconds', 0):.1f} s)"
    )


def _backfill_outcome(command: Command) -> str:
    """What a backfill run did or is doing, in words: its mode, window and counts."""
    what = describe_backfill(command.args)
    if command.status == "running":
        return f"backfilling {what}"
    if command.status == "rejected":
        return f"{what} failed: {command.reason}"
    return (
        f"{what}: {command.args.get('records', 0):,} records, "
        f"{command.args.get('quarantined', 0):,} quarantined, sink version "
        f"{command.args.get('sink_version')}"
    )


__all__ = [
    "DEFAULT_ROWS",
    "decision_summary",
    "history_range",
    "pipeline_history",
    "pipeline_status",
]
