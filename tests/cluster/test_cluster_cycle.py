"""The cycle on a real Spark standalone cluster: a master and two workers of one core each on
loopback (pip's pyspark, ``bin/spark-class``), started and stopped by this module, and Airflow
(``dag.test()`` runs, each a child process, as ``make demo`` runs them) with ``spark_default``
= ``spark://127.0.0.1:PORT`` in client deploy mode: the drivers run beside the tasks, the
executors in the workers' JVMs, with the same Python and package (an environment both sides
have, as in the Docker image).

batch (the default: each wave's tasks read, parse and write in the executors' Python workers)
-> stream -> batch (Spark's native reader and writer with Spark's from_json, in the warm
engine) -> the engine's own handoff to stream; every handoff exact, the audit 0/0, every job
an application of the cluster with executors on both workers."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest
from fault_tools import pause_when_caught_up

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.airflow_demo import DAG_ID, DagRuns
from modeswitch.devtools.airflow_local import airflow_environment, migrate
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.devtools.standalone import StandaloneCluster, application_names, executor_folders
from modeswitch.ops.verify import audit
from modeswitch.runners.engine import ENGINE_DIR_ENV, stop_engine
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore
from modeswitch.transforms.payload import EVENT_VALUE_SCHEMA

pytestmark = pytest.mark.cluster

PIPELINE = "onthecluster"


def test_the_cycle_runs_on_a_two_worker_standalone_cluster(
    cluster: StandaloneCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=4)
    produce_backlog(log, EventGenerator(seed=3, buckets=4, malformed_fraction=0.01), records=80_000)
    variables = {
        "pipeline": PIPELINE,
        "value_schema": EVENT_VALUE_SCHEMA,  # the demo's events, parsed: some quarantined
        "source": str(tmp_path / "log"),
        "warehouse": str(tmp_path / "warehouse"),
        "wave_records": "40000",
        "max_split_records": "20000",
        "trigger_interval": "500ms",
        "max_records_per_trigger": "20000",
        "max_stream_runtime": "10m",  # each stream is paused once it has caught up
        "min_time_in_stream": "0s",
        "exit_threshold": "1h",
        "enter_threshold": "2h",
        "watermark_lag_threshold": "2h",
        # The first two epochs a spark-submit each (what `auto` gives in cluster deploy mode);
        # the last two with `auto`, which chooses the engine on this client-mode master.
        "engine": "submit",
    }
    settings = PipelineSettings.from_mapping(variables)
    monkeypatch.setenv(ENGINE_DIR_ENV, str(tmp_path / "engines"))
    env = airflow_environment(tmp_path / "airflow", variables=variables)
    env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps(
        {
            "conn_type": "spark",
            "host": "spark://127.0.0.1",
            "port": cluster.port,
            "extra": {"deploy-mode": "client"},
        }
    )
    migrate(env)
    numbers = itertools.count(1)
    # The four runs in one child that imports Airflow once (as make demo runs them).
    runs = DagRuns({**env, ENGINE_DIR_ENV: os.environ[ENGINE_DIR_ENV]}, tmp_path / "runs.log")

    def dag_run(conf: dict) -> None:
        run_log = tmp_path / f"run-{next(numbers)}.log"
        code = runs.run(DAG_ID, run_log, conf)
        assert code == 0, run_log.read_text()[-3000:]

    try:
        with runs:
            dag_run({"force_mode": "batch"})  # the default: waves in the executors' Python workers
            produce_backlog(log, EventGenerator(seed=4, buckets=4), records=20_000, first=10**6)
            with pause_when_caught_up(settings, log.latest_offsets()):
                dag_run({"force_mode": "stream"})
            produce_backlog(log, EventGenerator(seed=5, buckets=4), records=60_000, first=2 * 10**6)
            # Spark's own reader and writer, and Spark's from_json, on the warm engine.
            spark_io = {
                "batch_reader": "native",
                "batch_writer": "native",
                "transform": "modeswitch.transforms:parse_events",
                "value_schema": "",  # the explicit transform parses the same payload
                "engine": "auto",
            }
            dag_run({"force_mode": "batch", "settings": spark_io})
            produce_backlog(log, EventGenerator(seed=6, buckets=4), records=20_000, first=3 * 10**6)
            # The engine hands off to this stream itself, before the run attaches to it.
            with pause_when_caught_up(settings, log.latest_offsets(), again=True):
                dag_run({"force_mode": "stream", "settings": {"engine": "auto"}})
    finally:
        stopped = stop_engine(settings)
    assert stopped, "the batch task started the engine, and it outlived the runs"

    epochs = StateStore.from_settings(settings).epochs.list()
    assert [e.mode for e in epochs[:4]] == ["batch", "stream", "batch", "stream"]
    assert all(e.status == "completed" for e in epochs), [(e.id, e.status) for e in epochs]
    for before, after in itertools.pairwise(epochs):
        assert after.start == before.end  # each handoff exact
    assert epochs[-1].end == log.latest_offsets()
    report = audit(log.root, settings.sink, settings.quarantine, PIPELINE)
    assert report.ok and report.totals.missing == report.totals.duplicated == 0, report
    assert report.totals.in_quarantine > 0  # the malformed records, through both batch paths

    # Every job ran as an application of the cluster, its executors in both workers.
    names = application_names(cluster)
    assert f"modeswitch-{PIPELINE}-batch-epoch-1" in names, names
    assert f"modeswitch-{PIPELINE}-stream-epoch-2" in names, names
    assert f"modeswitch-{PIPELINE}-engine" in names, names
    executors = executor_folders(cluster)
    assert all(executors.values()), executors
    # Their scratch (fetched jars, shuffle and block files) is under the cluster's own folder,
    # which its owner removes, not the machine's /tmp, where killed executors left 22 MB each.
    for folder in cluster.worker_dirs():
        said = "".join(p.read_text() for p in folder.glob("app-*/*/stderr"))
        assert f"Created local directory at {folder / 'local'}/" in said, folder
