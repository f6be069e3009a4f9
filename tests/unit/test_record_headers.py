"""A Kafka record's headers as a column (``kafka://<topic>?headers=true``): the switch in the
source's URL, the records' schema every reader gives, the transforms keeping the column, and a
payload field that would take its name refused before anything runs. That Spark's Kafka source
and the project's consumer read the same headers is the kafka tier's
(``tests/kafka/test_spark_kafka_source.py``), that they land in the sink through both paths
too (``tests/kafka/test_schema_registry.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from avro_tools import V1, as_text, body
from test_arrow_form import records

from modeswitch.control.locations import KafkaLocation, record_columns
from modeswitch.control.payload_settings import SchemaSource
from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError
from modeswitch.sources.base import HEADERS_FIELD, RECORD_SCHEMA, record_schema, spark_record_schema
from modeswitch.transforms import payload_transform
from modeswitch.transforms.avro import binary_transform

WITH = "kafka://orders?headers=true"
HEADERS = [("trace", b"abc"), ("trace", b"def"), ("raw", b"\xff\x00"), ("none", None)]


@pytest.mark.parametrize(
    ("source", "headers"),
    [
        ("kafka://orders", False),
        (WITH, True),
        ("kafka://orders?headers=TRUE&event_time=ts", True),
        ("kafka://orders?headers=false", False),
        ("kafka://orders?headers=", False),
    ],
)
def test_the_source_says_whether_headers_are_read(source: str, headers: bool) -> None:
    assert KafkaLocation.parse(source).headers is headers
    assert record_columns(source) == (("headers",) if headers else ())
    names = record_schema(source).names
    assert names == [*RECORD_SCHEMA.names, *(["headers"] if headers else [])]
    assert spark_record_schema(source).names == names


def test_the_embedded_log_and_bad_switches() -> None:
    assert record_schema("/data/log") == RECORD_SCHEMA  # no headers in the embedded log
    with pytest.raises(ConfigError, match=r"^source: .*headers='yes' is neither true nor false"):
        PipelineSettings(source="kafka://orders?headers=yes")
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) header; the known ones"):
        PipelineSettings(source="kafka://orders?header=true")


def _records_with_headers(values: list[str]) -> pa.RecordBatch:
    headers = [[{"key": "trace", "value": b"%d" % i}] for i in range(len(values))]
    batch = records(values)
    return pa.RecordBatch.from_arrays(
        [*batch.columns, pa.array(headers, HEADERS_FIELD.type)], schema=record_schema(WITH)
    )


def test_the_payload_transforms_keep_the_headers_column(tmp_path: Path) -> None:
    settings = PipelineSettings(source=WITH, value_schema="id BIGINT NOT NULL")
    json_form = payload_transform(settings.describe_payload()).arrow_form(spark_record_schema(WITH))
    schema_file = tmp_path / "order.avsc"
    schema_file.write_text(json.dumps(V1))
    avro = PipelineSettings.from_mapping(
        {"source": WITH, "value_format": "avro", "value_schema_file": str(schema_file)}
    )
    avro_form = payload_transform(avro.describe_payload()).arrow_form(spark_record_schema(WITH))
    for form, values in (
        (json_form, ['{"id": 1}', "nope"]),
        (avro_form, [as_text(body(V1, {"id": 1, "user": "u"})), "nope"]),
    ):
        assert "headers" in form.schema.names
        [out] = list(form.function(iter([_records_with_headers(values)])))
        assert out.column("headers").to_pylist() == [
            [{"key": "trace", "value": b"0"}],
            [{"key": "trace", "value": b"1"}],
        ]
        assert out.column("_quarantine_reason").to_pylist()[0] is None


def test_a_payload_field_named_as_the_headers_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"field 'Headers' clashes with the column 'headers'"):
        PipelineSettings(source=WITH, value_schema="id BIGINT, Headers STRING")
    PipelineSettings(source="kafka://orders", value_schema="id BIGINT, Headers STRING")
    schema_file = tmp_path / "order.avsc"
    with_headers = dict(V1, fields=[*V1["fields"], {"name": "headers", "type": "string"}])
    schema_file.write_text(json.dumps(with_headers))
    source = SchemaSource(schema_file=str(schema_file), record_columns=("headers",))
    with pytest.raises(ConfigError, match=r"order.avsc.*field 'headers' clashes with the col"):
        binary_transform(source)
    binary_transform(SchemaSource(schema_file=str(schema_file)))  # without, a column like any
