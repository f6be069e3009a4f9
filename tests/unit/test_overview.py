"""The overview's rows (modeswitch.ops.overview), from statuses as pipeline_status gives them:
what a row says, and that one pipeline's unreadable status is its own row's error."""

from __future__ import annotations

import pytest

from modeswitch.errors import ModeswitchError
from modeswitch.ops.overview import fleet_overview, overview_row, overview_table

pytestmark = pytest.mark.unit


def status(pipeline: str, **changes) -> dict:
    base = {
        "pipeline": pipeline,
        "mode": {
            "mode": "stream",
            "epoch": 4,
            "running": True,
            "since": "t",
            "reason": "caught up",
        },
        "next": {"mode": "stream", "watermark": {"lag_seconds": 3.5}},
        "thresholds": {"enter_seconds": 60.0, "exit_seconds": 45.0, "offset_lag_records": 1000},
        "bucket_summary": {"offset_lag": 120},
        "decisions": [
            {"decided_by": "alerts", "mode": "stream", "reason": "lag alert breach: offset lag"},
            {"decided_by": "airflow run", "mode": "stream", "reason": "no backlog"},
        ],
        "commands": [{"status": "pending"}, {"status": "applied"}, {"status": "pending"}],
        "epochs": [{"records": 900, "quarantined": 100}, {"records": 0, "quarantined": 0}],
        "warnings": [],
    }
    return {**base, **changes}


def test_a_row_says_mode_lags_against_thresholds_last_decision_pending_alert_share() -> None:
    row = overview_row(status("orders"))
    assert (row["pipeline"], row["mode"], row["epoch"]) == ("orders", "stream", 4)
    assert (row["watermark_lag_seconds"], row["enter_seconds"], row["exit_seconds"]) == (
        3.5,
        60,
        45,
    )
    assert (row["offset_lag"], row["offset_lag_records"]) == (120, 1000)
    assert row["last_decision"]["reason"] == "no backlog"  # the policy's, not the alert's
    assert row["pending_commands"] == 2
    assert row["alerting"] is True
    assert row["quarantine_share"] == pytest.approx(0.1)
    recovered = status(
        "orders",
        decisions=[{"decided_by": "alerts", "mode": "stream", "reason": "lag alert recovery: ok"}],
    )
    assert overview_row(recovered)["alerting"] is False


def test_one_pipelines_unreadable_status_is_its_rows_error_alone() -> None:
    def down() -> dict:
        raise ModeswitchError("source /logs/clicks cannot be read")

    def broken() -> dict:
        raise KeyError("mode")

    rows = fleet_overview([("orders", lambda: status("orders")), ("clicks", down), ("x", broken)])
    assert [r["pipeline"] for r in rows] == ["orders", "clicks", "x"]
    assert rows[0]["error"] is None
    assert rows[1]["error"] == "source /logs/clicks cannot be read"
    assert rows[2]["error"] == "KeyError: 'mode'"
    table = overview_table(rows)
    assert table[1][:4] == ["orders", "stream (epoch 4)", "3.5 s (60.0 s / 45.0 s)", "120 (1,000)"]
    assert table[2][2] == "error: source /logs/clicks cannot be read"
