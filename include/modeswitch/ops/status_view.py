"""``modeswitch status`` in the terminal: :func:`~modeswitch.ops.status.pipeline_status`'s facts as
rich tables (``--json`` prints the mapping itself)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from modeswitch.ops.status_buckets import lag_first

MODE_STYLES = {"batch": "bold yellow", "stream": "bold green", "paused": "bold red"}


SHOWN_BUCKETS = 50
"""Past this many buckets the terminal shows the worst-lagging ones and a summary of all."""


def render_status(status: Mapping[str, Any], *, buckets: int = SHOWN_BUCKETS) -> Group:
    """The status as a group of rich renderables, top to bottom: now, next, buckets, epochs,
    decisions, commands. Past ``buckets`` buckets (0: never) only the ``buckets``
    worst-lagging are rows, under a line that sums up all of them."""
    return Group(
        _now(status),
        _next(status),
        _buckets(status, buckets),
        _epochs(status),
        _quarantine_reasons(status),
        _decisions(status),
        _commands(status),
    )


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _time(iso: str | None) -> str:
    return "-" if not iso else iso.replace("T", " ")[:19]


def _now(status: Mapping[str, Any]) -> Text:
    mode = status["mode"]
    text = Text()
    text.append(f"pipeline {status['pipeline']}: ", style="bold")
    text.append(mode["mode"], style=MODE_STYLES.get(mode["mode"], "bold"))
    if mode["epoch"] is not None:
        state = "running" if mode["running"] else f"ended {_time(mode.get('ended_at'))}"
        text.append(f" (epoch {mode['epoch']}, {state})")
    text.append(f", since {_time(mode['since'])} UTC\n")
    if mode.get("reason"):
        by = f" [{mode['decided_by']}]" if mode.get("decided_by") else ""
        text.append(f"why: {mode['reason']}{by}\n")
    if mode.get("end_reason"):
        text.append(f"ended: {mode['end_reason']}\n")
    for warning in status.get("warnings", []):
        text.append(f"warning: {warning}\n", style="bold red")
    text.append(f"source {status['source']} -> sink {status['sink']}", style="dim")
    return text


def _next(status: Mapping[str, Any]) -> Table | Text:
    evaluation = status["next"]
    if "error" in evaluation:
        return Text(f"next decision: cannot evaluate: {evaluation['error']}", style="red")
    thresholds = status["thresholds"]
    table = Table(title="next decision, evaluated now", box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("strategy")
    table.add_column("backlog")
    table.add_column("why", overflow="fold")
    for signal in evaluation["signals"]:
        backlog = {True: "yes", False: "no", None: "-"}[signal["backlog"]]
        table.add_row(signal["strategy"], backlog, signal["reason"])
    watermark = evaluation["watermark"]
    switch = "switch to" if evaluation["switch"] else "stay in"
    table.caption = (
        f"{switch} {evaluation['mode']}: {evaluation['reason']}\n"
        f"watermark lag {_duration(watermark['lag_seconds'])} "
        f"(enter > {_duration(thresholds['enter_seconds'])}, "
        f"exit <= {_duration(thresholds['exit_seconds'])}); "
        f"dwell left {_duration(evaluation['dwell_left_seconds'])}, "
        f"min time left {_duration(evaluation['min_time_left_seconds'])}"
    )
    table.caption_justify = "left"
    return table


def _buckets(status: Mapping[str, Any], shown: int) -> Table:
    rows = list(status["buckets"])
    title = "buckets"
    if shown and len(rows) > shown:
        rows = sorted(rows, key=lag_first)[:shown]
        summary = status.get("bucket_summary") or {}
        lagging, behind = summary.get("lagging"), summary.get("offset_lag")
        title = (
            f"buckets: the {shown} worst-lagging of {len(status['buckets']):,}"
            + ("" if lagging is None else f" ({lagging:,} lagging, {_count(behind)} behind)")
            + "; --buckets 0 shows all"
        )
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for name in ("bucket", "committed", "boundary", "latest", "offset lag", "event lag", "done"):
        table.add_column(name, justify="right")
    lags = [b["offset_lag"] or 0 for b in rows]
    worst = max(lags, default=0)
    for bucket in rows:
        lag = bucket["offset_lag"]
        style = "bold red" if worst and lag == worst else None
        done = {True: "yes", False: "no", None: "-"}[bucket["finished"]]
        table.add_row(
            str(bucket["bucket"]),
            _count(bucket["committed"]),
            _count(bucket["boundary"]),
            _count(bucket["latest"]),
            Text(_count(lag), style=style or ""),
            _duration(bucket["event_time_lag_seconds"]),
            done,
        )
    return table


def _epochs(status: Mapping[str, Any]) -> Table:
    table = Table(title="epochs, newest first", box=box.SIMPLE_HEAD, title_justify="left")
    names = ("epoch", "mode", "status", "started", "commits", "records", "rec/s", "handoff")
    for name in (*names, "quar."):
        table.add_column(name, justify="right" if name not in ("mode", "status") else "left")
    for epoch in status["epochs"]:
        rate = epoch["records_per_second"]
        table.add_row(
            str(epoch["epoch"]),
            Text(epoch["mode"], style=MODE_STYLES.get(epoch["mode"], "")),
            epoch["status"],
            _time(epoch["started_at"]),
            _count(epoch["commits"]),
            _count(epoch["records"]),
            "-" if rate is None else f"{rate:,.0f}",
            _duration(epoch["handoff_seconds"]),
            Text(
                _count(epoch.get("quarantined")),
                style="bold red" if epoch.get("quarantines_most") else "",
            ),
        )
    return table


def _quarantine_reasons(status: Mapping[str, Any]) -> Text:
    text = Text()
    for epoch in status["epochs"]:
        reasons = epoch.get("quarantine_reasons") or []
        if reasons:
            sample = "; ".join(f"{r['reason']} ({r['records']:,})" for r in reasons)
            text.append(f"epoch {epoch['epoch']} quarantined: {sample}\n", style="dim")
    return text


def _decisions(status: Mapping[str, Any]) -> Table:
    table = Table(title="decisions, newest first", box=box.SIMPLE_HEAD, title_justify="left")
    for name in ("at", "mode", "switch", "by", "why"):
        table.add_column(name, overflow="fold" if name == "why" else "ellipsis")
    for decision in status["decisions"]:
        table.add_row(
            _time(decision["at"]),
            decision["mode"],
            "yes" if decision["switched"] else "",
            decision["decided_by"],
            decision["reason"],
        )
    return table


def _commands(status: Mapping[str, Any]) -> Table:
    table = Table(title="commands, newest first", box=box.SIMPLE_HEAD, title_justify="left")
    for name in ("id", "kind", "status", "issuer", "created", "outcome"):
        table.add_column(name, overflow="fold" if name == "outcome" else "ellipsis")
    for command in status["commands"]:
        if command.get("outcome"):
            outcome = command["outcome"]
        elif command["status"] == "applied":
            outcome = f"applied at epoch {command['applied_epoch']}"
        elif command["status"] == "rejected":
            outcome = f"rejected: {command['reason']}"
        else:
            outcome = "waits for the next decision"
        table.add_row(
            str(command["id"]),
            command["kind"],
            command["status"],
            command["issuer"],
            _time(command["created_at"]),
            outcome,
        )
    return table


__all__ = ["render_status"]
