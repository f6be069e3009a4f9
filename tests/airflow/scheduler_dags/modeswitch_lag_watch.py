"""A DAG for the scheduler test only: the deferrable lag sensor, waiting in the triggerer.

It watches pipeline ``lagwatch`` over the log named by the run's ``source`` param (nothing
of it is committed, so its offset lag is the log's size) until the offset lag exceeds 500.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag

from modeswitch.airflow.sensors import LagThresholdSensor


@dag(
    dag_id="modeswitch_lag_watch",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["modeswitch", "test"],
    default_args={"owner": "modeswitch", "retries": 0},
    params={"source": Param("", type="string", description="the log to watch")},
)
def modeswitch_lag_watch():
    LagThresholdSensor(
        task_id="wait_for_lag",
        offset_lag_threshold=500,
        settings={"pipeline": "lagwatch", "source": "{{ params.source }}"},
        poke_interval=1,
        timeout=600,
        execution_timeout=timedelta(minutes=15),
    )


modeswitch_lag_watch()
