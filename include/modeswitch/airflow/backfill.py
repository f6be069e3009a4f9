"""The callables behind the ``modeswitch_backfill`` DAG's tasks, testable without a scheduler.

- :func:`backfill_dag_options`: the DAG's schedule and ``max_active_runs``, read when the DAG
  file is parsed, so from the environment (``MODESWITCH_BACKFILL_SCHEDULE``, default
  ``@daily``; ``MODESWITCH_BACKFILL_MAX_ACTIVE_RUNS``, default 2), never from Variables.
- :func:`plan_backfill_task`: resolve the settings (Variables < the run's ``settings``
  param), check the run's window (its data interval) and record it as a running ``backfill``
  command; returns the plan the Spark job and :func:`finish_backfill_task` read from XCom.
- :func:`finish_backfill_task`: after the job, whatever its state: a command still running
  means the job failed without finishing it, so it is marked rejected, and the run fails.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from modeswitch.airflow.assets import emit, table_asset
from modeswitch.airflow.event_extras import backfill_extra
from modeswitch.airflow.settings import (
    VariableGetter,
    connection_storage_options,
    settings_from_airflow,
    source_credentials,
)
from modeswitch.control.pipelines import Pipeline
from modeswitch.control.settings import PipelineSettings
from modeswitch.environment import BACKFILL_MAX_ACTIVE_RUNS, BACKFILL_SCHEDULE, env_value
from modeswitch.errors import ConfigError, ModeswitchError
from modeswitch.modes.backfill import BACKFILL_MODES, Window, end_unfinished_backfill, plan_backfill
from modeswitch.state import StateStore

log = logging.getLogger(__name__)


def backfill_dag_options(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``schedule`` and ``max_active_runs`` of the backfill DAG, from the environment; a bad
    value is refused naming its variable. The schedule is a preset such as ``@hourly`` or a
    cron expression, in UTC, made a ``CronDataIntervalTimetable``: each run's data interval,
    the window it backfills, runs from one tick to the next (Airflow 3 turns a plain cron
    string into a trigger timetable, whose runs have empty intervals)."""
    from airflow.timetables.interval import CronDataIntervalTimetable

    schedule = env_value(BACKFILL_SCHEDULE, environ)
    if schedule.lower() in ("none", "@once", "@continuous"):
        raise ConfigError(
            f"{BACKFILL_SCHEDULE.name}: {schedule!r} has no data intervals; a backfill needs a "
            "time-based schedule (e.g. @daily, @hourly or a cron expression)"
        )
    runs = env_value(BACKFILL_MAX_ACTIVE_RUNS, environ)
    try:
        timetable = CronDataIntervalTimetable(schedule, timezone="UTC")
        timetable.validate()
    except Exception as exc:  # Airflow's own error for a bad expression, named here
        raise ConfigError(
            f"{BACKFILL_SCHEDULE.name}: {schedule!r} is not a cron schedule: {exc}"
        ) from exc
    return {"schedule": timetable, "max_active_runs": runs}


def backfill_params(params: Mapping[str, Any]) -> tuple[str, list[int] | None]:
    """The run's ``mode`` and ``buckets`` params, checked; a bad one is refused naming it."""
    mode = params.get("mode", "fill")
    if mode not in BACKFILL_MODES:
        raise ConfigError(f"param mode: {mode!r} is not one of {', '.join(BACKFILL_MODES)}")
    buckets = params.get("buckets")
    if buckets in (None, [], ""):
        return mode, None
    if not isinstance(buckets, list) or any(
        isinstance(b, bool) or not isinstance(b, int) or b < 0 for b in buckets
    ):
        raise ConfigError(f"param buckets: {buckets!r} is not a list of bucket numbers")
    return mode, sorted(set(buckets))


def plan_backfill_task(
    params: Mapping[str, Any],
    *,
    run_id: str,
    data_interval_start: datetime | str | None,
    data_interval_end: datetime | str | None,
    get_variable: VariableGetter | None = None,
    pipeline: Pipeline | None = None,
    dag_id: str = "modeswitch_backfill",
) -> dict[str, Any]:
    """Check the run and record it; see the module docstring. The window is the run's data
    interval; a retried task gets back the plan its first try recorded. Params: ``pipeline``
    (the target; empty: the ``modeswitch_pipeline`` Variable's), ``mode``, ``buckets``,
    ``settings``."""
    if data_interval_start is None or data_interval_end is None:
        raise ConfigError(
            f"run {run_id}: no data interval; trigger the backfill DAG with a logical date, "
            "or through Airflow's backfill, so that the run has a window"
        )
    mode, buckets = backfill_params(params)
    overrides = dict(params.get("settings") or {})
    if params.get("pipeline"):  # the target pipeline, over the Variable's
        overrides["pipeline"] = params["pipeline"]
    settings = settings_from_airflow(overrides, get_variable=get_variable, pipeline=pipeline)
    window = Window.parse(data_interval_start, data_interval_end)
    with source_credentials(settings):
        plan = plan_backfill(
            settings,
            window,
            mode,
            run_id=run_id,
            issuer=f"airflow {dag_id} {run_id}",
            buckets=buckets,
            storage_options=connection_storage_options(settings),
        )
    log.info(
        "pipeline %s: backfill %s %s as command %d: %s",
        settings.pipeline,
        mode,
        window,
        plan.command,
        {b: list(r) for b, r in sorted(plan.ranges.items())},
    )
    return {
        "pipeline": settings.pipeline,
        "command": plan.command,
        "mode": plan.mode,
        "window": [plan.window.start.isoformat(), plan.window.end.isoformat()],
        "ranges": {str(b): list(r) for b, r in sorted(plan.ranges.items())},
        "settings": settings.to_json(),
    }


def require_backfill(plan: Mapping[str, Any]) -> None:
    """Fencing at the job task: the plan must be a recorded backfill."""
    if plan.get("command") is None or plan.get("window") is None:
        raise ModeswitchError(f"the backfill job was asked to run plan {dict(plan)!r}")


def finish_backfill_task(
    plan: Mapping[str, Any] | None, *, outlet_events: Any = None, dag_id: str | None = None
) -> dict[str, Any]:
    """End the run's backfill command if its job left it running (the job records a success
    itself); returns the command's outcome, and raises if the backfill did not land. With the
    task's ``outlet_events``, a backfill that landed is an asset event on the sink (and the
    quarantine, if it quarantined records) through ``dag_id``'s aliases
    (:mod:`modeswitch.airflow.assets`)."""
    if not plan:
        raise ModeswitchError("no backfill was planned (the plan task failed)")
    settings = PipelineSettings.from_json(plan["settings"])
    store = StateStore.from_settings(settings, storage_options=connection_storage_options(settings))
    command = end_unfinished_backfill(store, plan["command"])
    outcome = {
        "command": command.id,
        "status": command.status,
        "records": command.args.get("records"),
        "quarantined": command.args.get("quarantined"),
        "reason": command.reason,
    }
    if command.status != "applied":
        raise ModeswitchError(
            f"backfill command {command.id} {plan['mode']} {plan['window']}: {command.status}"
            f" ({command.reason})"
        )
    log.info("backfill command %d: %s", command.id, outcome)
    if outlet_events is not None and dag_id is not None:
        extra = backfill_extra(plan, command.args)
        for table, location in (("sink", settings.sink), ("quarantine", settings.quarantine)):
            if table == "sink" or extra["quarantined"]:
                asset = table_asset(location, pipeline=settings.pipeline, table=table)
                emit(outlet_events, dag_id, table, asset, extra)
    return outcome
