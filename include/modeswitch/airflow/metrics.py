"""The pipeline's metrics, sent through Airflow's own metrics client.

Whatever Airflow's ``[metrics]`` section turns on carries them: StatsD (``statsd_on``),
Datadog's StatsD (``statsd_datadog_enabled``) or OpenTelemetry (``otel_on``), with Airflow's
prefix, allow and block lists. Every name is under ``modeswitch.``, and every metric carries
the pipeline as the tag ``pipeline`` (plain StatsD has no tags: Airflow adds them to the name
InfluxDB's way with ``statsd_influxdb_enabled``, and drops them otherwise).

The tasks send them (:mod:`modeswitch.airflow.tasks`): ``decide`` what it decided on, the
close task what the epoch did, the control task each command queued.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

log = logging.getLogger(__name__)

PREFIX = "modeswitch."
MODE_VALUES = {"paused": 0, "batch": 1, "stream": 2}
"""``modeswitch.mode``'s value per mode."""

METRICS: dict[str, tuple[str, str]] = {
    "mode": ("gauge", "the mode decided: 0 paused (or nothing to run), 1 batch, 2 stream"),
    "epoch": ("gauge", "the epoch decided (or attached to)"),
    "watermark_lag_seconds": ("gauge", "now - watermark, at the decision"),
    "offset_lag": ("gauge", "records in the log past the committed offsets, at the decision"),
    "decisions": ("counter", "decisions taken by `decide`"),
    "switches": ("counter", "decisions that switched the mode"),
    "epoch_records": ("counter", "records an epoch wrote to the sink, when it closes"),
    "epoch_quarantined": ("counter", "records an epoch sent to the quarantine, when it closes"),
    "records_per_second": ("gauge", "an epoch's records / its run time, when it closes"),
    "handoff_seconds": (
        "timer",
        "the previous epoch's last sink commit to this epoch's first, when it closes",
    ),
    "commands": ("counter", "operator commands queued; tag `kind` too"),
}
"""Every metric: its name after :data:`PREFIX`, its kind and what it measures."""

_initialized = False


def _stats() -> Any:
    """Airflow's metrics module, its client made from Airflow's configuration once per process
    (a task process of Airflow's has one already; ``dag.test()`` and our own processes
    do not)."""
    global _initialized
    from airflow.sdk.observability import stats

    if not _initialized:
        from airflow.sdk.configuration import conf
        from airflow.sdk.observability.metrics.stats_utils import get_stats_factory

        stats.initialize(
            factory=get_stats_factory(),
            export_legacy_names=conf.getboolean("metrics", "legacy_names_on", fallback=False),
        )
        _initialized = True
    return stats


def _send(kind: str, name: str, value: float, tags: Mapping[str, str]) -> None:
    """One metric; a failure to send is logged, never the task's failure."""
    try:
        stats = _stats()
        stat = PREFIX + name
        if kind == "gauge":
            stats.gauge(stat, value, tags=dict(tags))
        elif kind == "counter":
            stats.incr(stat, count=int(value), tags=dict(tags))
        else:
            stats.timing(stat, value * 1000.0, tags=dict(tags))  # milliseconds, as Airflow's
    except Exception as exc:  # metrics never fail the pipeline's task
        log.warning("metric %s%s not sent: %s", PREFIX, name, exc)


def send_decision(pipeline: str, plan: Any) -> None:
    """What ``decide`` chose (an :class:`~modeswitch.runners.lifecycle.EpochPlan`)."""
    tags = {"pipeline": pipeline}
    _send("gauge", "mode", MODE_VALUES.get(plan.mode, 0) if plan.epoch else 0, tags)
    if plan.epoch is not None:
        _send("gauge", "epoch", plan.epoch, tags)
    decision = plan.decision or {}
    lag = (decision.get("watermark") or {}).get("lag_seconds")
    if lag is not None:
        _send("gauge", "watermark_lag_seconds", lag, tags)
    observation = decision.get("observation") or {}
    latest, committed = observation.get("latest"), observation.get("committed") or {}
    if latest is not None:
        offset_lag = sum(max(0, n - committed.get(b, 0)) for b, n in latest.items())
        _send("gauge", "offset_lag", offset_lag, tags)
    _send("counter", "decisions", 1, tags)
    if decision.get("switched"):
        _send("counter", "switches", 1, tags)


def send_epoch_closed(
    pipeline: str,
    *,
    records: int,
    quarantined: int,
    started_at: datetime,
    ended_at: datetime | None,
    handoff_seconds: float | None,
) -> None:
    """What a closed epoch did."""
    tags = {"pipeline": pipeline}
    _send("counter", "epoch_records", records, tags)
    _send("counter", "epoch_quarantined", quarantined, tags)
    if ended_at is not None and ended_at > started_at:
        seconds = (ended_at - started_at).total_seconds()
        _send("gauge", "records_per_second", records / seconds, tags)
    if handoff_seconds is not None:
        _send("timer", "handoff_seconds", handoff_seconds, tags)


def send_command(pipeline: str, kind: str) -> None:
    """An operator command queued."""
    _send("counter", "commands", 1, {"pipeline": pipeline, "kind": kind})


__all__ = ["METRICS", "PREFIX", "send_command", "send_decision", "send_epoch_closed"]
