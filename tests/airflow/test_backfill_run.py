"""``dag.test()`` of the backfill DAG against local Spark, while the pipeline streams: a
pipeline that went live at once (``start_from = latest``) gets yesterday's history filled in
by one run, every record once; a second run of the same window leaves the same rows."""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from pathlib import Path
from unittest import mock

import pendulum
import pytest
from deltalake import DeltaTable
from fault_tools import records_in_window

from modeswitch.airflow.backfill import backfill_dag_options
from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import ConfigError
from modeswitch.modes.backfill_commits import backfill_commits
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import run_job_process
from modeswitch.sinks.commits import committed_offsets, sink_commits
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore

REPO = Path(__file__).resolve().parents[2]
TODAY = pendulum.now("UTC").start_of("day")
YESTERDAY = TODAY.subtract(days=1)
GENERATOR = EventGenerator(
    seed=5, buckets=3, late_fraction=0.05, malformed_fraction=0.01, max_lateness=timedelta(hours=3)
)


def _dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags" / "modeswitch_pipelines.py"))
    assert bag.import_errors == {}
    return bag.dags["modeswitch_backfill"]


def _rows(settings: PipelineSettings) -> list[dict]:
    table = DeltaTable(settings.sink).to_pyarrow_table()
    return table.sort_by([("bucket", "ascending"), ("offset", "ascending")]).to_pylist()


def test_the_dag_is_scheduled_by_time_and_refuses_a_schedule_without_windows(airflow_db) -> None:
    dag = _dag()
    assert dag.max_active_runs == 2 and dag.catchup is False
    assert dag.timetable.infer_manual_data_interval(run_after=TODAY) == (YESTERDAY, TODAY)
    hourly = backfill_dag_options({"MODESWITCH_BACKFILL_SCHEDULE": "@hourly"})["schedule"]
    assert hourly.infer_manual_data_interval(run_after=TODAY) == (TODAY.subtract(hours=1), TODAY)
    with pytest.raises(ConfigError, match="MODESWITCH_BACKFILL_SCHEDULE"):
        backfill_dag_options({"MODESWITCH_BACKFILL_SCHEDULE": "every day"})
    with pytest.raises(ConfigError, match="MODESWITCH_BACKFILL_SCHEDULE"):
        backfill_dag_options({"MODESWITCH_BACKFILL_SCHEDULE": "@continuous"})
    with pytest.raises(ConfigError, match="MODESWITCH_BACKFILL_MAX_ACTIVE_RUNS"):
        backfill_dag_options({"MODESWITCH_BACKFILL_MAX_ACTIVE_RUNS": "0"})


def test_a_window_is_filled_while_the_pipeline_streams(
    airflow_db, tmp_path: Path, asset_events
) -> None:
    variables = {
        "pipeline": "afbackfill",
        "source": str(tmp_path / "log"),
        "warehouse": str(tmp_path / "warehouse"),
        "start_from": "latest",
        "trigger_interval": "500ms",
        "max_stream_runtime": "5m",
        "min_time_in_stream": "0s",
        "exit_threshold": "1h",
        "enter_threshold": "2h",
        "watermark_lag_threshold": "2h",
    }
    settings = PipelineSettings.from_mapping(variables)
    log = SegmentLog.create(settings.source, buckets=3)
    produce_backlog(
        log, GENERATOR, records=24_000, span=timedelta(days=2), now=TODAY, segment_records=4_000
    )
    history = log.latest_offsets()
    live = decide(settings, force_mode="stream")
    assert live.start == history
    store = StateStore.from_settings(settings)

    def produce_live_then_pause() -> None:
        """Live records all through the backfill, so that live commits land beside it."""
        first = 24_000
        while not backfilled.wait(0.5):
            produce_backlog(log, GENERATOR, records=200, first=first)
            first += 200
        while committed_offsets(settings.sink, "afbackfill") != log.latest_offsets():
            threading.Event().wait(0.5)
        store.commands.submit("pause", {"note": "test over"}, issuer="test")

    backfilled = threading.Event()
    stream = threading.Thread(
        target=run_job_process, args=("stream", settings, live.epoch), kwargs={"timeout": 600}
    )
    feeder = threading.Thread(target=produce_live_then_pause, daemon=True)
    stream.start()
    feeder.start()
    env = {f"AIRFLOW_VAR_MODESWITCH_{k.upper()}": v for k, v in variables.items()}
    try:
        with mock.patch.dict(os.environ, env):
            while not committed_offsets(settings.sink, "afbackfill"):  # streaming, live
                threading.Event().wait(0.5)
            started_at = DeltaTable(settings.sink).version()
            run = _dag().test(logical_date=TODAY, run_conf={"mode": "fill"})
            states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
            assert str(run.state) == "success", states
    finally:
        backfilled.set()
        stream.join(timeout=700)
    assert not stream.is_alive()
    close_epoch(settings, live.epoch)

    [commit] = backfill_commits(settings.sink, "afbackfill")
    assert (commit.mode, commit.window.start, commit.window.end) == ("fill", YESTERDAY, TODAY)
    filled = records_in_window(log, YESTERDAY, TODAY, history)
    assert commit.records + commit.quarantined == filled > 0
    report = audit(settings.source, settings.sink, settings.quarantine, "afbackfill")
    totals = report.totals
    assert (totals.missing, totals.duplicated, totals.out_of_range) == (0, 0, 0), report
    live_records = sum(log.latest_offsets().values()) - sum(history.values())
    assert totals.expected == live_records + filled
    # Live micro-batches committed while the backfill ran, and its commit landed among them.
    beside = [
        c
        for c in sink_commits(settings.sink, "afbackfill")
        if started_at < c.table_version < commit.table_version
    ]
    assert beside, "no live commit landed while the backfill ran"
    [ran] = [c for c in store.commands.list() if c.kind == "backfill"]
    assert (ran.status, ran.args["records"]) == ("applied", commit.records)
    # The window that landed is an event on the sink's Asset, through the backfill DAG's alias.
    [(extra, alias)] = asset_events(f"file://{settings.sink}")
    assert alias == "modeswitch_backfill.sink"
    assert (extra["backfill"], extra["mode"], extra["command"]) == (True, "fill", ran.id)
    assert (extra["records"], extra["last_version"]) == (commit.records, commit.table_version)
    assert extra["window_start"] == YESTERDAY.isoformat()

    before, version = _rows(settings), DeltaTable(settings.sink).version()
    # The target pipeline as a param, over a Variable that names another.
    with mock.patch.dict(os.environ, {**env, "AIRFLOW_VAR_MODESWITCH_PIPELINE": "other"}):
        run = _dag().test(logical_date=TODAY, run_conf={"mode": "fill", "pipeline": "afbackfill"})
    assert str(run.state) == "success"
    assert _rows(settings) == before
    assert DeltaTable(settings.sink).version() == version + 1
