"""All of a deployment's pipelines at a glance: one row each, for the operator page's first view
and ``modeswitch status`` without ``--pipeline``.

A row says, from the pipeline's status (:func:`~modeswitch.ops.status.pipeline_status`): its
mode and why; its watermark lag against the thresholds that switch it (enter, exit) and its
offset lag against the offset threshold; the last decision of its policy and its reason; the
commands still pending; whether a lag alert is on (the newest alert row of its decisions is a
breach); and the quarantined share of the records its shown epochs committed. A pipeline whose
status cannot be read (its source down, its tables elsewhere, a bad setting) is a row with its
error: one pipeline's trouble never hides another's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from modeswitch.errors import ModeswitchError

log = logging.getLogger(__name__)

StatusReader = Callable[[], Mapping[str, Any]]
"""Reads one pipeline's status (``pipeline_status``'s answer); raises when it cannot."""


def overview_row(status: Mapping[str, Any]) -> dict[str, Any]:
    """One pipeline's row, from its status (pure)."""
    mode = status["mode"]
    evaluation = status.get("next") or {}
    watermark = evaluation.get("watermark") or {}
    thresholds = status["thresholds"]
    summary = status.get("bucket_summary") or {}
    decisions = status.get("decisions") or []
    policy = next((d for d in decisions if d["decided_by"] != "alerts"), None)
    alert = next((d for d in decisions if d["decided_by"] == "alerts"), None)
    epochs = status.get("epochs") or []
    records = sum(int(e.get("records") or 0) for e in epochs)
    quarantined = sum(int(e.get("quarantined") or 0) for e in epochs)
    return {
        "pipeline": status["pipeline"],
        "mode": mode["mode"],
        "running": mode.get("running", False),
        "epoch": mode.get("epoch"),
        "since": mode.get("since"),
        "reason": mode.get("reason"),
        "watermark_lag_seconds": watermark.get("lag_seconds"),
        "enter_seconds": thresholds.get("enter_seconds"),
        "exit_seconds": thresholds.get("exit_seconds"),
        "offset_lag": summary.get("offset_lag"),
        "offset_lag_records": thresholds.get("offset_lag_records"),
        "next": evaluation.get("mode"),
        "next_error": evaluation.get("error"),
        "last_decision": policy,
        "pending_commands": sum(
            1 for c in status.get("commands") or [] if c["status"] == "pending"
        ),
        "alert": None if alert is None else alert["reason"],
        "alerting": alert is not None and "alert breach" in alert["reason"],
        "quarantine_share": quarantined / (records + quarantined)
        if records + quarantined
        else None,
        "warnings": list(status.get("warnings") or []),
        "error": None,
    }


def fleet_overview(readers: Iterable[tuple[str, StatusReader]]) -> list[dict[str, Any]]:
    """A row per pipeline, in the order given; a pipeline whose status raised is a row with
    the error (a :class:`ModeswitchError`'s words, or the exception's type and words)."""
    rows = []
    for name, read in readers:
        try:
            rows.append(overview_row(read()))
        except ModeswitchError as exc:
            rows.append(_error_row(name, str(exc)))
        except Exception as exc:  # one pipeline's fault is its row's, not the overview's
            log.warning("overview of pipeline %s: %s", name, exc, exc_info=True)
            rows.append(_error_row(name, f"{type(exc).__name__}: {exc}"))
    return rows


def _error_row(name: str, error: str) -> dict[str, Any]:
    return {"pipeline": name, "mode": "unknown", "error": error}


def overview_table(rows: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """The rows as text cells for a terminal table: pipeline, mode, watermark lag / enter /
    exit, offset lag / threshold, last decision, pending, alert, quarantined."""
    table = [
        [
            "pipeline",
            "mode",
            "watermark lag (enter / exit)",
            "offset lag (threshold)",
            "last decision",
            "pending",
            "alert",
            "quarantined",
        ]
    ]
    for row in rows:
        if row.get("error"):
            table.append([row["pipeline"], "unknown", f"error: {row['error']}", "", "", "", "", ""])
            continue
        decision = row["last_decision"]
        mode = row["mode"] + (f" (epoch {row['epoch']})" if row.get("epoch") else "")
        table.append(
            [
                row["pipeline"],
                mode,
                f"{_seconds(row['watermark_lag_seconds'])} "
                f"({_seconds(row['enter_seconds'])} / {_seconds(row['exit_seconds'])})",
                f"{_count(row['offset_lag'])} ({_count(row['offset_lag_records'])})",
                "-" if decision is None else f"{decision['mode']}: {decision['reason']}",
                str(row["pending_commands"]),
                "on" if row["alerting"] else "-",
                "-" if row["quarantine_share"] is None else f"{row['quarantine_share']:.1%}",
            ]
        )
    return table


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"
