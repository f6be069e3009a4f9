"""Operator controls for a running modeswitch pipeline: one command per manual run.

Wiring only: validation and the control table live in ``modeswitch.airflow.tasks``.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag, task

from modeswitch.airflow.tasks import submit_control_command

DOC = """
### modeswitch control

Queue a command for the pipeline: `switch_to_batch`, `switch_to_stream`, `pause`, `resume`
or `rewind`. A running stream job applies switch and pause commands at its next commit
boundary (between micro-batches); otherwise the next `decide` applies them. `rewind` takes
either `offsets` (e.g. `{"0": 120, "3": 0}`) or `event_time` (ISO-8601: per bucket, the first
offset at or after it): the next `decide` deletes what the sink holds at or above those
offsets in one recorded commit and the next epoch reprocesses from there, exactly once (a
running stream stops for it; a running batch epoch finishes first). Bad params are refused
before anything is written; a rewind that no longer fits (above the committed offsets, below
retention) is rejected with the reason when `decide` applies it.
"""


@dag(
    dag_id="modeswitch_control",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["modeswitch", "control"],
    doc_md=DOC,
    default_args={"owner": "modeswitch", "retries": 0},
    params={
        "command": Param(
            "pause",
            type="string",
            enum=["switch_to_batch", "switch_to_stream", "pause", "resume", "rewind"],
        ),
        "offsets": Param(None, type=["null", "object"], description="rewind: bucket -> offset"),
        "event_time": Param(None, type=["null", "string"], description="rewind: ISO-8601"),
        "note": Param("", type="string", description="why (stored with the command)"),
        "settings": Param({}, type="object", description="setting overrides, e.g. pipeline"),
    },
)
def modeswitch_control():
    @task(task_id="submit_command", execution_timeout=timedelta(minutes=10))
    def submit(params=None, run_id=None):
        return submit_control_command(params, run_id=run_id)

    submit()


modeswitch_control()
