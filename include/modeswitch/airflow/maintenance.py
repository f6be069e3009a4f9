"""The callables behind the ``modeswitch_maintenance`` DAG, testable without a scheduler.

- :func:`maintenance_dag_options`: the DAG's schedule, read when the DAG file is parsed, so
  from the environment (``MODESWITCH_MAINTENANCE_SCHEDULE``, default ``@hourly``; ``none``
  for manual runs only), never from Variables.
- :func:`maintain_task`: resolve the settings (Variables < the run's ``settings`` param; the
  ``pipeline`` param names the target) and run :func:`modeswitch.ops.maintenance.maintain` under
  the run's id, so a retried task re-attaches to the lease its first try took.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from modeswitch.airflow.settings import (
    VariableGetter,
    connection_storage_options,
    settings_from_airflow,
)
from modeswitch.control.pipelines import Pipeline
from modeswitch.environment import MAINTENANCE_SCHEDULE, env_value
from modeswitch.ops.maintenance import maintain
from modeswitch.state import StateStore

log = logging.getLogger(__name__)


def maintenance_dag_options(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``schedule`` of the maintenance DAG from the environment: a preset (``@hourly``) or a
    cron expression, or ``none`` (runs only when triggered)."""
    schedule = env_value(MAINTENANCE_SCHEDULE, environ)
    return {"schedule": None if schedule.lower() == "none" else schedule}


def maintain_task(
    params: Mapping[str, Any],
    *,
    run_id: str,
    get_variable: VariableGetter | None = None,
    pipeline: Pipeline | None = None,
    dag_id: str = "modeswitch_maintenance",
) -> dict[str, Any]:
    """One maintenance run of the target pipeline (``pipeline``'s, the DAG's; ``modeswitch``'s
    DAG takes the target from its ``pipeline`` param); returns its report (to XCom)."""
    overrides = dict(params.get("settings") or {})
    if params.get("pipeline"):
        overrides["pipeline"] = params["pipeline"]
    settings = settings_from_airflow(overrides, get_variable=get_variable, pipeline=pipeline)
    store = StateStore.from_settings(settings, storage_options=connection_storage_options(settings))
    report = maintain(settings, store=store, run_id=run_id, issuer=f"airflow {dag_id} {run_id}")
    for done in report.tables:
        log.info(
            "%s: %d -> %d files, log %d -> %d bytes, %d files vacuumed (%.2f s)",
            done.table,
            done.files_before,
            done.files_after,
            done.log_bytes_before,
            done.log_bytes_after,
            done.vacuumed,
            done.seconds,
        )
    return report.to_dict()
