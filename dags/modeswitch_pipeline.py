"""The modeswitch pipeline: each run is one epoch, decided, run and closed.

Wiring only: the task callables live in ``modeswitch.airflow``; settings are read from
Variables at run time, never here.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag, task

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
"""


@dag(
    dag_id="modeswitch_pipeline",
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
    )
    def close(plan):
        return close_task(plan)

    plan = decide()
    branch(plan) >> [backlog_batch, stream]
    [backlog_batch, stream] >> close(plan)


modeswitch_pipeline()
