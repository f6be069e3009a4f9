"""A downstream DAG on the sink's live Asset: runs while an epoch runs, at most once per
``asset_event_interval``, and reads the rows committed since its last run.

Wiring only: the callable lives in ``modeswitch.airflow.assets``.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from modeswitch.airflow.assets import live_sink_asset, rows_of_events

LIVE = live_sink_asset("modeswitch_pipeline")

DOC = """
### modeswitch example live consumer

Scheduled on the sink's **live** Asset, `modeswitch_pipeline.sink.live`. Airflow's triggerer
watches the pipeline's progress table (an `AssetWatcher`) and, while an epoch commits, emits
at most one event per `asset_event_interval` (a setting, 1 min by default) for the commits
since the last one; a stream epoch's rows reach this DAG without waiting for the epoch to
close. Its task reads exactly the rows of those commits: per bucket, the offsets in the
event's extra, from the Delta table (`table` in the extra) as of its `last_version`. Each row
is in one event. Schedule a DAG on this Asset or on the per-epoch alias
(`modeswitch_example_consumer`), not both: their events overlap.
"""


@dag(
    dag_id="modeswitch_example_live_consumer",
    schedule=[LIVE],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["modeswitch", "example"],
    doc_md=DOC,
)
def modeswitch_example_live_consumer():
    @task(task_id="read_new_rows")
    def read_new_rows(triggering_asset_events=None):
        return rows_of_events(triggering_asset_events[LIVE])

    read_new_rows()


modeswitch_example_live_consumer()
