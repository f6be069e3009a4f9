"""What the pipeline's asset events carry, their ``extra``: an epoch's (:func:`epoch_extra`),
a backfill run's (:func:`backfill_extra`) and the sink's live events (:func:`progress_extra`),
built from plain values (no Airflow import), and :func:`table_uri`, the URI naming a Delta
table that the Assets and the live events' ``table`` both use. The Assets and reading an
event's rows back are :mod:`modeswitch.airflow.assets`'s; the live events' watcher is
:class:`modeswitch.airflow.triggers.SinkProgressTrigger`."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

from modeswitch.offsets import OffsetsMap
from modeswitch.sinks.commits import event_time_from_micros
from modeswitch.storage import is_local, local_path

MAX_LISTED_BUCKETS = 256
"""Past this many buckets an event carries the offsets' count and sum, not each bucket's."""


def table_uri(location: str) -> str:
    """The URI naming the Delta table at ``location``: ``file://`` and the absolute path for a
    local folder, the location itself for an object store's (``s3://...``, ``abfss://...``)."""
    if is_local(location):
        return "file://" + quote(local_path(location))
    return location


def progress_extra(pipeline: str, table: str, commits: list[Any]) -> dict[str, Any]:
    """A live event's extra for the sink ``commits`` (progress rows, oldest first; at least
    one) of the sink table at URI ``table``: the epochs they belong to (``epoch``: the newest),
    the newest one's mode, the records they put in the sink and the quarantine, the Delta
    versions they wrote, when the first and last were committed, the newest event time, and per
    bucket the offsets of exactly their rows (from the first commit's start to the last one's
    end, :func:`offsets_extra`)."""
    if not commits:
        raise ValueError("a live event needs at least one sink commit")
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    event_times: dict[int, int] = {}
    for commit in commits:
        for bucket, offset in commit.start.items():
            start.setdefault(bucket, offset)
        end.update(commit.end)
        for bucket, micros in commit.max_event_time_us.items():
            event_times[bucket] = max(micros, event_times.get(bucket, micros))
    committed = [c.committed_at for c in commits if c.committed_at is not None]
    return {
        "pipeline": pipeline,
        "live": True,
        "table": table,
        "epoch": int(commits[-1].epoch),
        "epochs": sorted({int(c.epoch) for c in commits}),
        "mode": commits[-1].mode,
        "status": "running",
        "records": int(sum(c.records for c in commits)),
        "quarantined": int(sum(c.quarantined for c in commits)),
        "first_version": min(c.sink_version for c in commits),
        "last_version": max(c.sink_version for c in commits),
        "first_commit_at": _iso(min(committed)) if committed else None,
        "last_commit_at": _iso(max(committed)) if committed else None,
        "max_event_time": _max_event_time(event_times),
        **offsets_extra(start, end),
    }


def event_extra(event: Any) -> dict[str, Any]:
    """The extra of a sink event as the pipeline wrote it: an epoch's as it is, a live
    event's from the payload the triggerer wrapped it in (``{"from_trigger": true,
    "payload": ...}``)."""
    extra = dict(event.extra or {})
    if extra.get("from_trigger") and isinstance(extra.get("payload"), Mapping):
        return dict(extra["payload"])
    return extra


def offsets_extra(start: OffsetsMap | None, end: OffsetsMap | None) -> dict[str, Any]:
    """An epoch's offsets as an event's extra: where it started and ended per bucket
    (``start_offsets``, ``end_offsets``; keys as text, as JSON has them), up to
    :data:`MAX_LISTED_BUCKETS` buckets; past that their count and sums (``offsets_summary``)."""
    start, end = dict(start or {}), dict(end or {})
    if len(end) > MAX_LISTED_BUCKETS:
        return {
            "offsets_summary": {
                "buckets": len(end),
                "start_sum": int(sum(start.values())),
                "end_sum": int(sum(end.values())),
            }
        }
    return {
        "start_offsets": {str(b): int(start[b]) for b in sorted(start)},
        "end_offsets": {str(b): int(end[b]) for b in sorted(end)},
    }


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def epoch_extra(
    pipeline: str, epoch: Any, summary: Mapping[str, Any], *, status: str
) -> dict[str, Any]:
    """An asset event's extra for the closed ``epoch`` (a control-table epoch) from its
    ``summary`` (:meth:`~modeswitch.state.progress.ProgressTable.epoch_summaries`)."""
    return {
        "pipeline": pipeline,
        "epoch": int(epoch.id),
        "mode": epoch.mode,
        "status": status,
        "reason": epoch.end_reason,
        "records": int(summary.get("records", 0)),
        "quarantined": int(summary.get("quarantined", 0)),
        "first_version": summary.get("first_version"),
        "last_version": summary.get("last_version"),
        "started_at": _iso(epoch.started_at),
        "ended_at": _iso(epoch.ended_at),
        "max_event_time": _max_event_time(getattr(epoch, "max_event_time_us", None)),
        **offsets_extra(epoch.start, epoch.end),
    }


def _max_event_time(per_bucket_us: Mapping[int, int] | None) -> str | None:
    """The newest event time an epoch committed (ISO-8601), over its buckets; None when it
    committed nothing or it was not recorded."""
    if not per_bucket_us:
        return None
    return event_time_from_micros(max(per_bucket_us.values())).isoformat()


def backfill_extra(plan: Mapping[str, Any], outcome: Mapping[str, Any]) -> dict[str, Any]:
    """An asset event's extra for a backfill run that landed: its pipeline, command, mode and
    window (from the run's ``plan``), the records it put in the sink and the quarantine and
    the sink version of its one commit (``last_version``; ``outcome``: the command's args)."""
    window = list(plan.get("window") or [None, None])
    return {
        "pipeline": plan.get("pipeline"),
        "backfill": True,
        "command": plan.get("command"),
        "mode": plan.get("mode"),
        "window_start": window[0],
        "window_end": window[1],
        "records": outcome.get("records"),
        "quarantined": outcome.get("quarantined") or 0,
        "last_version": outcome.get("sink_version"),
    }


__all__ = [
    "MAX_LISTED_BUCKETS",
    "backfill_extra",
    "epoch_extra",
    "event_extra",
    "offsets_extra",
    "progress_extra",
    "table_uri",
]
