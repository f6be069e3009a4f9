"""Maintenance of the modeswitch pipeline's tables, beside the running pipeline.

Wiring only: the task callable lives in ``modeswitch.airflow.maintenance``; the schedule
comes from the environment when the file is parsed, settings from Variables at run time.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag, task

from modeswitch.airflow.maintenance import maintain_task, maintenance_dag_options

DOC = """
### modeswitch maintenance

A stream commits every micro-batch, so the sink gathers small files and log entries, and the
control tables grow. Each run, **while the pipeline runs**:

- compacts the sink's and the quarantine's small files (`compact_target_mb`), checkpoints
  their Delta logs, cleans log files past the table's `delta.logRetentionDuration` (30 days
  by default) and vacuums files removed more than `vacuum_retention` ago (7 days; at least
  1 hour);
- merges `progress` rows older than `progress_horizon` (one per epoch and hour), rewrites and
  vacuums the control tables;
- deletes the Spark checkpoints of ended stream epochs beyond `stream_checkpoints_kept`.

Before it cleans the sink's log it records a summary of the commits there, which
`modeswitch verify` reads in their place. One run at a time per pipeline: a run holds the
pipeline's maintenance lease (`maintenance_lease`, 1 hour) and a second is refused. Runs show
on the [operator's page](/modeswitch/) as `maintain` commands. Params: `pipeline` (empty:
the `modeswitch_pipeline` Variable's), `settings` (other setting overrides).
"""


@dag(
    dag_id="modeswitch_maintenance",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["modeswitch", "maintenance"],
    doc_md=DOC,
    default_args={"owner": "modeswitch", "retries": 1, "retry_delay": timedelta(minutes=1)},
    params={
        "pipeline": Param("", type="string", description="target pipeline; empty: the Variable's"),
        "settings": Param({}, type="object", description="setting overrides"),
    },
    **maintenance_dag_options(),
)
def modeswitch_maintenance():
    @task(task_id="maintain", execution_timeout=timedelta(minutes=50))
    def maintain(params=None, run_id=None):
        return maintain_task(params, run_id=run_id)

    maintain()


modeswitch_maintenance()
