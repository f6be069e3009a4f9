"""Backfills of the modeswitch pipeline: each run loads or re-derives one event-time window.

Wiring only: the task callables live in ``modeswitch.airflow.backfill``; the schedule and
``max_active_runs`` come from the environment when the file is parsed, settings from
Variables at run time.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag, task

from modeswitch.airflow.assets import sink_alias
from modeswitch.airflow.backfill import (
    backfill_dag_options,
    finish_backfill_task,
    plan_backfill_task,
)
from modeswitch.airflow.operators import EpochJobOperator

DOC = """
### modeswitch backfill

One run = one **event-time window**: the run's data interval `[start, end)`. A record belongs
to the window that holds its event time, whatever its offset, so late records are included
and every record belongs to exactly one run of the schedule.

- `mode = fill`: load the window's records that the live pipeline never read (below where it
  started: a pipeline set to `start_from = latest` goes live at once and loads its history
  this way).
- `mode = reprocess`: re-derive the window's records the sink holds (after a transform fix).

Each run writes ONE Delta commit to the sink (and one to the quarantine) that replaces the
window's records, beside the running pipeline: no pause, nothing lost or doubled; a rerun
leaves the same rows. Use **Trigger DAG ▸ Backfill** (or `airflow backfill create
--dag-id modeswitch_backfill --from-date … --to-date …`) for a range of windows. Refused,
with the reason, before anything is written: a window that ends in the future or lies beyond
the log's retention, a pipeline with nothing committed, and a window that another run is
backfilling. Params: `pipeline` (empty: the `modeswitch_pipeline` Variable's), `mode`,
`buckets` (empty: all), `settings` (other setting overrides).
Runs show on the [operator's page](/modeswitch/) as `backfill` commands.
"""


DAG_ID = "modeswitch_backfill"


@dag(
    dag_id=DAG_ID,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["modeswitch", "backfill"],
    doc_md=DOC,
    default_args={"owner": "modeswitch", "retries": 1, "retry_delay": timedelta(seconds=30)},
    params={
        "pipeline": Param("", type="string", description="target pipeline; empty: the Variable's"),
        "mode": Param("fill", type="string", enum=["fill", "reprocess"]),
        "buckets": Param([], type="array", description="buckets to backfill; empty: all"),
        "settings": Param({}, type="object", description="setting overrides, e.g. pipeline"),
    },
    **backfill_dag_options(),
)
def modeswitch_backfill():
    @task(task_id="plan", execution_timeout=timedelta(minutes=10))
    def plan(params=None, run_id=None, data_interval_start=None, data_interval_end=None):
        return plan_backfill_task(
            params,
            run_id=run_id,
            data_interval_start=data_interval_start,
            data_interval_end=data_interval_end,
        )

    job = EpochJobOperator(
        task_id="backfill",
        kind="backfill",
        decide_task_id="plan",
        execution_timeout=timedelta(hours=3),
    )

    @task(
        task_id="finish",
        trigger_rule="all_done",
        execution_timeout=timedelta(minutes=5),
        # A window that landed is an event on the sink's Asset, as a closed epoch is.
        outlets=[sink_alias(DAG_ID, "sink"), sink_alias(DAG_ID, "quarantine")],
    )
    def finish(plan, outlet_events=None):
        return finish_backfill_task(plan, outlet_events=outlet_events, dag_id=DAG_ID)

    planned = plan()
    planned >> job >> finish(planned)


modeswitch_backfill()
