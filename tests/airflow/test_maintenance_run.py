"""``dag.test()`` of the maintenance DAG: a run compacts a stream's small files and records
itself as a ``maintain`` command; the audit still finds every record once; a run while another
holds the lease fails with the reason and changes nothing."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from unittest import mock

from deltalake import DeltaTable
from fault_tools import commit_to_sink

from modeswitch.airflow.maintenance import maintenance_dag_options
from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.ops.verify import audit
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore

REPO = Path(__file__).resolve().parents[2]
PIPELINE = "afmaintain"


def _dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags" / "modeswitch_pipelines.py"))
    assert bag.import_errors == {}
    return bag.dags["modeswitch_maintenance"]


def test_the_dag_runs_hourly_one_run_at_a_time(airflow_db) -> None:
    dag = _dag()
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert "maintenance" in dag.tags and dag.doc_md
    [task] = dag.tasks
    assert task.retries >= 1 and task.execution_timeout < timedelta(hours=1)  # < the lease
    assert maintenance_dag_options({})["schedule"] == "@hourly"
    assert maintenance_dag_options({"MODESWITCH_MAINTENANCE_SCHEDULE": "none"}) == {
        "schedule": None
    }


def test_a_run_compacts_the_sink_and_the_audit_holds(airflow_db, tmp_path: Path) -> None:
    variables = {"pipeline": PIPELINE, "warehouse": str(tmp_path / "wh")}
    settings = PipelineSettings.from_mapping({**variables, "source": str(tmp_path / "log")})
    log = SegmentLog.create(settings.source, buckets=2)
    produce_backlog(log, EventGenerator(seed=1, buckets=2), records=800)
    store = StateStore.from_settings(settings)
    epoch = store.epochs.open("stream", "live", {0: 0, 1: 0})
    for sequence in range(40):  # a stream's micro-batches: a small file each
        commit = commit_to_sink(
            settings.sink, epoch, sequence, {0: 5 * sequence, 1: 5 * sequence},
            {0: 5 * sequence + 5, 1: 5 * sequence + 5}, mode="stream", pipeline=PIPELINE,
        )  # fmt: skip
        store.progress.record(commit)
    rows = DeltaTable(settings.sink).to_pyarrow_table().num_rows
    env = {f"AIRFLOW_VAR_MODESWITCH_{k.upper()}": v for k, v in variables.items()}
    env["AIRFLOW_VAR_MODESWITCH_SOURCE"] = settings.source

    with mock.patch.dict(os.environ, env):
        run = _dag().test()

    assert str(run.state) == "success"
    assert len(DeltaTable(settings.sink).file_uris()) == 1
    assert DeltaTable(settings.sink).to_pyarrow_table().num_rows == rows
    [command] = [c for c in store.commands.list() if c.kind == "maintain"]
    assert command.status == "applied" and command.issuer.startswith("airflow")
    sink = next(t for t in command.args["tables"] if t["table"] == "sink")
    assert (sink["files_before"], sink["files_after"]) == (40, 1)
    report = audit(
        settings.source,
        settings.sink,
        settings.quarantine,
        PIPELINE,
        summaries=store.commands.log_summaries(),
    )
    assert report.ok and report.totals.expected == 400

    # Another run holds the lease: this one fails with the reason and rewrites nothing.
    store.commands.claim_maintenance(run_id="elsewhere", issuer="test", lease=timedelta(hours=1))
    version = DeltaTable(settings.sink).version()
    dag = _dag()
    # No retry: dag.test() would wait out the task's retry_delay (a minute) to be refused again.
    dag.tasks[0].retries = 0
    with mock.patch.dict(os.environ, env):
        refused = dag.test()
    assert str(refused.state) == "failed"
    assert DeltaTable(settings.sink).version() == version
