"""A Kafka source on the standalone cluster: the executors' Python readers open the topic with
the client configuration the driver's session sends them (``spark.executorEnv``, redacted),
not with an environment they would not have on a real cluster (the workers here are started
without it). The broker is librdkafka's mock cluster in this process, on loopback; its client
configuration carries a secret that must not reach any file the cluster writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modeswitch.config import PipelineSettings
from modeswitch.local_runner import run_job_process
from modeswitch.orchestration import close_epoch, decide
from modeswitch.produce import EventGenerator, produce_backlog
from modeswitch.sources.kafka import ENV_KAFKA_CONFIG, SCHEME, KafkaLog
from modeswitch.sources.kafka_mock import MockKafkaCluster
from modeswitch.standalone import StandaloneCluster, executor_folders
from modeswitch.verify import audit

pytestmark = pytest.mark.cluster

SECRET = "cluster-tier-s3cr3t"


def test_a_kafka_source_reads_on_the_cluster_with_credentials_sent_by_the_session(
    cluster: StandaloneCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with MockKafkaCluster() as broker:
        broker.create_topic("events", 4)
        config = {**broker.config, "sasl.password": SECRET}
        produce_backlog(
            KafkaLog(f"{SCHEME}events", config),
            EventGenerator(seed=3, buckets=4, malformed_fraction=0.01),
            records=20_000,
        )
        monkeypatch.setenv(ENV_KAFKA_CONFIG, json.dumps(config))
        settings = PipelineSettings.from_mapping(
            {
                "pipeline": "kafka_cluster",
                "source": f"{SCHEME}events",
                "warehouse": str(tmp_path / "warehouse"),
                "stream_trigger": "available_now",
                "stream_standby": "false",
            }
        )
        on_cluster = {"MODESWITCH_SPARK_MASTER": cluster.master_url}
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
