"""The status's buckets: one row per bucket with its offsets and lags, the order they are
listed in, and what all of them add up to (so that one page of them still says how the rest
stand). Rows for :func:`~modeswitch.ops.status.pipeline_status`, ordered for its pages and the
terminal's (:mod:`modeswitch.ops.status_view`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from modeswitch.state import StateStore
from modeswitch.state.records import Epoch

BucketOrder = Literal["bucket", "lag"]
BUCKET_ORDERS: tuple[BucketOrder, ...] = ("bucket", "lag")
"""How the status lists buckets: by number, or the worst-lagging first (offset lag, then
event-time lag, then number)."""


def bucket_rows(
    store: StateStore,
    current: Epoch | None,
    committed: Mapping[int, int],
    latest: Mapping[int, int] | None,
    event_times: Mapping[int, datetime],
    now: datetime,
) -> list[dict[str, Any]]:
    """One row per bucket known to the sink, the source or ``current``'s boundary, by number:
    its committed, boundary and latest offsets, offset and event-time lags, and whether
    ``current`` (a batch epoch) has finished its backlog. ``latest`` None: the source could
    not answer, so its lags are unknown (None)."""
    boundary = current.boundary if current is not None and current.boundary else {}
    finished = store.ledger.finished(current.id) if current and current.mode == "batch" else {}
    buckets = sorted({*committed, *(latest or {}), *boundary})
    out = []
    for bucket in buckets:
        done = committed.get(bucket, 0)
        event_time = event_times.get(bucket)
        out.append(
            {
                "bucket": bucket,
                "committed": done,
                "boundary": boundary.get(bucket),
                "latest": None if latest is None else latest.get(bucket, 0),
                "offset_lag": None if latest is None else max(0, latest.get(bucket, 0) - done),
                "max_event_time": None if event_time is None else event_time.isoformat(),
                "event_time_lag_seconds": None
                if event_time is None
                else max(0.0, (now - event_time).total_seconds()),
                "finished": bucket in finished if current and current.mode == "batch" else None,
            }
        )
    return out


def lag_first(bucket: Mapping[str, Any]) -> tuple[float, float, int]:
    """Sort key: the largest offset lag first, then the largest event-time lag (all the
    source's lags are unknown when it cannot answer), then by number."""
    return (
        -(bucket["offset_lag"] or 0),
        -(bucket["event_time_lag_seconds"] or 0.0),
        bucket["bucket"],
    )


def bucket_summary(
    buckets: list[dict[str, Any]], order: BucketOrder, offset: int, limit: int | None
) -> dict[str, Any]:
    """What all ``buckets`` add up to, and which of them the status shows."""
    lags = [b["offset_lag"] for b in buckets if b["offset_lag"] is not None]
    known = len(lags) == len(buckets) and bool(buckets)
    worst = min(buckets, key=lag_first) if known else None
    finished = [b["finished"] for b in buckets if b["finished"] is not None]
    event_lags = [b["event_time_lag_seconds"] for b in buckets]
    return {
        "total": len(buckets),
        "order": order,
        "offset": offset,
        "limit": limit,
        "shown": len(buckets[offset : None if limit is None else offset + limit]),
        "lagging": sum(1 for lag in lags if lag > 0) if known else None,
        "offset_lag": sum(lags) if known else None,
        "worst_offset_lag": None if worst is None else worst["offset_lag"],
        "worst_bucket": None if worst is None else worst["bucket"],
        "max_event_time_lag_seconds": max(
            (lag for lag in event_lags if lag is not None), default=None
        ),
        "finished": sum(finished) if finished else None,
    }


__all__ = ["BUCKET_ORDERS", "BucketOrder", "bucket_rows", "bucket_summary", "lag_first"]
