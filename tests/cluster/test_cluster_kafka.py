"""A Kafka source on the standalone cluster: the executors' Python readers open the topic with
the client configuration the driver's session sends them (``spark.executorEnv``, redacted),
not with an environment they would not have on a real cluster (the workers here are started
without it). The broker is Apache Kafka (one KRaft node on loopback, started and stopped
here); its client configuration carries a secret that must not reach any file the cluster
writes.

The tables' storage options (``MODESWITCH_STORAGE_OPTIONS``) carry a secret too, under a key
Spark's default redaction does not match (``AWS_ACCESS_KEY_ID``): neither secret may reach the
jobs' Spark event logs, which hold the application's properties and every query's plans as
Spark's UI and history server show them (``spark.sql.ui.explainMode=extended`` puts the
logical plans there, with each write's data source options)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.devtools.standalone import StandaloneCluster, executor_folders
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import run_job_process
from modeswitch.sources.kafka import ENV_KAFKA_CONFIG, SCHEME, KafkaLog
from modeswitch.storage import ENV_STORAGE_OPTIONS

pytestmark = pytest.mark.cluster

SECRET = "cluster-tier-s3cr3t"
STORAGE_SECRET = "AKIA-cluster-tier-key"


def test_a_kafka_source_reads_on_the_cluster_with_credentials_sent_by_the_session(
    cluster: StandaloneCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with KafkaBroker(tmp_path / "broker") as broker:
        broker.create_topic("events", 4)
        config = {**broker.config, "sasl.password": SECRET}
        produce_backlog(
            KafkaLog(f"{SCHEME}events", config),
            EventGenerator(seed=3, buckets=4, malformed_fraction=0.01),
            records=20_000,
        )
        monkeypatch.setenv(ENV_KAFKA_CONFIG, json.dumps(config))
        # A local warehouse ignores these keys; an object store would use them.
        monkeypatch.setenv(
            ENV_STORAGE_OPTIONS,
            json.dumps({"AWS_ACCESS_KEY_ID": STORAGE_SECRET, "AWS_REGION": "eu-west-1"}),
        )
        events = tmp_path / "events"
        events.mkdir()
        settings = PipelineSettings.from_mapping(
            {
                "pipeline": "kafka_cluster",
                "source": f"{SCHEME}events",
                "warehouse": str(tmp_path / "warehouse"),
                "stream_trigger": "available_now",
                "stream_standby": "false",
                # The sink's own data source writer, options and all, in the batch's plans
                # (the default Arrow waves have no sink in their plan).
                "batch_reader": "bucketlog",
                "batch_writer": "python",
                "stream_writer": "python",  # so in the stream's (the default has none either)
            }
        )
        on_cluster = {
            "MODESWITCH_SPARK_MASTER": cluster.master_url,
            "PYSPARK_SUBMIT_ARGS": "--conf spark.eventLog.enabled=true "
            f"--conf spark.eventLog.dir={events.as_uri()} --conf spark.eventLog.compress=false "
            "--conf spark.sql.ui.explainMode=extended pyspark-shell",
        }
        for mode in ("batch", "stream"):
            plan = decide(settings, force_mode=mode)
            if mode == "stream":  # records the stream reads, past the batch's boundary
                produce_backlog(
                    KafkaLog(f"{SCHEME}events", config),
                    EventGenerator(seed=4, buckets=4),
                    records=5_000,
                    first=10**6,
                )
            run_job_process(
                mode, settings, plan.epoch, env=on_cluster, log_file=tmp_path / f"{mode}.log"
            )
            assert close_epoch(settings, plan.epoch)[0] == "completed"
        report = audit(settings.source, settings.sink, settings.quarantine, "kafka_cluster")
    assert report.ok and report.totals.missing == report.totals.duplicated == 0, report
    assert report.totals.expected == 25_000

    # The executors ran in the workers, and no file the cluster wrote holds the secret.
    assert all(executor_folders(cluster).values()), executor_folders(cluster)
    leaked = [
        str(path)
        for path in cluster.workdir.rglob("*")
        if path.is_file() and SECRET.encode() in path.read_bytes()
    ]
    assert leaked == []

    # Both jobs' event logs: their plans name the sink, and hold neither secret.
    logs = [
        "".join(part.read_text() for part in sorted(app.rglob("*")) if part.is_file())
        for app in events.iterdir()
    ]
    assert len(logs) == 2 and all("modeswitch_delta" in text for text in logs)
    for text in logs:
        assert SECRET not in text and STORAGE_SECRET not in text
