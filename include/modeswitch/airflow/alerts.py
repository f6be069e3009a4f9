"""The ``modeswitch_lag_alerts`` DAG's task: measure the lag, step the alert state, tell the
notifiers once per breach and once per recovery (:mod:`modeswitch.control.alerts`).

The notifiers are Airflow's own (``BaseNotifier`` subclasses: the SMTP, Slack, ... providers' or
a team's), instances named by the ``alert_notifiers`` setting as ``module:name``; each is called
with the task's context plus ``modeswitch_alert`` (pipeline, event, reason, since, the lag
reading), so a template such as ``"{{ modeswitch_alert.event }}: {{ modeswitch_alert.reason }}"``
renders the alert. Each event is also a row of the pipeline's decisions (``decided_by`` =
``alerts``), where the operator's page and ``modeswitch status`` show it.

The alert state is kept in an Airflow Variable per pipeline (:func:`state_variable`), written
by each run: the alerts run apart from the pipeline's own tasks, so that a pipeline whose runs
are stuck is still watched. A notifier that fails fails the task after the others were called;
the state is then left as it was, and the next run sends that event again.
"""

from __future__ import annotations

import copy
import importlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from modeswitch.airflow.lag import measure_lag
from modeswitch.airflow.settings import (
    VariableGetter,
    connection_storage_options,
    settings_from_airflow,
    source_credentials,
)
from modeswitch.control.alerts import AlertRules, AlertState, next_alert
from modeswitch.control.pipelines import Pipeline, state_variable
from modeswitch.control.settings import PipelineSettings
from modeswitch.control.values import parse_duration
from modeswitch.environment import ALERTS_SCHEDULE, env_value
from modeswitch.errors import ConfigError, ModeswitchError
from modeswitch.state import StateStore

log = logging.getLogger(__name__)

TASK_ID = "check_lag"


def alerts_dag_options(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``schedule`` of the alerts DAG from the environment (read when the DAG file is parsed):
    a duration (``30s``, ``1m``: that often), a cron expression or preset, or ``none``;
    every minute by default."""
    value = env_value(ALERTS_SCHEDULE, environ)
    if value.lower() == "none":
        return {"schedule": None}
    try:
        return {"schedule": parse_duration(value, setting=ALERTS_SCHEDULE.name)}
    except ConfigError:
        return {"schedule": value}  # a cron expression or preset: Airflow checks it


def load_notifiers(setting: str) -> list[Callable[[Mapping[str, Any]], Any]]:
    """The notifiers ``alert_notifiers`` names (comma-separated ``module:name``); a
    :class:`ConfigError` naming the entry that does not import or is not callable."""
    notifiers = []
    for entry in (part.strip() for part in setting.split(",")):
        if not entry:
            continue
        module_name, _, name = entry.partition(":")
        if not module_name or not name:
            raise ConfigError(f"alert_notifiers: {entry!r} is not module:name")
        try:
            found = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"alert_notifiers: {entry!r} cannot be imported: {exc}") from exc
        if not callable(found):
            raise ConfigError(f"alert_notifiers: {entry!r} is not a notifier (not callable)")
        notifiers.append(found)
    return notifiers


def _record_alert(store: StateStore, alert: Mapping[str, Any], at: Any) -> None:
    """The alert as a row of the decisions, beside the newest one
    (:meth:`~modeswitch.state.decisions.DecisionTable.record_beside_newest`): an alert changes
    nothing of the policy's memory or a pause. Before any decision, the newest epoch's mode."""

    def first_mode() -> Any:
        epochs = store.epochs.list()
        return epochs[-1].mode if epochs else "batch"

    store.decisions.record_beside_newest(
        f"lag alert {alert['event']}: {alert['reason']}",
        {"alert": dict(alert)},
        decided_by="alerts",
        first_mode=first_mode,
        at=at,
    )


def _load_state(key: str) -> Any:
    from airflow.sdk import Variable

    return Variable.get(key, default=None, deserialize_json=True)


def _save_state(key: str, state: Mapping[str, Any]) -> None:
    from airflow.sdk import Variable

    Variable.set(key, dict(state), serialize_json=True)


def lag_alert_task(
    context: Mapping[str, Any],
    *,
    overrides: Mapping[str, Any] | None = None,
    get_variable: VariableGetter | None = None,
    pipeline: Pipeline | None = None,
    settings: PipelineSettings | None = None,
    load_state: Callable[[str], Any] = _load_state,
    save_state: Callable[[str, Mapping[str, Any]], None] = _save_state,
) -> dict[str, Any]:
    """One look at the pipeline's lag (``overrides``: the run's ``settings`` param over the
    Variables); returns the reading, the state and the event sent, if any. The state is read
    from and written back to the pipeline's :func:`state_variable` (``load_state``,
    ``save_state``): one per pipeline, in the order the runs wrote it, whatever their kind
    (Airflow orders a task's earlier XComs by logical date, and manual runs have none).
    Skipped (Airflow's skip) when no alert threshold is set."""
    settings = settings or settings_from_airflow(
        overrides, get_variable=get_variable, pipeline=pipeline
    )
    rules = AlertRules.from_settings(settings)
    if not rules.enabled:
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException("no lag alert: alert_watermark_lag, alert_offset_lag: none")
    notifiers = load_notifiers(settings.alert_notifiers)  # a bad entry: before anything
    options = connection_storage_options(settings)
    with source_credentials(settings):
        reading = measure_lag(settings, storage_options=options)
    over = reading.crosses(
        watermark_lag_threshold=rules.watermark_lag, offset_lag_threshold=rules.offset_lag
    )
    key = state_variable(settings.pipeline)
    before = AlertState.from_json(load_state(key))
    state, event = next_alert(rules, before, reading.at, over)
    result = {"state": state.to_json(), "event": event, "over": over, "lag": reading.to_event()}
    if event is None:
        save_state(key, state.to_json())
        return result
    since = before.over_since or state.over_since
    alert = {
        "pipeline": settings.pipeline,
        "event": event,
        "reason": (state.reason if event == "breach" else f"recovered from {before.reason}"),
        "since": since.isoformat() if since else None,
        "at": reading.at.isoformat(),
        "lag": reading.to_event(),
    }
    _record_alert(StateStore.from_settings(settings, storage_options=options), alert, reading.at)
    log.warning("pipeline %s: lag alert %s: %s", settings.pipeline, event, alert["reason"])
    failed = []
    for notifier in notifiers:
        try:
            # A copy: Airflow's notifiers render their templates into themselves, once.
            copy.copy(notifier)({**context, "modeswitch_alert": alert})
        except Exception as exc:  # the others are still told; the task fails below
            log.exception("lag alert notifier %r failed", notifier)
            failed.append(f"{notifier!r}: {exc}")
    if not failed:
        save_state(key, state.to_json())
    else:  # the state stays where it was: the next run sends this event again
        raise ModeswitchError(
            f"lag alert {event} of pipeline {settings.pipeline}: {len(failed)} of "
            f"{len(notifiers)} notifiers failed ({'; '.join(failed)}); the next run sends it again"
        )
    return result


__all__ = ["TASK_ID", "alerts_dag_options", "lag_alert_task", "load_notifiers", "state_variable"]
