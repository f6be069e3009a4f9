"""Avro payloads without a JVM or a registry: the settings that choose them, the columns an Avro
schema gives, and the decoder's rows and reasons on values fastavro wrote (the registry's part:
tests/kafka/test_schema_registry.py)."""

from __future__ import annotations

import base64
import json
import pickle
from decimal import Decimal

import pyarrow as pa
import pytest
from avro_tools import (
    ORDER,
    RECORD,
    V1,
    V2,
    V3,
    as_text,
    body,
    file_decoder,
    framed,
    framed_decoder,
)

from modeswitch.control.payload_settings import SchemaSource
from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError, SchemaChangedError, UnknownSchemaIdError
from modeswitch.sources.kafka import NOT_UTF8_PREFIX
from modeswitch.transforms.avro import NOT_FRAMED, AvroDecoder, transform_of
from modeswitch.transforms.avro_types import columns_of, decoding_schema
from modeswitch.transforms.schema_ids import SchemaIdsSeen, learn_schema_id


def decode(decoder: AvroDecoder, values: list[str | None]) -> tuple[list[dict], list]:
    columns, reasons = decoder.decode(
        pa.array(values, pa.string()), pa.array([0] * len(values)), pa.array(range(len(values)))
    )
    table = pa.Table.from_arrays(columns, [c.name for c in decoder.columns])
    return table.to_pylist(), reasons.to_pylist()


# --- settings ------------------------------------------------------------------------------


def settings(**values: str) -> PipelineSettings:
    return PipelineSettings.from_mapping({"source": "kafka://orders", **values})


def test_the_format_follows_value_schema_unless_set():
    assert settings().describe_payload().format == "raw"
    assert settings(value_schema="id BIGINT").describe_payload().format == "json"
    payload = settings(value_format="avro").describe_payload()
    assert (payload.format, payload.schemas.subject, payload.schemas.version) == (
        "avro",
        "orders-value",
        None,
    )
    pinned = settings(value_format="avro", value_subject="shop", value_schema_version="3")
    assert (
        pinned.describe_payload().schemas.subject,
        pinned.describe_payload().schemas.version,
    ) == (
        "shop",
        3,
    )
    from_file = settings(value_format="avro", value_schema_file="/x/order.avsc")
    assert not from_file.describe_payload().schemas.framed


@pytest.mark.parametrize(
    ("values", "setting", "words"),
    [
        ({"value_format": "json"}, "value_format", "value_schema is empty"),
        (
            {"value_format": "avro", "value_schema": "id INT"},
            "value_schema",
            "whose columns are its schema's",
        ),
        ({"value_format": "raw", "value_schema": "id INT"}, "value_schema", "'raw'"),
        (
            {"value_schema_file": "o.avsc"},
            "value_schema_file",
            "value_format 'avro' or 'protobuf' only",
        ),
        ({"value_subject": "s"}, "value_subject", "value_format 'avro' or 'protobuf' only"),
        ({"value_schema_version": "2"}, "value_schema_version", "leave value_schema_version at"),
        (
            {"value_format": "avro", "value_schema_file": "o.avsc", "value_subject": "s"},
            "value_subject",
            "keep one",
        ),
        (
            {"value_format": "avro", "value_schema_file": "o.avsc", "value_schema_version": "2"},
            "value_schema_version",
            "keep one",
        ),
        ({"value_format": "avro", "source": "/data/log"}, "value_subject", "not a Kafka topic"),
        ({"value_format": "avro", "event_time_field": "at"}, "event_time_field", "avro"),
        ({"value_schema_version": "v2"}, "value_schema_version", "version number"),
        ({"on_schema_change": "ignore"}, "on_schema_change", "evolve, quarantine, fail"),
        ({"value_format": "avro", "transform": "m:f"}, "value_format", "parses the records"),
    ],
)
def test_payload_settings_that_cannot_go_together_are_refused(values, setting, words):
    with pytest.raises(ConfigError, match=words) as caught:
        settings(**values)
    assert caught.value.setting == setting


def test_the_payload_settings_are_named_in_flat_layers():
    names = PipelineSettings.names()
    for name in (
        "value_format",
        "value_schema_file",
        "value_subject",
        "value_schema_version",
        "on_schema_change",
        "schema_registry_connection",
    ):
        assert name in names


# --- columns -------------------------------------------------------------------------------


def test_each_avro_type_has_the_column_spark_gives_it():
    columns = {c.name: c.type for c in columns_of(decoding_schema(json.dumps(ORDER)), what="x")}
    address = pa.struct([("city", pa.string()), ("lines", pa.list_(pa.string()))])
    assert columns == {
        "id": pa.int64(),
        "qty": pa.int32(),
        "ok": pa.bool_(),
        "ratio": pa.float32(),
        "price": pa.float64(),
        "blob": pa.binary(),
        "code": pa.binary(),
        "kind": pa.string(),
        "ref": pa.string(),
        "amount": pa.decimal128(6, 2),
        "day": pa.date32(),
        "clock": pa.int32(),
        "at": pa.timestamp("us", tz="UTC"),
        "at_us": pa.timestamp("us", tz="UTC"),
        "wall": pa.timestamp("us"),
        "tags": pa.list_(pa.string()),
        "attrs": pa.map_(pa.string(), pa.int64()),
        "ship": address,
        "bill": address,
        "note": pa.string(),
    }


@pytest.mark.parametrize(
    ("field", "words"),
    [
        ({"name": "u", "type": ["null", "int", "string"]}, "union of int, string"),
        (
            {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 40}},
            "38 digits",
        ),
        ({"name": "Value", "type": "int"}, "clashes with a column"),
        ({"name": "ID", "type": "int"}, "differ in case"),
        ({"name": "next", "type": ["null", "shop.Order"]}, "recursive"),
    ],
)
def test_schemas_without_columns_are_refused_naming_the_field(field, words):
    schema = dict(ORDER, fields=[*ORDER["fields"], field])
    with pytest.raises(ConfigError, match=words) as caught:
        file_decoder(schema)
    assert "order.avsc" in str(caught.value)


# --- decoding ------------------------------------------------------------------------------


def test_every_type_decodes_to_its_column():
    rows, reasons = decode(file_decoder(), [as_text(body(ORDER, RECORD))])
    assert reasons == [None]
    expected = dict(
        RECORD,
        attrs=[("x", 1), ("y", -2)],
        ratio=0.5,
    )
    assert rows == [expected]


def test_bytes_that_are_utf8_and_bytes_that_are_not_decode_alike():
    small = {"type": "record", "name": "S", "fields": [{"name": "n", "type": "string"}]}
    raw = body(small, {"n": "abc"})
    assert raw.decode("utf-8")  # kept as text by a source
    rows, reasons = decode(
        file_decoder(small),
        [raw.decode("utf-8"), NOT_UTF8_PREFIX + base64.b64encode(raw).decode("ascii")],
    )
    assert rows == [{"n": "abc"}, {"n": "abc"}] and reasons == [None, None]


def test_values_that_do_not_decode_are_quarantined_with_their_reason():
    good = body(ORDER, RECORD)
    enum_at = len(body(ORDER, dict(RECORD, kind="A"))) - len(good)  # same length: index only
    assert enum_at == 0
    # 8 digits in a decimal(6, 2): the bytes carry any unscaled number, a writer may send it.
    roomy = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
    fields = [dict(f, type=roomy) if f["name"] == "amount" else f for f in ORDER["fields"]]
    wide = body(dict(ORDER, fields=fields), dict(RECORD, amount=Decimal("123456.78")))
    rows, reasons = decode(file_decoder(), [None, as_text(good[:20]), as_text(wide), as_text(good)])
    assert reasons[0] == "value is null"
    assert (
        reasons[1]
        == "value does not decode as Avro with the schema of value_schema_file 'order.avsc'"
    )
    # Decoded, but wider than its column: Spark's reader cannot tell it apart, one reason.
    assert reasons[2] == reasons[1]
    assert reasons[3] is None
    assert rows[0]["id"] is None and rows[1]["id"] is None and rows[2]["id"] is None
    assert rows[3]["id"] == 7


def test_framed_values_are_read_with_their_own_schema_as_the_jobs_version():
    values = [
        as_text(framed(11, body(V1, {"id": 1, "user": "a"}))),
        as_text(framed(12, body(V2, {"id": 2, "user": "b", "note": "n", "channel": "app"}))),
        as_text(framed(12, body(V2, {"id": 3, "user": "c", "note": None, "channel": "web"}))),
    ]
    rows, reasons = decode(framed_decoder(2), values)
    assert reasons == [None, None, None]
    assert rows == [
        {"id": 1, "user": "a", "note": None, "channel": "web"},
        {"id": 2, "user": "b", "note": "n", "channel": "app"},
        {"id": 3, "user": "c", "note": None, "channel": "web"},
    ]
    older, _ = decode(framed_decoder(1), values)  # read as version 1: note is not a column
    assert older == [{"id": 1, "user": "a"}, {"id": 2, "user": "b"}, {"id": 3, "user": "c"}]
    # What a sink's error names if a column of the version read would change type.
    assert transform_of(framed_decoder(2)).columns_from == "version 2 of subject 'orders-value'"
    assert transform_of(file_decoder()).columns_from == "value_schema_file 'order.avsc'"


def test_framing_and_compatibility_problems_are_reasons():
    decoder = pickle.loads(pickle.dumps(framed_decoder(2, foreign=frozenset({40}))))
    values = [
        "plain text",
        as_text(b"\x00\x00\x00"),
        as_text(framed(13, body(V3, {"id": "x", "user": "u"}))),
        as_text(framed(11, b"\x02")),
        as_text(framed(12, b"\x02")),
        as_text(framed(40, body(V1, {"id": 1, "user": "a"}))),
    ]
    rows, reasons = decode(decoder, values)
    assert reasons == [
        NOT_FRAMED,
        NOT_FRAMED,
        "value does not decode as Avro with schema id 13 (version 3 of orders-value) read as "
        "version 2",
        "value does not decode as Avro with schema id 11 (version 1 of orders-value) read as "
        "version 2",
        "value does not decode as Avro with schema id 12 (version 2 of orders-value)",
        "schema id 40 is not a version of subject orders-value",
    ]
    assert all(row["id"] is None for row in rows)


def test_a_schema_id_the_job_does_not_know_stops_the_batch_naming_it():
    decoder = framed_decoder(2, foreign=frozenset({40}))
    with pytest.raises(UnknownSchemaIdError) as raised:
        decode(
            decoder,
            [as_text(framed(11, body(V1, {"id": 1, "user": "a"}))), as_text(framed(41, b"\x02"))],
        )
    assert str(raised.value) == (
        "unknown schema id 41 in a value of subject 'orders-value' at bucket 0 offset 1: this "
        "job reads as version 2"
    )


@pytest.mark.parametrize(
    ("on_change", "registered", "foreign", "read_as"),
    [
        ("evolve", None, {40, 41}, None),  # foreign to the subject: remembered
        ("evolve", (4, "{}"), {40}, None),  # a new version: the job resolved again reads it
        ("quarantine", (4, "{}"), {40}, 2),  # read as the version the job read as
    ],
)
def test_the_driver_learns_what_an_unknown_schema_id_is(
    monkeypatch: pytest.MonkeyPatch, on_change, registered, foreign, read_as
):
    asked: list[tuple[int, str]] = []
    monkeypatch.setattr(
        "modeswitch.sources.schema_registry.find_schema_id",
        lambda schema_id, subject: asked.append((schema_id, subject)) or registered,
    )
    message = framed_decoder(2).unknown_id_template.format(schema_id=41, bucket=3, offset=9)
    source = SchemaSource(subject="orders-value", on_schema_change=on_change)
    learned = learn_schema_id(message, source, SchemaIdsSeen(foreign=frozenset({40})))
    assert asked == [(41, "orders-value")]
    assert learned.seen == SchemaIdsSeen(foreign=frozenset(foreign), read_as=read_as)
    assert learned.schema_id == 41 and learned.version == (registered or (None,))[0]
    assert learned.said.startswith(
        "schema id 41 is not a version of subject 'orders-value'"
        if registered is None
        else "schema id 41 is version 4 of 'orders-value', registered after the job began: "
    )


def test_a_new_version_stops_the_job_under_fail(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(
        "modeswitch.sources.schema_registry.find_schema_id", lambda schema_id, subject: (4, "{}")
    )
    message = framed_decoder(2).unknown_id_template.format(schema_id=41, bucket=3, offset=9)
    source = SchemaSource(subject="orders-value", on_schema_change="fail")
    with pytest.raises(SchemaChangedError, match=r"schema id 41 is version 4 of 'orders-value'"):
        learn_schema_id(message, source, SchemaIdsSeen())
