"""``dag.test()`` of the pipeline DAG on a Kafka topic of a real broker, its client
configuration the extras of an Airflow Connection that hold a marker secret, the epochs in the
default runner (``engine = auto``: the warm engine here). A batch epoch then a stream epoch,
every record once; the secret reaches the engine (its environment) and is on no command line
of any process the run started (the engine, its JVM, its Python workers) and in no file it
wrote: task logs, the engine's address file and log, the tables, the checkpoints, Airflow's
metadata DB."""

from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

import pytest
from fault_tools import CommandLineWatch, files_holding
from test_stream_retry import _dag, _states
from test_warm_engine import engine_pid, run_stream_until

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.ops.verify import audit
from modeswitch.runners.engine import ENGINE_DIR_ENV, EngineAddress, engine_file, stop_engine
from modeswitch.sources.kafka import ENV_KAFKA_CONFIG, SCHEME, KafkaLog, kafka_environment
from modeswitch.state import StateStore

pytestmark = pytest.mark.airflow

SECRET = "kafka-airflow-s3cr3t-7f3a"


def test_a_kafka_pipeline_under_airflow_keeps_the_connections_secret_off_every_trace(
    airflow_db: Path, tmp_path: Path
) -> None:
    with KafkaBroker(tmp_path / "broker") as broker:
        broker.create_topic("events", 4)
        # sasl.password with a plaintext listener: the clients take it and do not use it; here
        # it stands for any secret of the client configuration.
        extras = {**broker.config, "sasl.password": SECRET}
        topic = KafkaLog(f"{SCHEME}events", extras)
        produce_backlog(topic, EventGenerator(seed=3, buckets=4), records=20_000)
        variables = {
            "pipeline": "kafka_af",
            "source": f"{SCHEME}events",
            "warehouse": str(tmp_path / "warehouse"),
            "kafka_connection": "team_kafka",
            "trigger_interval": "500ms",
            "max_stream_runtime": "30m",  # the stream is stopped by the test's command
            "min_time_in_stream": "0s",
            "exit_threshold": "1h",
            "enter_threshold": "2h",
            "watermark_lag_threshold": "2h",
        }
        env = {f"AIRFLOW_VAR_MODESWITCH_{k.upper()}": v for k, v in variables.items()}
        env["AIRFLOW_CONN_TEAM_KAFKA"] = json.dumps({"conn_type": "kafka", "extra": extras})
        env[ENGINE_DIR_ENV] = str(tmp_path / "engines")
        settings = PipelineSettings.from_mapping(variables)
        pipeline = _dag("modeswitch_pipeline")
        with (
            mock.patch.dict(os.environ, env),
            CommandLineWatch(ENGINE_DIR_ENV, env[ENGINE_DIR_ENV], SECRET) as lines,
        ):
            os.environ.pop(ENV_KAFKA_CONFIG, None)  # the tasks must get it from the Connection
            try:
                run = pipeline.test(run_conf={"force_mode": "batch", "dry_run": False})
                assert str(run.state) == "success", _states(run)
                assert engine_pid(settings) is not None  # the default chose the engine
                produce_backlog(
                    topic, EventGenerator(seed=4, buckets=4), records=2_000, first=1_000_000
                )
                target = topic.latest_offsets()
                run = run_stream_until(pipeline, settings, target, lambda: None)
                assert str(run.state) == "success", _states(run)
            finally:
                stop_engine(settings)
        assert EngineAddress.read(engine_file(settings)) is None
        epochs = StateStore.from_settings(settings).epochs.list()
        assert [(e.mode, e.status) for e in epochs] == [
            ("batch", "completed"),
            ("stream", "completed"),
        ]
        assert epochs[1].start == epochs[0].end and epochs[1].end == target
        with mock.patch.dict(os.environ, kafka_environment(extras)):
            report = audit(settings.source, settings.sink, settings.quarantine, "kafka_af")
        assert report.ok and report.totals.expected == 22_000, report
        assert (report.totals.missing, report.totals.duplicated) == (0, 0), report
    assert len(lines.seen) > 3 and lines.holding == []
    assert any((tmp_path / "engines").iterdir()), "the engine's log is among the files"
    assert files_holding(tmp_path, SECRET) == []  # the broker's folder too
    assert files_holding(Path(os.environ["AIRFLOW_HOME"]), SECRET) == []
