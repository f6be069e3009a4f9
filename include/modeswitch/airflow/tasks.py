"""The callables behind the DAGs' tasks: testable without a scheduler.

- :func:`decide_task`: resolve settings (Variables and params), decide and open the epoch
  (or re-attach to a running one); returns the plan that the branch, the Spark job and
  ``close_epoch`` read from XCom.
- :func:`branch_for`: the task to run for a plan.
- :func:`close_task`: close the plan's epoch (boundary check, or where the stream stopped).
- :func:`submit_control_command`: validate a control DAG run's params and queue the command.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import pendulum

from modeswitch.airflow.assets import emit, table_asset
from modeswitch.airflow.event_extras import epoch_extra
from modeswitch.airflow.metrics import send_command, send_decision, send_epoch_closed
from modeswitch.airflow.settings import (
    VariableGetter,
    connection_storage_options,
    deployment_fleet,
    settings_from_airflow,
    source_credentials,
    unknown_variables,
)
from modeswitch.control.pipelines import Pipeline, VariableTarget
from modeswitch.control.settings import PipelineSettings
from modeswitch.control.values import parse_duration
from modeswitch.environment import PIPELINE_RETRY_DELAY, env_value
from modeswitch.errors import ConfigError, ModeswitchError
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.sources import open_log
from modeswitch.state import StateStore
from modeswitch.state.records import COMMAND_KINDS, RUN_KINDS

log = logging.getLogger(__name__)

FORCE_MODES = ("auto", "batch", "stream")
CONTROL_COMMANDS = tuple(kind for kind in COMMAND_KINDS if kind not in RUN_KINDS)
"""What the control DAG queues; a backfill records itself when its run starts."""
BATCH_TASK = "backlog_batch"
STREAM_TASK = "stream"


def pipeline_task_defaults(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The pipeline DAG's ``default_args``: two retries of a failed try, each after
    ``MODESWITCH_PIPELINE_RETRY_DELAY`` (read when the DAG file is parsed; 30 s by default).
    A retried epoch task re-attaches its epoch, so a short delay loses nothing."""
    delay: timedelta = parse_duration(
        env_value(PIPELINE_RETRY_DELAY, environ), setting=PIPELINE_RETRY_DELAY.name
    )
    return {"owner": "modeswitch", "retries": 2, "retry_delay": delay}


def _offsets_json(offsets: Mapping[int, int] | None) -> dict[str, int] | None:
    return None if offsets is None else {str(b): int(o) for b, o in sorted(offsets.items())}


def decide_task(
    params: Mapping[str, Any],
    *,
    run_id: str = "manual",
    get_variable: VariableGetter | None = None,
    idle_wait: float = 30.0,
    pipeline: Pipeline | None = None,
    report_variables: Callable[[], list[VariableTarget]] | None = None,
) -> dict[str, Any]:
    """Decide the run's epoch. ``params``: ``force_mode``, ``dry_run``, ``settings``.

    Settings are validated before anything is read or written: a bad Variable fails here,
    naming it. With ``dry_run`` the decision is only returned (and logged). When no epoch
    opens (paused), it waits ``idle_wait`` seconds before returning, so that a continuous
    schedule does not spin. ``pipeline``: the DAG's (``modeswitch`` without a file by
    default). ``report_variables()`` lists the Variables under the project's prefix that tune
    nothing: each is logged as a warning (the deployment's by default; a failure to list them
    is logged and the run goes on).
    """
    force_mode = params.get("force_mode", "auto")
    if force_mode not in FORCE_MODES:
        raise ConfigError(f"run param force_mode: {force_mode!r} is not one of {FORCE_MODES}")
    dry_run = params.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ConfigError(f"run param dry_run: {dry_run!r} is not true or false")
    settings = settings_from_airflow(
        params.get("settings") or {}, get_variable=get_variable, pipeline=pipeline
    )
    _log_unknown_variables(report_variables or _deployment_report)
    with source_credentials(settings):
        plan = decide(
            settings,
            force_mode=force_mode,
            dry_run=dry_run,
            decided_by=f"airflow {run_id}",
            storage_options=connection_storage_options(settings),
        )
    log.info(
        "pipeline %s: %s%s epoch %s (%s); start %s; boundary %s",
        settings.pipeline,
        "dry run: would run " if dry_run else "",
        plan.mode,
        plan.epoch,
        plan.reason,
        _offsets_json(plan.start),
        _offsets_json(plan.boundary),
    )
    if not dry_run:
        send_decision(settings.pipeline, plan)
    if plan.epoch is None and not dry_run and idle_wait > 0:
        log.info("no epoch to run (%s); waiting %.0f s before the next run", plan.mode, idle_wait)
        time.sleep(idle_wait)
    return {
        "pipeline": settings.pipeline,
        "epoch": plan.epoch,
        "mode": plan.mode,
        "reason": plan.reason,
        "start": _offsets_json(plan.start),
        "boundary": _offsets_json(plan.boundary),
        "attached": plan.attached,
        "commands": list(plan.commands),
        "dry_run": dry_run,
        "settings": settings.to_json(),
    }


def _deployment_report() -> list[VariableTarget]:
    return unknown_variables(deployment_fleet())


def _log_unknown_variables(report: Callable[[], list[VariableTarget]]) -> None:
    """Each Variable that tunes nothing, as a warning in the task's log."""
    try:
        found = report()
    except Exception as exc:  # a report, never a reason to stop the pipeline
        log.warning("could not list the modeswitch_* Variables: %s", exc)
        return
    for target in found:
        log.warning("Airflow Variable %r %s", target.key, target.problem)


def branch_for(plan: Mapping[str, Any]) -> list[str]:
    """The task id(s) to follow: the epoch's job, or none (dry run, paused, nothing to do)."""
    if plan.get("dry_run") or plan.get("epoch") is None:
        return []
    return [BATCH_TASK if plan["mode"] == "batch" else STREAM_TASK]


def close_task(
    plan: Mapping[str, Any], *, outlet_events: Any = None, dag_id: str | None = None
) -> dict[str, Any]:
    """Close the plan's epoch; a batch epoch below its boundary fails (ModeswitchError).
    Without an epoch (dry run, paused) the task is skipped. With the task's ``outlet_events``,
    an asset event on the sink, and on the quarantine if the epoch quarantined records, through
    ``dag_id``'s aliases (:mod:`modeswitch.airflow.assets`)."""
    if plan.get("dry_run") or plan.get("epoch") is None:
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException(f"no epoch to close ({plan.get('mode')})")
    settings = PipelineSettings.from_json(plan["settings"])
    epoch_id = int(plan["epoch"])
    options = connection_storage_options(settings)
    with source_credentials(settings):
        status, end = close_epoch(settings, epoch_id, storage_options=options)
    store = StateStore.from_settings(settings, storage_options=options)
    epoch = store.epochs.get(epoch_id)
    summaries = store.progress.epoch_summaries(max(1, epoch.id - 1))
    _send_epoch_metrics(settings.pipeline, epoch, summaries)
    if outlet_events is not None and dag_id is not None:
        _emit_epoch_events(outlet_events, dag_id, settings, epoch, summaries, status)
    log.info(
        "epoch %d (%s) closed %s at %s: %s",
        epoch_id,
        epoch.mode,
        status,
        _offsets_json(end),
        epoch.end_reason,
    )
    return {
        "epoch": epoch_id,
        "mode": epoch.mode,
        "status": status,
        "end": _offsets_json(end),
        "reason": epoch.end_reason,
    }


def _emit_epoch_events(
    outlet_events: Any,
    dag_id: str,
    settings: PipelineSettings,
    epoch: Any,
    summaries: Mapping[int, Mapping[str, Any]],
    status: str,
) -> None:
    """The closed epoch's asset events: on the sink always (an epoch that landed nothing
    still moved the offsets on), on the quarantine when it quarantined records."""
    extra = epoch_extra(settings.pipeline, epoch, summaries.get(epoch.id, {}), status=status)
    sink = table_asset(settings.sink, pipeline=settings.pipeline, table="sink")
    emit(outlet_events, dag_id, "sink", sink, extra)
    if extra["quarantined"]:
        quarantine = table_asset(
            settings.quarantine, pipeline=settings.pipeline, table="quarantine"
        )
        emit(outlet_events, dag_id, "quarantine", quarantine, extra)


def _send_epoch_metrics(
    pipeline: str, epoch: Any, summaries: Mapping[int, Mapping[str, Any]]
) -> None:
    """The closed epoch's figures as metrics (:mod:`modeswitch.airflow.metrics`), the handoff
    before it from the previous epoch's last sink commit to its first."""
    mine, before = summaries.get(epoch.id, {}), summaries.get(epoch.id - 1, {})
    first, last = mine.get("first_commit_at"), before.get("last_commit_at")
    send_epoch_closed(
        pipeline,
        records=int(mine.get("records", 0)),
        quarantined=int(mine.get("quarantined", 0)),
        started_at=epoch.started_at,
        ended_at=epoch.ended_at,
        handoff_seconds=(first - last).total_seconds() if first and last else None,
    )


# --- control commands --------------------------------------------------------------------------


def command_args(params: Mapping[str, Any], settings: PipelineSettings) -> dict[str, Any]:
    """The stored args of a control command from the control DAG's params; a bad param is
    refused with a ConfigError naming it."""
    kind = params.get("command")
    if kind not in CONTROL_COMMANDS:
        raise ConfigError(
            f"param command: {kind!r} is not one of {', '.join(CONTROL_COMMANDS)}"
            + (" (backfills run in the modeswitch_backfill DAG)" if kind == "backfill" else "")
        )
    offsets, event_time = params.get("offsets"), params.get("event_time")
    args: dict[str, Any] = {}
    if params.get("note"):
        args["note"] = str(params["note"])
    if kind != "rewind":
        if offsets or event_time:
            raise ConfigError(f"params offsets and event_time: only rewind takes them, not {kind}")
        return args
    if bool(offsets) == bool(event_time):
        raise ConfigError(
            'rewind needs exactly one of param offsets (e.g. {"0": 120}) or param event_time '
            "(ISO-8601, e.g. 2026-01-01T12:00:00Z)"
        )
    if event_time:
        try:
            at = pendulum.parse(str(event_time))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"param event_time: {event_time!r} is not an ISO-8601 time") from exc
        if not isinstance(at, datetime):
            raise ConfigError(f"param event_time: {event_time!r} is not a date and time")
        args["event_time"] = at.isoformat()
        # Where a rewind to an event time starts reading.
        at_utc = pendulum.instance(at).in_timezone("UTC")
        args["offsets"] = _offsets_json(open_log(settings.source).offset_at(at_utc))
        return args
    if not isinstance(offsets, Mapping):
        raise ConfigError(f"param offsets: {offsets!r} is not a map of bucket to offset")
    known = set(open_log(settings.source).buckets())
    try:
        parsed = {int(b): o for b, o in offsets.items()}
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"param offsets: {offsets!r} has a bucket that is not a number") from exc
    unknown = sorted(set(parsed) - known)
    if unknown:
        raise ConfigError(
            f"param offsets: unknown bucket(s) {unknown}; the log has {sorted(known)}"
        )
    if any(isinstance(o, bool) or not isinstance(o, int) or o < 0 for o in parsed.values()):
        raise ConfigError(f"param offsets: {offsets!r} must map buckets to offsets >= 0")
    args["offsets"] = _offsets_json(parsed)
    return args


def submit_control_command(
    params: Mapping[str, Any],
    *,
    run_id: str = "manual",
    get_variable: VariableGetter | None = None,
    issuer: str | None = None,
    settings: PipelineSettings | None = None,
    pipeline: Pipeline | None = None,
    dag_id: str = "modeswitch_control",
) -> dict[str, Any]:
    """Queue the command a control DAG run asks for; the running job applies it at its next
    commit boundary, or the next ``decide`` does. Returns the command's id and args. The
    operator's page calls this too, with ``issuer`` naming its user and the ``settings`` it
    resolved for the request (then neither the Variables nor ``params["settings"]`` are read
    again)."""
    if settings is None:
        settings = settings_from_airflow(
            params.get("settings") or {}, get_variable=get_variable, pipeline=pipeline
        )
    with source_credentials(settings):  # a rewind to an event time asks the source
        args = command_args(params, settings)
    kind = params["command"]
    try:
        store = StateStore.from_settings(
            settings, storage_options=connection_storage_options(settings)
        )
        command_id = store.commands.submit(
            kind, args, issuer=issuer or f"airflow {dag_id} {run_id}"
        )
    except ValueError as exc:
        raise ConfigError(f"command {kind}: {exc}") from exc
    log.info("pipeline %s: queued command %d %s %s", settings.pipeline, command_id, kind, args)
    send_command(settings.pipeline, kind)
    return {"pipeline": settings.pipeline, "command": command_id, "kind": kind, "args": args}


def require_running_epoch(plan: Mapping[str, Any], kind: str) -> None:
    """Fencing at the job task: the plan must be an epoch of ``kind``."""
    if plan.get("epoch") is None or plan.get("mode") != kind:
        raise ModeswitchError(
            f"the {kind} job was asked to run plan {plan.get('mode')} epoch {plan.get('epoch')}"
        )
