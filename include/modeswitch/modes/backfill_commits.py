"""Backfill commits as the sink's (and the quarantine's) Delta log records them, and what
``modeswitch verify`` counts of them.

Each backfill run (:mod:`modeswitch.modes.backfill`) commits once per table under
:data:`~modeswitch.sinks.history.BACKFILL_KEY`: :class:`BackfillCommit` is that record (its
window, ranges, counts and event-time rule), :func:`backfill_commits` and
:func:`summarised_backfills` read them back from a table's history or a log summary, and
:func:`backfilled_positions` finds the log's records those commits loaded (the offsets the sink
must hold besides the live range).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modeswitch.errors import ModeswitchError
from modeswitch.modes.backfill import BackfillMode, PayloadEventTime, Window, event_times
from modeswitch.sinks.commits import event_time_to_micros, user_metadata
from modeswitch.sinks.history import BACKFILL_KEY, LogSummary
from modeswitch.sources.base import BucketedLog


@dataclass(frozen=True)
class BackfillCommit:
    """A backfill commit as recorded in the sink's (or quarantine's) Delta log."""

    pipeline: str
    command: int
    run_id: str
    mode: BackfillMode
    window: Window
    ranges: dict[int, tuple[int, int]]
    records: int
    quarantined: int
    table_version: int | None = None
    committed_at_ms: int | None = None
    event_time: PayloadEventTime | None = None

    def to_metadata(self) -> dict[str, str]:
        body: dict[str, Any] = {
            "pipeline": self.pipeline,
            "command": self.command,
            "run_id": self.run_id,
            "mode": self.mode,
            "start": self.window.start.isoformat(),
            "end": self.window.end.isoformat(),
            "ranges": {str(b): [lo, hi] for b, (lo, hi) in sorted(self.ranges.items())},
            "records": self.records,
            "quarantined": self.quarantined,
        }
        if self.event_time is not None:
            body["event_time"] = self.event_time.to_json()
        summary = {
            "command": self.command,
            "mode": self.mode,
            "window": [body["start"], body["end"]],
            "records": self.records,
        }
        return {
            BACKFILL_KEY: json.dumps(body, separators=(",", ":")),
            **user_metadata(self.pipeline, "backfill", **summary),
        }

    @classmethod
    def from_commit_info(cls, info: Mapping[str, Any]) -> BackfillCommit | None:
        raw = info.get(BACKFILL_KEY)
        if raw is None:
            return None
        try:
            body = json.loads(raw) if isinstance(raw, str) else dict(raw)
            return cls(
                pipeline=str(body["pipeline"]),
                command=int(body["command"]),
                run_id=str(body["run_id"]),
                mode=body["mode"],
                window=Window.parse(body["start"], body["end"]),
                ranges={int(b): (int(lo), int(hi)) for b, (lo, hi) in body["ranges"].items()},
                records=int(body["records"]),
                quarantined=int(body["quarantined"]),
                table_version=info.get("version"),
                committed_at_ms=info.get("timestamp"),
                event_time=PayloadEventTime.parse(body.get("event_time")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModeswitchError(
                f"backfill commit at version {info.get('version')} has malformed "
                f"{BACKFILL_KEY!r} metadata: {raw!r}"
            ) from exc


def backfill_commits(
    table_uri: str, pipeline: str, *, storage_options: Mapping[str, str] | None = None
) -> list[BackfillCommit]:
    """The pipeline's backfill commits in a table, newest first (none if it does not exist)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(table_uri, storage_options=dict(storage_options or {}))
    except TableNotFoundError:
        return []
    found = []
    for info in table.history():
        commit = BackfillCommit.from_commit_info(info)
        if commit is not None and commit.pipeline == pipeline:
            found.append(commit)
    return found


def summarised_backfills(summary: LogSummary) -> list[BackfillCommit]:
    """The backfill commits a log summary kept (:mod:`modeswitch.sinks.history`)."""
    found = []
    for kept in summary.backfills:
        info = {BACKFILL_KEY: kept["metadata"], "version": kept["version"]}
        commit = BackfillCommit.from_commit_info(info)
        if commit is not None:
            found.append(commit)
    return found


def backfilled_positions(
    source: BucketedLog, commits: Sequence[BackfillCommit], below: Mapping[int, int]
) -> dict[int, Any]:
    """Per bucket, the sorted offsets (int64) of the records the backfill ``commits`` loaded
    below ``below`` (the live range's start per bucket): the log's records of each commit's
    window within its ranges, their event time taken by the rule the commit recorded (the
    log's, or a payload field's: :class:`PayloadEventTime`). What the sink must hold once
    besides the live range.

    Each bucket is read once per rule, from the lowest range start up, whatever the number of
    windows (a year of daily windows is one pass, not 365); a record is matched to the window
    that starts last at or before its event time."""
    import numpy as np

    by_rule: dict[PayloadEventTime | None, list[BackfillCommit]] = {}
    for commit in commits:
        by_rule.setdefault(commit.event_time, []).append(commit)
    found: dict[int, Any] = {}
    for rule, ruled in by_rule.items():
        for bucket, offsets in _filled_positions(source, ruled, below, rule).items():
            held = found.get(bucket)
            found[bucket] = offsets if held is None else np.union1d(held, offsets)
    return found


def _filled_positions(
    source: BucketedLog,
    commits: Sequence[BackfillCommit],
    below: Mapping[int, int],
    rule: PayloadEventTime | None,
) -> dict[int, Any]:
    """:func:`backfilled_positions` of commits that share one event-time rule."""
    import numpy as np

    pieces: dict[int, dict[tuple[int, int], tuple[int, int]]] = {}
    for commit in commits:
        key = (event_time_to_micros(commit.window.start), event_time_to_micros(commit.window.end))
        for bucket, (lo, hi) in commit.ranges.items():
            hi = min(hi, below.get(bucket, hi))
            if lo >= hi:
                continue
            held = pieces.setdefault(bucket, {}).get(key)  # reruns of a window: one piece
            pieces[bucket][key] = (min(lo, held[0]), max(hi, held[1])) if held else (lo, hi)
    found: dict[int, Any] = {}
    for bucket, windows in pieces.items():
        order = sorted(windows.items())
        starts = np.array([w[0] for w, _ in order], np.int64)
        ends = np.array([w[1] for w, _ in order], np.int64)
        los = np.array([r[0] for _, r in order], np.int64)
        his = np.array([r[1] for _, r in order], np.int64)
        disjoint = bool(np.all(ends[:-1] <= starts[1:]))
        parts = []
        for batch in _retained(source, bucket, int(los.min()), int(his.max())):
            times = event_times(batch, rule).cast("int64").to_numpy(zero_copy_only=False)
            offsets = batch.column("offset").to_numpy(zero_copy_only=False).astype(np.int64)
            if disjoint:
                at = np.searchsorted(starts, times, side="right") - 1
                safe = np.maximum(at, 0)
                keep = (
                    (at >= 0)
                    & (times < ends[safe])
                    & (offsets >= los[safe])
                    & (offsets < his[safe])
                )
            else:  # overlapping windows (different schedules): window by window
                keep = np.zeros(len(times), bool)
                for i in range(len(starts)):
                    keep |= (
                        (times >= starts[i])
                        & (times < ends[i])
                        & (offsets >= los[i])
                        & (offsets < his[i])
                    )
            parts.append(offsets[keep])
        if parts:
            found[bucket] = np.unique(np.concatenate(parts))
    return found


def _retained(source: BucketedLog, bucket: int, lo: int, hi: int) -> Iterator[Any]:
    """The records of ``[lo, hi)`` still retained (retention may have dropped the oldest)."""
    lo = max(lo, source.earliest_offsets().get(bucket, 0))
    if lo < hi:
        yield from source.read(bucket, lo, hi)


__all__ = [
    "BackfillCommit",
    "backfill_commits",
    "backfilled_positions",
    "summarised_backfills",
]
