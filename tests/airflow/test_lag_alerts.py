"""``dag.test()`` of the lag alerts DAG: a breach tells the notifier once, and the next runs,
reading the newest state back from the XCom of the runs before, do not tell it again."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

from notifier_tools import RecordingNotifier

from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.sources.segments import SegmentLog

REPO = Path(__file__).resolve().parents[2]


RECORDER = RecordingNotifier("{{ modeswitch_alert.pipeline }} {{ modeswitch_alert.event }}")


def test_a_breach_is_told_once_across_runs(airflow_db, tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    log = SegmentLog.create(str(tmp_path / "log"), buckets=2)
    produce_backlog(log, EventGenerator(seed=8, buckets=2), records=500)
    variables = {
        "pipeline": "alerted",
        "source": str(tmp_path / "log"),
        "warehouse": str(tmp_path / "warehouse"),
        "alert_offset_lag": "100",
        "alert_after": "0s",
        "alert_notifiers": f"{__name__}:RECORDER",
    }
    env = {f"AIRFLOW_VAR_MODESWITCH_{k.upper()}": v for k, v in variables.items()}
    bag = DagBag(dag_folder=str(REPO / "dags" / "modeswitch_pipelines.py"))
    assert bag.import_errors == {}
    dag = bag.dags["modeswitch_lag_alerts"]
    with mock.patch.dict(os.environ, env):
        runs = [dag.test() for _ in range(3)]
    assert [str(run.state) for run in runs] == ["success"] * 3
    assert RECORDER.sent == ["alerted breach"]
