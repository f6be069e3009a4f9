"""The pipeline's metrics reach the StatsD server Airflow's ``[metrics]`` section names,
through Airflow's own client: ``decide``'s mode, epoch and lags, a closed epoch's records and
handoff, each queued command; names under ``modeswitch.``, the pipeline as a tag (InfluxDB's
way here, ``statsd_influxdb_enabled``). The server is a UDP socket on loopback."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pendulum
import pytest

from modeswitch.airflow import metrics
from modeswitch.airflow.tasks import decide_task, submit_control_command
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.runners.lifecycle import EpochPlan
from modeswitch.sources.segments import SegmentLog

RECORDS = 2_000


@pytest.fixture
def statsd(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], dict[str, str]]]:
    """A StatsD server on loopback that Airflow's configuration names; ``received()`` gives
    the metrics it got so far, ``{name with tags: value|type}``."""
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(0.2)
    for key, value in {
        "STATSD_ON": "True",
        "STATSD_HOST": "127.0.0.1",
        "STATSD_PORT": str(server.getsockname()[1]),
        "STATSD_PREFIX": "airflow",
        "STATSD_INFLUXDB_ENABLED": "True",
    }.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", value)
    monkeypatch.setattr(metrics, "_initialized", False)  # a client for this configuration
    got: dict[str, str] = {}

    def received() -> dict[str, str]:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                packet = server.recv(65536).decode()
            except TimeoutError:
                continue
            for line in packet.splitlines():
                name, _, value = line.partition(":")
                got[name] = value
        return dict(got)

    try:
        yield received
    finally:
        server.close()
        metrics._initialized = False  # the next user makes a client for its configuration


@pytest.fixture
def variables(tmp_path: Path) -> dict[str, str]:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=2)
    produce_backlog(
        log, EventGenerator(seed=1, buckets=2), records=RECORDS, span=timedelta(hours=2)
    )
    return {
        "modeswitch_pipeline": "metered",
        "modeswitch_source": str(tmp_path / "log"),
        "modeswitch_warehouse": str(tmp_path / "warehouse"),
    }


def test_decide_and_commands_send_their_metrics_tagged_with_the_pipeline(statsd, variables) -> None:
    plan = decide_task({}, get_variable=variables.get)
    assert (plan["epoch"], plan["mode"]) == (1, "batch")
    submit_control_command({"command": "pause"}, get_variable=variables.get)
    got = statsd()
    tagged = ",pipeline=metered"
    assert got[f"airflow.modeswitch.mode{tagged}"] == "1|g"  # batch
    assert got[f"airflow.modeswitch.epoch{tagged}"] == "1|g"
    assert got[f"airflow.modeswitch.offset_lag{tagged}"] == f"{RECORDS}|g"  # nothing committed
    # No watermark before anything is committed: no lag to send.
    assert f"airflow.modeswitch.watermark_lag_seconds{tagged}" not in got
    assert got[f"airflow.modeswitch.decisions{tagged}"] == "1|c"
    assert got[f"airflow.modeswitch.switches{tagged}"] == "1|c"
    assert got[f"airflow.modeswitch.commands{tagged},kind=pause"] == "1|c"


def test_a_closed_epoch_sends_its_records_rate_and_handoff(statsd) -> None:
    began = pendulum.datetime(2026, 11, 26, 12, 0, 0)
    metrics.send_epoch_closed(
        "metered",
        records=1_000,
        quarantined=7,
        started_at=began,
        ended_at=began.add(seconds=4),
        handoff_seconds=2.5,
    )
    got = statsd()
    tagged = ",pipeline=metered"
    assert got[f"airflow.modeswitch.epoch_records{tagged}"] == "1000|c"
    assert got[f"airflow.modeswitch.epoch_quarantined{tagged}"] == "7|c"
    assert got[f"airflow.modeswitch.records_per_second{tagged}"] == "250.0|g"
    assert got[f"airflow.modeswitch.handoff_seconds{tagged}"] == "2500.000000|ms"


def test_a_decision_with_a_watermark_sends_its_lag(statsd) -> None:
    plan = EpochPlan(
        epoch=None,
        mode="stream",
        reason="caught up",
        start={},
        boundary=None,
        decision={
            "switched": False,
            "watermark": {"lag_seconds": 12.5},
            "observation": {"latest": {"0": 10, "1": 5}, "committed": {"0": 7}},
        },
    )
    metrics.send_decision("metered", plan)
    got = statsd()
    tagged = ",pipeline=metered"
    assert got[f"airflow.modeswitch.watermark_lag_seconds{tagged}"] == "12.5|g"
    assert got[f"airflow.modeswitch.offset_lag{tagged}"] == "8|g"
    assert got[f"airflow.modeswitch.mode{tagged}"] == "0|g"  # no epoch to run
    assert f"airflow.modeswitch.switches{tagged}" not in got


def test_every_metric_sent_is_in_the_documented_table() -> None:
    documented = Path(__file__).parents[2] / "docs" / "OPERATIONS.md"
    text = documented.read_text()
    for name in metrics.METRICS:
        assert f"`{metrics.PREFIX}{name}`" in text, name
