"""The Avro schemas and values the unit tier's decoder tests and the spark tier's comparison of
the two forms share (tests/unit/test_avro_payload.py, tests/spark/test_avro_forms.py)."""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
from decimal import Decimal

import fastavro

from modeswitch.sources.kafka import NOT_UTF8_PREFIX
from modeswitch.transforms.avro import AvroDecoder

ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "qty", "type": "int"},
        {"name": "ok", "type": "boolean"},
        {"name": "ratio", "type": "float"},
        {"name": "price", "type": "double"},
        {"name": "blob", "type": "bytes"},
        {"name": "code", "type": {"type": "fixed", "name": "Code", "size": 2}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2},
        },
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "clock", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "wall", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {
            "name": "ship",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Address",
                    "fields": [
                        {"name": "city", "type": "string"},
                        {"name": "lines", "type": {"type": "array", "items": "string"}},
                    ],
                },
            ],
            "default": None,
        },
        {"name": "bill", "type": ["null", "Address"], "default": None},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
UTC = dt.UTC
RECORD = {
    "id": 7,
    "qty": -3,
    "ok": True,
    "ratio": 0.5,
    "price": 9.75,
    "blob": b"\x00\xff",
    "code": b"ab",
    "kind": "B",
    "ref": "6e0c7a3e-1b7a-4a0e-9c1e-3f0e7c1d2b3a",
    "amount": Decimal("1234.56"),
    "day": dt.date(2026, 11, 29),
    "clock": 3_600_000,
    "at": dt.datetime(2026, 11, 29, 3, 4, 5, 678000, tzinfo=UTC),
    "at_us": dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    "wall": dt.datetime(2026, 11, 29, 3, 4, 5, 6),
    "tags": ["a", "b"],
    "attrs": {"x": 1, "y": -2},
    "ship": {"city": "Lyon", "lines": ["1 rue"]},
    "bill": None,
    "note": "hi",
}


def body(schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def as_text(raw: bytes) -> str:
    """A value as a source keeps it (sources/kafka.py): UTF-8 text, or the prefix and base64."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return NOT_UTF8_PREFIX + base64.b64encode(raw).decode("ascii")


def framed(schema_id: int, raw: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + raw


def file_decoder(schema: dict = ORDER) -> AvroDecoder:
    return AvroDecoder(json.dumps(schema), {}, what="value_schema_file 'order.avsc'")


V1 = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "user", "type": "string"}],
}
V2 = dict(
    V1,
    fields=[
        *V1["fields"],
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "channel", "type": "string", "default": "web"},  # a v1 value reads as "web"
    ],
)
V3 = dict(V1, fields=[{"name": "id", "type": "string"}, {"name": "user", "type": "string"}])


def framed_decoder(version: int, **kw) -> AvroDecoder:
    writers = {11: (1, json.dumps(V1)), 12: (2, json.dumps(V2)), 13: (3, json.dumps(V3))}
    return AvroDecoder(
        writers[10 + version][1], writers, subject="orders-value", version=version, what="x", **kw
    )
