"""Lag alerts: the state machine (one breach event once the lag has stayed over for
``alert_after``, one recovery, nothing while it flaps), and the alerts task on a real pipeline's
tables with an Airflow notifier that records its calls."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowSkipException
from notifier_tools import RecordingNotifier
from test_status import LATEST, commit, layers  # noqa: F401 (layers: a fixture)

from modeswitch.airflow.alerts import alerts_dag_options, lag_alert_task, load_notifiers
from modeswitch.control.alerts import AlertRules, AlertState, next_alert
from modeswitch.control.settings_layers import layer_settings
from modeswitch.errors import ConfigError
from modeswitch.runners.lifecycle import decide, previous_state
from modeswitch.state import StateStore

pytestmark = pytest.mark.unit

T = datetime(2026, 11, 27, 3, tzinfo=UTC)
RULES = AlertRules(watermark_lag=timedelta(minutes=10), offset_lag=None, after=timedelta(minutes=5))


def _readings(*overs: tuple[int, str | None]) -> list[tuple[int, str | None]]:
    """(minute, event) for each (minute, why over or None), from a fresh state."""
    state, events = AlertState(), []
    for minute, over in overs:
        state, event = next_alert(RULES, state, T + timedelta(minutes=minute), over)
        events.append((minute, event))
        state = AlertState.from_json(state.to_json())  # what the next run reads back
    return events


def test_a_breach_is_told_once_after_it_lasted_and_its_end_once() -> None:
    lag = "watermark lag 0:12:00 > 0:10:00"
    assert _readings((0, lag), (4, lag), (5, lag), (6, lag), (30, lag), (31, None), (32, None)) == [
        (0, None),
        (4, None),
        (5, "breach"),  # over for alert_after
        (6, None),
        (30, None),  # still over: told already
        (31, "recovery"),
        (32, None),
    ]


def test_a_lag_that_flaps_for_less_than_alert_after_tells_no_one() -> None:
    lag = "offset lag 5000 records > 1000"
    overs = [(m, lag if m % 2 == 0 else None) for m in range(20)]
    assert [event for _, event in _readings(*overs)] == [None] * 20
    # Each stretch over starts the clock again: 0-4 is under five minutes, 10-15 is not.
    stretches = [(m, lag if m < 4 or m >= 10 else None) for m in range(16)]
    assert [m for m, event in _readings(*stretches) if event] == [15]


def test_the_state_a_run_keeps_reads_back_and_anything_else_is_fresh() -> None:
    state = AlertState(T, True, "why")
    assert AlertState.from_json(state.to_json()) == state
    assert AlertState.from_json(None) == AlertState() == AlertState.from_json("garbage")


RECORDER = RecordingNotifier("{{ modeswitch_alert.event }}: {{ modeswitch_alert.reason }}")


def test_the_task_tells_the_notifiers_once_per_breach_and_recovery(
    layers: list,  # noqa: F811
) -> None:
    RECORDER.sent.clear()
    settings = layer_settings(
        *layers,
        (
            "run params",
            {
                "alert_offset_lag": "100",
                "alert_after": "0s",
                "alert_notifiers": f"{__name__}:RECORDER",
            },
        ),
    )
    store = StateStore.from_settings(settings)
    variables: dict[str, Any] = {}

    def look() -> dict[str, Any]:
        return lag_alert_task(
            {}, settings=settings, load_state=variables.get, save_state=variables.__setitem__
        )

    first = look()  # 140 records behind, nothing committed
    assert (first["event"], first["over"]) == ("breach", "offset lag 140 records > 100")
    assert variables["modeswitch_alert_state_orders"]["alerted"] is True
    second = look()
    assert second["event"] is None
    assert RECORDER.sent == ["breach: offset lag 140 records > 100"]

    plan = decide(settings, force_mode="batch")
    policy = previous_state(store)
    commit(settings, plan.epoch, 0, {b: (0, n) for b, n in LATEST.items()})
    third = look()
    # The alert is the newest decision now; the policy's memory is the same.
    assert store.decisions.latest().decided_by == "alerts"
    assert previous_state(store) == policy is not None
    assert third["event"] == "recovery"
    assert look()["event"] is None
    assert RECORDER.sent == [
        "breach: offset lag 140 records > 100",
        "recovery: recovered from offset lag 140 records > 100",
    ]
    alerts = [d for d in store.decisions.list() if d.decided_by == "alerts"]
    assert [d.reason for d in reversed(alerts)] == [
        "lag alert breach: offset lag 140 records > 100",
        "lag alert recovery: recovered from offset lag 140 records > 100",
    ]


def test_without_thresholds_it_skips_and_a_bad_notifier_is_refused_before_anything(
    layers: list,  # noqa: F811
) -> None:
    with pytest.raises(AirflowSkipException, match="no lag alert"):
        lag_alert_task({}, settings=layer_settings(*layers))
    settings = layer_settings(
        *layers, ("run params", {"alert_offset_lag": "1", "alert_notifiers": "nowhere:x"})
    )
    with pytest.raises(ConfigError, match="alert_notifiers: 'nowhere:x' cannot be imported"):
        lag_alert_task({}, settings=settings)
    assert StateStore.from_settings(settings).decisions.list() == []
    with pytest.raises(ConfigError, match="'json' is not module:name"):
        load_notifiers("json")
    with pytest.raises(ConfigError, match="'json:__doc__' is not a notifier"):
        load_notifiers("json:__doc__")


def test_the_schedule_is_a_duration_a_cron_expression_or_none() -> None:
    assert alerts_dag_options({}) == {"schedule": timedelta(minutes=1)}
    assert alerts_dag_options({"MODESWITCH_ALERTS_SCHEDULE": "30s"}) == {
        "schedule": timedelta(seconds=30)
    }
    assert alerts_dag_options({"MODESWITCH_ALERTS_SCHEDULE": "*/5 * * * *"}) == {
        "schedule": "*/5 * * * *"
    }
    assert alerts_dag_options({"MODESWITCH_ALERTS_SCHEDULE": "none"}) == {"schedule": None}
