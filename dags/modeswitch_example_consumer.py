"""A downstream DAG: runs when the pipeline lands an epoch in the sink, and reads its rows.

Wiring only: the callable lives in ``modeswitch.airflow.assets``.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from modeswitch.airflow.assets import rows_of_events, sink_alias

SINK = sink_alias("modeswitch_pipeline", "sink")

DOC = """
### modeswitch example consumer

Scheduled on the pipeline's sink: each epoch that `modeswitch_pipeline` closes is an event on
the sink table's Asset, through the alias `modeswitch_pipeline.sink`, and Airflow runs this
DAG for the events since its last run. Its task reads exactly the rows those epochs landed:
per bucket, the offsets from the epoch's start to its end (the event's extra), from the Delta
table as of the last version the epoch wrote. Run by hand (or by `dag.test()`, as `make demo`
does), it has no triggering events and reads every epoch the sink's Asset has events for
(its inlet). Copy it as the start of your own.
"""


@dag(
    dag_id="modeswitch_example_consumer",
    schedule=[SINK],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["modeswitch", "example"],
    doc_md=DOC,
)
def modeswitch_example_consumer():
    @task(task_id="read_landed_rows", inlets=[SINK])
    def read_landed_rows(triggering_asset_events=None, inlet_events=None):
        events = list(triggering_asset_events.get(SINK, [])) if triggering_asset_events else []
        if not events:  # run by hand: every epoch the sink has events for
            events = list(inlet_events[SINK])
        return rows_of_events(events)

    read_landed_rows()


modeswitch_example_consumer()
