"""Lag alerts of the modeswitch pipeline: Airflow notifiers told once per breach and recovery.

Wiring only: the task callable lives in ``modeswitch.airflow.alerts``; the schedule comes from
the environment when the file is parsed, settings from Variables at run time.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag, task

from modeswitch.airflow.alerts import TASK_ID, alerts_dag_options, lag_alert_task

DOC = """
### modeswitch lag alerts

Each run measures the pipeline's watermark lag and offset lag (as `decide` does, without
Spark). When one stays above its **alert** threshold (`alert_watermark_lag`,
`alert_offset_lag`: apart from the switching thresholds) for `alert_after`, the notifiers
named by `alert_notifiers` (`module:name` of Airflow notifiers, e.g. an `SmtpNotifier` or
`SlackNotifier` of your own module) are called once; once the lag is back under, once more.
A lag that flaps for less than `alert_after` tells no one. Each alert is also in the
pipeline's decisions (`decided_by = alerts`), on the [operator's page](/modeswitch/). Runs
apart from the pipeline DAG, so a pipeline whose own runs are stuck is still watched; every
minute by default (`MODESWITCH_ALERTS_SCHEDULE`: `30s`, a cron expression, or `none`).
Skipped while no alert threshold is set. Param `settings`: setting overrides for the run.
"""


@dag(
    dag_id="modeswitch_lag_alerts",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["modeswitch", "alerts"],
    doc_md=DOC,
    default_args={"owner": "modeswitch", "retries": 0},
    params={"settings": Param({}, type="object", description="setting overrides")},
    **alerts_dag_options(),
)
def modeswitch_lag_alerts():
    @task(task_id=TASK_ID, execution_timeout=timedelta(minutes=2))
    def check_lag(params=None, **context):
        return lag_alert_task(
            {"params": params, **context}, overrides=(params or {}).get("settings")
        )

    check_lag()


modeswitch_lag_alerts()
