"""A record's key decoded too (``key_format = avro | protobuf``): the settings' rules, the key's
columns (``key_<field>``) and reasons after the value's in the Arrow form, a key column named as
a value's refused, and what a job learns of a key's unknown schema id. The Spark form against
this one: ``tests/spark/test_avro_forms.py``; keys written by Confluent's serializer through the
batch and the stream: ``tests/kafka/test_schema_registry.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from avro_tools import as_text, body, framed
from test_arrow_form import records

from modeswitch.control.payload_settings import SchemaSource
from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError
from modeswitch.sources.base import spark_record_schema
from modeswitch.transforms import payload_transform
from modeswitch.transforms.avro import AvroDecoder
from modeswitch.transforms.schema_ids import SchemaIdsSeen, learn_schema_id, unknown_id

KEY = {"type": "record", "name": "OrderKey", "fields": [{"name": "id", "type": "long"}]}


def settings(**values: str) -> PipelineSettings:
    return PipelineSettings.from_mapping({"source": "kafka://orders", **values})


def test_the_key_s_schemas_come_from_its_subject_or_its_file() -> None:
    assert settings().describe_payload().keys is None  # key_format = text: the key as text
    keys = settings(key_format="avro").describe_payload().keys
    assert keys == SchemaSource(format="avro", subject="orders-key", column="key")
    assert keys.prefix == "key_"
    named = settings(key_format="protobuf", key_subject="k", key_message="shop.Key")
    assert named.describe_payload().keys.message == "shop.Key"
    from_file = settings(key_format="avro", key_schema_file="/k.avsc").describe_payload().keys
    assert not from_file.framed and from_file.schema_file == "/k.avsc"
    pinned = settings(key_format="avro", key_schema_version="2").describe_payload()
    assert pinned.keys.version == 2 and pinned.schemas is None  # the value is raw


@pytest.mark.parametrize(
    ("values", "setting", "words"),
    [
        ({"key_subject": "k"}, "key_subject", r"key_format is 'text'; it is read with key_f"),
        ({"key_format": "avro", "key_message": "m"}, "key_message", "key_format 'protobuf' only"),
        (
            {"key_format": "avro", "key_subject": "k", "key_schema_file": "/k.avsc"},
            "key_subject",
            r"names a registry's schema, and key_schema_file '/k.avsc' is the schema",
        ),
        (
            {"key_format": "avro", "source": "/data/log"},
            "key_subject",
            r"not a Kafka topic whose name gives one \(<topic>-key\)",
        ),
        (
            {"key_format": "avro", "transform": "modeswitch.transforms:parse_events"},
            "key_format",
            r"parses the records itself",
        ),
        ({"key_format": "json"}, "key_format", "json"),
        ({"key_schema_version": "2"}, "key_schema_version", "key_format 'avro' or 'protobuf'"),
        ({"key_format": "avro", "key_schema_version": "v2"}, "key_schema_version", "version"),
        (
            {"key_format": "avro", "key_schema_version": "2", "key_schema_file": "/k.avsc"},
            "key_schema_version",
            r"names a registry's schema, and key_schema_file '/k.avsc' is the schema",
        ),
    ],
)
def test_key_settings_that_cannot_work_are_refused_naming_them(values, setting, words) -> None:
    with pytest.raises(ConfigError, match=words) as caught:
        settings(**values)
    assert caught.value.setting == setting


def _key_file(tmp_path: Path, schema: dict = KEY) -> str:
    path = tmp_path / "key.avsc"
    path.write_text(json.dumps(schema))
    return str(path)


def test_the_key_s_columns_and_reasons_follow_the_value_s(tmp_path: Path) -> None:
    pipeline = settings(
        value_schema="amount DOUBLE NOT NULL",
        key_format="avro",
        key_schema_file=_key_file(tmp_path),
    )
    form = payload_transform(pipeline.describe_payload()).arrow_form(
        spark_record_schema(pipeline.source)
    )
    assert form.schema.names[-3:] == ["amount", "key_id", "_quarantine_reason"]
    key = as_text(body(KEY, {"id": 42}))
    batch = records(['{"amount": 1.5}', '{"amount": 2}', "{}", '{"amount": 3}'])
    keys = [key, None, "\x80", "\x80"]  # a good key, none, two cut short
    batch = batch.set_column(3, "key", pa.array(keys))
    [out] = list(form.function(iter([batch])))
    rows = out.select(["amount", "key_id", "_quarantine_reason"]).to_pylist()
    not_key = "key does not decode as Avro with the schema of key_schema_file"
    assert rows[0] == {"amount": 1.5, "key_id": 42, "_quarantine_reason": None}
    assert rows[1] == {"amount": 2.0, "key_id": None, "_quarantine_reason": None}  # no key
    assert rows[2]["_quarantine_reason"] == "field amount is missing or not a number"
    assert rows[3]["_quarantine_reason"].startswith(not_key)
    assert out.column("key").to_pylist() == keys  # the key column as the source gave it


def test_a_key_column_named_as_a_value_s_is_refused(tmp_path: Path) -> None:
    pipeline = settings(
        value_schema="key_ID BIGINT", key_format="avro", key_schema_file=_key_file(tmp_path)
    )
    with pytest.raises(ConfigError, match=r"the key's column 'key_id' .* clashes with the field"):
        payload_transform(pipeline.describe_payload())


def test_a_key_s_unknown_schema_id_is_learned_for_the_key(monkeypatch: pytest.MonkeyPatch):
    decoder = AvroDecoder(
        json.dumps(KEY),
        {7: (1, json.dumps(KEY))},
        subject="orders-key",
        version=1,
        what="x",
        column="key",
    )
    assert decoder.names == ["key_id"]
    message = decoder.unknown_id_template.format(schema_id=9, bucket=0, offset=3)
    assert message.startswith("unknown schema id 9 in a key of subject 'orders-key'")
    assert unknown_id(message) == (9, 1, "key")
    monkeypatch.setattr(
        "modeswitch.sources.schema_registry.find_schema_id", lambda schema_id, subject: None
    )
    source = SchemaSource(subject="orders-key", column="key")
    learned = learn_schema_id(message, source, SchemaIdsSeen())
    assert learned.seen == SchemaIdsSeen(foreign=frozenset({9}))
    assert learned.said.endswith("its keys are quarantined")
    framed_key = as_text(framed(7, body(KEY, {"id": 5})))
    columns, reasons = decoder.decode(
        *(pa.array(v) for v in ([framed_key, "x", None], [0] * 3, [0] * 3))
    )
    assert columns[0].to_pylist() == [5, None, None]
    assert reasons.to_pylist() == [
        None,
        "key is not in the schema registry's wire format (a zero magic byte and a 4-byte "
        "schema id)",
        None,
    ]


def test_a_protobuf_key_decodes_into_its_columns(tmp_path: Path) -> None:
    import protobuf_tools as pb

    key_proto = 'syntax = "proto3";\npackage shop;\nmessage OrderKey { int64 id = 1; }\n'
    (tmp_path / "key.proto").write_text(key_proto)
    pipeline = settings(
        key_format="protobuf", key_schema_file=str(tmp_path / "key.proto"), value_format="raw"
    )
    form = payload_transform(pipeline.describe_payload()).arrow_form(
        spark_record_schema(pipeline.source)
    )
    cls = pb.message_class(pb.compiled(key_proto, "key.proto"), "shop.OrderKey")
    keys = [pb.as_text(cls(id=9).SerializeToString()), None, "\x80"]
    batch = records(["a", "b", "c"]).set_column(3, "key", pa.array(keys))
    [out] = list(form.function(iter([batch])))
    assert out.column("key_id").to_pylist() == [9, None, None]
    assert out.column("_quarantine_reason").to_pylist() == [
        None,
        None,
        "key does not decode as Protobuf message shop.OrderKey with the schema of "
        f"key_schema_file '{tmp_path / 'key.proto'}'",
    ]
