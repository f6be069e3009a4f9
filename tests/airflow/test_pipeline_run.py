"""``dag.test()`` of the pipeline DAG against local Spark: one run is one epoch. A batch epoch
drains the backlog to its boundary; the next run's stream epoch starts exactly there, and a
command queued through the control DAG's task stops it at a commit boundary (sent once the
stream has committed a micro-batch; its runtime limit is ten minutes, so only the command can
end it within the test's time)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from unittest import mock

import pytest
from fault_tools import wait_for

from modeswitch.airflow.tasks import submit_control_command
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.sinks.commits import sink_commits
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore

REPO = Path(__file__).resolve().parents[2]
RECORDS = 20_000


@pytest.fixture
def pipeline_env(airflow_db, tmp_path: Path):
    log = SegmentLog.create(str(tmp_path / "log"), buckets=4)
    produce_backlog(log, EventGenerator(seed=3, buckets=4), records=RECORDS)
    variables = {
        "pipeline": "aftest",
        "source": str(tmp_path / "log"),
        "warehouse": str(tmp_path / "warehouse"),
        # The spark-submit per epoch (the default on YARN, Kubernetes, cluster deploy mode);
        # tests/airflow/test_warm_engine.py runs the default here, the warm engine.
        "engine": "submit",
        "trigger_interval": "500ms",
        "max_stream_runtime": "10m",
        "min_time_in_stream": "0s",
        "exit_threshold": "1h",
        "enter_threshold": "2h",
        "watermark_lag_threshold": "2h",
    }
    env = {f"AIRFLOW_VAR_MODESWITCH_{k.upper()}": v for k, v in variables.items()}
    with mock.patch.dict(os.environ, env):
        yield StateStore(
            str(tmp_path / "warehouse" / "_modeswitch" / "aftest"),
            str(tmp_path / "warehouse" / "aftest"),
            "aftest",
        )


def _dag(dag_id: str):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dag_file(dag_id)))
    assert bag.import_errors == {}
    return bag.dags[dag_id]


def _states(run) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def test_batch_then_stream_epoch_with_a_control_command(
    pipeline_env: StateStore, tmp_path: Path, asset_events, openlineage_events
) -> None:
    store = pipeline_env
    pipeline = _dag("modeswitch_pipeline")

    run = pipeline.test(run_conf={"dry_run": True})
    states = _states(run)
    assert states["decide"] == "success", states
    assert {states["backlog_batch"], states["stream"], states["close_epoch"]} == {"skipped"}
    assert store.epochs.list() == []  # a dry run decides and shows, and writes nothing

    run = pipeline.test(run_conf={"force_mode": "auto", "dry_run": False})
    states = _states(run)
    assert str(run.state) == "success", states
    assert states["stream"] == "skipped"
    [batch] = store.epochs.list()
    assert (batch.mode, batch.status) == ("batch", "completed")
    assert sum(batch.end.values()) == sum(batch.boundary.values()) == RECORDS
    # The closed epoch is an event on the sink's Asset, through the pipeline DAG's alias.
    sink = tmp_path / "warehouse" / "aftest"
    [(extra, alias)] = asset_events(f"file://{sink}")
    assert alias == "modeswitch_pipeline.sink"
    assert (extra["epoch"], extra["mode"]) == (batch.id, "batch")
    assert extra["records"] + extra["quarantined"] == RECORDS
    assert extra["end_offsets"] == {str(b): o for b, o in batch.end.items()}
    assert extra["max_event_time"] is not None
    # The epoch task's OpenLineage events: the log in, the sink and the quarantine out, under
    # the DAG run (the provider's parent run facet).
    *_, complete = openlineage_events("modeswitch_pipeline", "backlog_batch", 2)
    assert complete["eventType"] == "COMPLETE", complete
    assert [(d["namespace"], d["name"]) for d in complete["inputs"]] == [
        ("file", str(tmp_path / "log"))
    ]
    assert [(d["namespace"], d["name"]) for d in complete["outputs"]] == [
        ("file", str(sink)),
        ("file", str(tmp_path / "warehouse" / "aftest_quarantine")),
    ]
    parent = complete["run"]["facets"]["parent"]["job"]
    assert (parent["namespace"], parent["name"]) == ("modeswitch-tests", "modeswitch_pipeline")

    log = SegmentLog(str(tmp_path / "log"))
    produce_backlog(log, EventGenerator(seed=4, buckets=4), records=2_000, first=10**6)

    def switch_once_streaming() -> None:
        try:  # if the stream never commits, the command still ends it, and the asserts fail
            wait_for(
                lambda: any(
                    c.mode == "stream"
                    for c in sink_commits(str(tmp_path / "warehouse" / "aftest"), "aftest")
                ),
                "the stream's first commit",
                timeout=300,
            )
        finally:
            submit_control_command(
                {"command": "switch_to_batch", "note": "test"},
                get_variable=lambda key: os.environ.get(f"AIRFLOW_VAR_{key.upper()}"),
            )

    switcher = threading.Thread(target=switch_once_streaming)
    switcher.start()
    run = pipeline.test(run_conf={"force_mode": "stream", "dry_run": False})
    switcher.join()
    states = _states(run)
    assert str(run.state) == "success", states
    assert states["backlog_batch"] == "skipped"
    _, stream = store.epochs.list()
    assert (stream.mode, stream.status) == ("stream", "completed")
    assert stream.start == batch.end  # the exact handoff
    assert sum(stream.end.values()) > RECORDS  # it read some of the new records
    assert "command" in (stream.end_reason or ""), stream.end_reason  # not its 10 min runtime
    [command] = store.commands.list()
    assert (command.kind, command.status) == ("switch_to_batch", "applied")
    assert command.applied_epoch == stream.id
    events = [extra for extra, _ in asset_events(f"file://{sink}")]
    assert [(e["epoch"], e["mode"]) for e in events] == [(batch.id, "batch"), (stream.id, "stream")]
    assert events[1]["start_offsets"] == events[0]["end_offsets"]
    landed = events[1]["records"] + events[1]["quarantined"]
    assert landed == sum(stream.end.values()) - RECORDS > 0

    # The consumer DAG run by hand (no triggering events) reads every epoch the sink's Asset
    # has an event for, each exactly (make demo runs it so).
    consumer = _dag("modeswitch_example_consumer")
    run = consumer.test()
    assert str(run.state) == "success", _states(run)
    read = run.get_task_instance("read_landed_rows").xcom_pull(task_ids="read_landed_rows")
    # The alias has the sinks of this tier's other pipelines too: this one's, in order.
    mine = [e for e in read["epochs"] if e["table"] == f"file://{sink}"]
    assert [(e["epoch"], e["rows"]) for e in mine] == [
        (batch.id, events[0]["records"]),
        (stream.id, events[1]["records"]),
    ]


def dag_file(dag_id: str) -> Path:
    """An example DAG's own file, else the pipelines' factory."""
    own = REPO / "dags" / f"{dag_id}.py"
    return own if own.exists() else REPO / "dags" / "modeswitch_pipelines.py"
