"""OpenLineage dataset names of the pipeline's source, sink and quarantine (the events
themselves, through Airflow's provider: tests/airflow/test_pipeline_run.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeswitch.airflow.lineage import dataset_name, epoch_lineage, kafka_dataset_name
from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError

pytestmark = pytest.mark.unit


def test_locations_are_named_as_openlineage_names_them(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert dataset_name("warehouse/sink") == ("file", f"{tmp_path}/warehouse/sink")
    assert dataset_name("file:///data/sink/") == ("file", "/data/sink")
    assert dataset_name("s3://lake/tables/orders") == ("s3://lake", "tables/orders")
    assert dataset_name("abfss://c@acct.dfs.core.windows.net/t") == (
        "abfss://c@acct.dfs.core.windows.net",
        "t",
    )
    servers = {"bootstrap.servers": "10.0.0.5:9092, 10.0.0.6:9092", "sasl.password": "x"}
    assert kafka_dataset_name("kafka://orders?event_time=at", servers) == (
        "kafka://10.0.0.5:9092",
        "orders",
    )
    assert kafka_dataset_name("kafka://orders", None) == ("kafka", "orders")
    with pytest.raises(ConfigError, match="names no topic"):
        kafka_dataset_name("kafka://", servers)


def test_an_epoch_reads_its_source_and_writes_its_sink_and_quarantine() -> None:
    settings = PipelineSettings.from_mapping(
        {"pipeline": "orders", "source": "kafka://orders", "warehouse": "s3://lake/w"}
    )
    lineage = epoch_lineage(settings, kafka_config={"bootstrap.servers": "broker:9092"})
    assert [(d.namespace, d.name) for d in lineage.inputs] == [("kafka://broker:9092", "orders")]
    assert [(d.namespace, d.name) for d in lineage.outputs] == [
        ("s3://lake", "w/orders"),
        ("s3://lake", "w/orders_quarantine"),
    ]
