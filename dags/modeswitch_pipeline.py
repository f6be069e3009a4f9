"""The modeswitch pipeline: each run is one epoch, decided, run and closed.

Wiring only: the task callables live in ``modeswitch.airflow``; settings are read from
Variables at run time, never here.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag, task

from modeswitch.airflow.assets import sink_alias
from modeswitch.airflow.operators import EpochJobOperator
from modeswitch.airflow.tasks import branch_for, close_task, decide_task

DOC = """
### modeswitch pipeline

One run = one **epoch**. `decide` resolves the settings (code defaults < the
`modeswitch_config_file` Variable < `modeswitch_<setting>` Variables < the run's `settings`
param), reads the control tables and the source's offsets, applies pending commands and opens
the epoch (or re-attaches to a running one after a retry). The branch runs the
**backlog_batch** job (up to the recorded boundary) or the **stream** job (from the exact
handoff offsets, until the policy, a command or `max_stream_runtime` stops it), each with
`spark-submit` on the `spark_default` connection. `close_epoch` checks that every bucket
reached its boundary, or records where the stream stopped and why. The next run decides again.

Trigger params: `force_mode` (auto, batch, stream), `dry_run` (decide and show, write
nothing) and `settings` (per-run overrides, e.g. `{"max_stream_runtime": "60s"}`).

**[What the pipeline is doing and why](/modeswitch/)**: mode, lag against the thresholds,
every decision and command (also under *Modeswitch* in the navigation).

**Assets**: each closed epoch is an event on the sink table's Asset (and on the quarantine's
when it quarantined records), through the aliases `modeswitch_pipeline.sink` and
`modeswitch_pipeline.quarantine`; its extra holds the epoch, mode, records and the Delta
versions written. A DAG with `schedule=[AssetAlias("modeswitch_pipeline.sink")]` runs on them
(see `modeswitch_example_consumer`).
"""


DAG_ID = "modeswitch_pipeline"


@dag(
    dag_id=DAG_ID,
    schedule="@continuous",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["modeswitch", "spark", "delta"],
    doc_md=DOC,
    default_args={
        "owner": "modeswitch",
        "retries": 2,
        "retry_delay": timedelta(seconds=30),
    },
    params={
        "force_mode": Param(
            "auto", type="string", enum=["auto", "batch", "stream"], description="override"
        ),
        "dry_run": Param(False, type="boolean", description="decide and show; write nothing"),
        "settings": Param({}, type="object", description="per-run setting overrides (raw strings)"),
    },
)
def modeswitch_pipeline():
    @task(task_id="decide", execution_timeout=timedelta(minutes=5))
    def decide(params=None, run_id=None):
        return decide_task(params, run_id=run_id)

    @task.branch(task_id="branch", execution_timeout=timedelta(minutes=1))
    def branch(plan):
        return branch_for(plan)

    backlog_batch = EpochJobOperator(
        task_id="backlog_batch", kind="batch", execution_timeout=timedelta(hours=3)
    )
    stream = EpochJobOperator(task_id="stream", kind="stream", execution_timeout=timedelta(hours=1))

    @task(
        task_id="close_epoch",
        trigger_rule="none_failed_min_one_success",
        execution_timeout=timedelta(minutes=5),
        # Each closed epoch is an event on the sink's Asset (and the quarantine's): the tables
        # are known at run time, so the events go through the DAG's aliases.
        outlets=[sink_alias(DAG_ID, "sink"), sink_alias(DAG_ID, "quarantine")],
    )
    def close(plan, outlet_events=None):
        return close_task(plan, outlet_events=outlet_events, dag_id=DAG_ID)

    plan = decide()
    branch(plan) >> [backlog_batch, stream]
    [backlog_batch, stream] >> close(plan)


modeswitch_pipeline()
