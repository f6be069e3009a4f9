"""The Protobuf payload's decoder, no Spark: its columns for every Protobuf type, its rows (zero
and null as Protobuf means them), its reasons record by record, versions read as the job's,
and its schemas from a .proto, a descriptor set and the registry's forms."""

from __future__ import annotations

import base64
import pickle
from pathlib import Path

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2
from hypothesis import given
from hypothesis import strategies as st
from protobuf_tools import (
    CLASHING,
    V1,
    V2,
    as_text,
    compiled,
    framed,
    framed_decoder,
    message_class,
    order,
    order_row,
)

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError, UnknownSchemaIdError
from modeswitch.transforms.protobuf import (
    NOT_FRAMED,
    ProtobufDecoder,
    message_indexes,
    protobuf_decoder,
)
from modeswitch.transforms.protobuf_schemas import descriptor_set, registered_file


def decode(decoder: ProtobufDecoder, values: list[bytes | None]) -> tuple[list[dict], list]:
    texts = [None if v is None else as_text(v) for v in values]
    columns, reasons = decoder.decode(
        pa.array(texts, pa.string()), pa.array([0] * len(values)), pa.array(range(len(values)))
    )
    table = pa.Table.from_arrays(columns, [c.name for c in decoder.columns])
    return table.to_pylist(), reasons.to_pylist()


def test_every_protobuf_type_has_its_column():
    decoder = framed_decoder(1)
    address = pa.struct([("city", pa.string()), ("zip", pa.string())])
    assert decoder.message == "shop.Order"
    assert {c.name: c.type for c in decoder.columns} == {
        "id": pa.int64(),
        "user": pa.string(),
        "amount": pa.float64(),
        "big": pa.decimal128(20, 0),  # uint64: every value fits
        "small": pa.int64(),  # uint32
        "delta": pa.int32(),
        "paid": pa.bool_(),
        "blob": pa.binary(),
        "ratio": pa.float32(),
        "channel": pa.string(),  # the enum's symbol
        "at": pa.timestamp("us", tz="UTC"),
        "note": pa.string(),  # a wrapper: the wrapped type
        "tags": pa.list_(pa.string()),
        "attrs": pa.map_(pa.string(), pa.int64()),
        "ship": address,
        "score": pa.int32(),
        "email": pa.string(),
        "phone": pa.string(),
        "stops": pa.list_(address),
    }


def test_values_land_with_protobufs_zeros_and_nulls():
    cls = message_class(compiled(V1))
    rows, reasons = decode(
        framed_decoder(1), [framed(11, order(cls, n).SerializeToString()) for n in range(6)]
    )
    assert reasons == [None] * 6
    for n, row in enumerate(rows):
        assert row == order_row(n), n
    empty, _ = decode(framed_decoder(1), [framed(11, b"")])  # every field absent
    assert empty[0]["id"] == 0 and empty[0]["user"] == "" and empty[0]["channel"] == "WEB"
    assert empty[0]["note"] is None and empty[0]["ship"] is None and empty[0]["score"] is None
    assert empty[0]["tags"] == [] and empty[0]["attrs"] == []


def test_versions_are_read_as_the_jobs_by_field_number():
    old, new = message_class(compiled(V1)), message_class(compiled(V2))
    values = [
        framed(11, order(old, 1).SerializeToString()),
        framed(12, order(new, 2).SerializeToString()),
    ]
    as_v2, reasons = decode(framed_decoder(2), values)
    assert reasons == [None, None]
    assert as_v2 == [order_row(1) | {"coupon": ""}, order_row(2, coupon=True)]
    as_v1, reasons = decode(framed_decoder(1), values)  # the new field is dropped
    assert reasons == [None, None] and as_v1 == [order_row(1), order_row(2)]


def test_each_bad_value_is_quarantined_with_its_reason():
    cls = message_class(compiled(V1))
    clash = message_class(compiled(CLASHING))(id="text").SerializeToString()
    unknown_enum = order(cls, 1).SerializeToString() + b"\x50\x07"  # channel = 7
    decoder = framed_decoder(2, foreign=frozenset({40}))
    good = framed(12, order(cls, 3).SerializeToString())
    rows, reasons = decode(
        decoder,
        [
            None,
            b"{}",
            b"\x00\x00\x00",
            b"\x00\x00\x00\x00\x0c\x81",  # indexes cut short
            framed(40, b""),
            framed(12, b"", b"\x02\x02"),  # [1]: Refund is not version 2's
            framed(11, b"", b"\x02\x02"),  # [1] of version 1: Refund
            framed(12, b"", b"\x02\x08"),  # [4]: none
            framed(12, b"\x08\x96"),  # cut short
            framed(11, clash),
            framed(12, unknown_enum),
            good,
        ],
    )
    v2 = "(version 2 of orders-value)"
    assert reasons == [
        "value is null",
        NOT_FRAMED,
        NOT_FRAMED,
        NOT_FRAMED,
        "schema id 40 is not a version of subject orders-value",
        "value is message [1] of schema id 12, not shop.Order",
        "value is message shop.Refund of schema id 11, not shop.Order",
        "value is message [4] of schema id 12, not shop.Order",
        f"value does not decode as Protobuf message shop.Order with schema id 12 {v2}",
        "value does not decode as Protobuf message shop.Order with schema id 11 (version 1 of "
        "orders-value) read as version 2",
        f"value does not decode as Protobuf message shop.Order with schema id 12 {v2}",
        None,
    ]
    assert all(set(row.values()) == {None} for row in rows[:-1])
    assert rows[-1]["id"] == 3


def test_an_unknown_schema_id_stops_the_task_naming_the_record():
    with pytest.raises(
        UnknownSchemaIdError, match=r"unknown schema id 13 .* offset 1: .*version 1"
    ):
        decode(framed_decoder(1), [framed(11, b""), framed(13, b"")])


@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=6))
def test_message_indexes_are_read_as_registry_clients_write_them(path):
    def varint(number: int) -> bytes:
        zigzag, out = number << 1, b""
        while True:
            out += bytes([(zigzag & 0x7F) | (0x80 if zigzag > 0x7F else 0)])
            zigzag >>= 7
            if not zigzag:
                return out

    raw = b"\x00\x00\x00\x00\x01" + varint(len(path)) + b"".join(map(varint, path)) + b"body"
    assert message_indexes(raw) == (tuple(path), len(raw) - 4)


def test_the_decoder_travels_to_the_workers_pickled():
    decoder = pickle.loads(pickle.dumps(framed_decoder(1)))
    rows, _ = decode(
        decoder, [framed(11, order(message_class(compiled(V1)), 4).SerializeToString())]
    )
    assert rows == [order_row(4)]


def test_a_schema_file_is_a_proto_or_a_descriptor_set(tmp_path: Path):
    (tmp_path / "money.proto").write_text(
        'syntax = "proto3";\npackage m;\nmessage Money { int64 units = 1; }\n'
    )
    (tmp_path / "order.proto").write_text(
        'syntax = "proto3";\npackage shop;\nimport "money.proto";\n'
        "message Order { int64 id = 1; m.Money total = 2; }\n"
    )
    source = _file_source(tmp_path / "order.proto")
    decoder = protobuf_decoder(source)
    assert decoder.message == "shop.Order" and not decoder.framed
    body = message_class(decoder.reader)(id=7, total={"units": 3}).SerializeToString()
    assert decode(decoder, [body])[0] == [{"id": 7, "total": {"units": 3}}]
    (tmp_path / "order.binpb").write_bytes(decoder.reader)
    from_set = protobuf_decoder(_file_source(tmp_path / "order.binpb", message="m.Money"))
    assert from_set.message == "m.Money"
    (tmp_path / "broken.proto").write_text("message X { int64 a = 1 }")
    with pytest.raises(ConfigError, match=r"broken.proto.*does not compile.*Expected \";\"") as bad:
        protobuf_decoder(_file_source(tmp_path / "broken.proto"))
    assert bad.value.setting == "value_schema_file"
    (tmp_path / "notes.txt").write_text("neither")
    with pytest.raises(ConfigError, match=r"neither a \.proto file nor a descriptor set"):
        protobuf_decoder(_file_source(tmp_path / "notes.txt"))
    with pytest.raises(
        ConfigError, match=r"value_message: 'shop.Nope' is not a message .*shop.Order"
    ):
        protobuf_decoder(_file_source(tmp_path / "order.proto", message="shop.Nope"))


def _file_source(path: Path, message: str = ""):
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "p",
            "value_format": "protobuf",
            "value_schema_file": str(path),
            "value_message": message,
        }
    )
    return settings.describe_payload().schemas


def test_registered_schemas_compile_as_text_or_descriptor_with_their_references():
    money = 'syntax = "proto3";\npackage m;\nmessage Money { int64 units = 1; }\n'
    order_text = (
        'syntax = "proto3";\npackage shop;\nimport "common/money.proto";\n'
        "message Order { m.Money total = 1; }\n"
    )
    as_text_set = descriptor_set(
        {"common/money.proto": money, "root.proto": order_text}, "root.proto", what="t"
    )
    root = descriptor_pb2.FileDescriptorSet.FromString(as_text_set).file[-1]
    as_base64 = base64.b64encode(root.SerializeToString()).decode()  # what Confluent registers
    assert registered_file(as_base64) == root.SerializeToString()
    assert registered_file(order_text) == order_text
    from_descriptor = descriptor_set(
        {"common/money.proto": registered_file(money), "root.proto": registered_file(as_base64)},
        "root.proto",
        what="t",
    )
    assert [f.name for f in descriptor_pb2.FileDescriptorSet.FromString(from_descriptor).file] == [
        "common/money.proto",
        "root.proto",
    ]
    with pytest.raises(
        ConfigError,
        match=r"version 3: does not compile as Protobuf: common/money.proto: File not found\. "
        r"root.proto:3:1",
    ):
        descriptor_set({"root.proto": order_text}, "root.proto", what="version 3")


def test_types_without_a_column_are_refused_naming_the_field():
    recursive = (
        'syntax = "proto3";\npackage t;\nmessage Node { int64 v = 1; repeated Node next = 2; }\n'
    )
    with pytest.raises(
        ConfigError, match=r"'t.Node.next' holds message 't.Node', which holds itself"
    ):
        ProtobufDecoder(compiled(recursive), "", {}, what="f")
    struct = (
        'syntax = "proto3";\nimport "google/protobuf/struct.proto";\npackage t;\n'
        "message E { google.protobuf.Struct s = 1; }\n"
    )
    with pytest.raises(ConfigError, match="which holds itself"):
        ProtobufDecoder(compiled(struct), "", {}, what="f")
    clash = 'syntax = "proto3";\npackage t;\nmessage E { int64 offset = 1; }\n'
    with pytest.raises(ConfigError, match=r"f: field 'offset' clashes with a column"):
        ProtobufDecoder(compiled(clash), "", {}, what="f")
    cases = 'syntax = "proto3";\npackage t;\nmessage E { int64 id = 1; int64 ID = 2; }\n'
    with pytest.raises(ConfigError, match=r"fields 'id' and 'ID' differ in case alone"):
        ProtobufDecoder(compiled(cases), "", {}, what="f")


@pytest.mark.parametrize(
    ("values", "setting", "words"),
    [
        (
            {"value_message": "shop.Order"},
            "value_message",
            "read with value_format 'protobuf' only",
        ),
        ({"value_format": "avro", "value_message": "x.Y"}, "value_message", "'protobuf' only"),
        ({"value_format": "protobuf", "value_schema": "id INT"}, "value_schema", "its schema's"),
        ({"value_format": "protobuf", "event_time_field": "at"}, "event_time_field", "'protobuf'"),
    ],
)
def test_protobuf_settings_that_cannot_go_together_are_refused(values, setting, words):
    with pytest.raises(ConfigError, match=words) as caught:
        PipelineSettings.from_mapping(
            {"pipeline": "p", "source": "kafka://o", **values}
        ).describe_payload()
    assert caught.value.setting == setting


def test_a_topic_names_the_subject_and_the_message_is_kept():
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "p",
            "source": "kafka://orders",
            "value_format": "protobuf",
            "value_message": "shop.Order",
        }
    )
    source = settings.describe_payload().schemas
    assert (source.format, source.subject, source.message, source.framed) == (
        "protobuf",
        "orders-value",
        "shop.Order",
        True,
    )


def test_a_compiled_set_is_kept_and_read_back_without_the_compiler(tmp_path: Path, monkeypatch):
    import subprocess

    monkeypatch.setenv("MODESWITCH_CACHE", str(tmp_path))
    text = 'syntax = "proto3";\npackage k;\nmessage K { int64 n = 1; }\n'
    first = descriptor_set({"k.proto": text}, "k.proto", what="t")
    assert [p.parent.name for p in tmp_path.rglob("*.binpb")] == ["protobuf"]

    def no_compiler(*args, **kwargs):
        raise AssertionError("protoc ran again")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    assert descriptor_set({"k.proto": text}, "k.proto", what="t") == first
    with pytest.raises(AssertionError, match="protoc ran again"):  # other files: compiled
        descriptor_set({"k.proto": text.replace("n = 1", "m = 1")}, "k.proto", what="t")


def test_a_cache_that_cannot_be_written_only_costs_a_compile(tmp_path: Path, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("MODESWITCH_CACHE", str(tmp_path / "file"))
    text = 'syntax = "proto3";\npackage k;\nmessage K { int64 n = 1; }\n'
    made = descriptor_set({"k.proto": text}, "k.proto", what="t")
    assert descriptor_pb2.FileDescriptorSet.FromString(made).file[-1].name == "k.proto"
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_the_pipelines_transform_is_the_protobuf_decoders(tmp_path: Path):
    from modeswitch.transforms.loading import pipeline_transform

    (tmp_path / "order.proto").write_text(V1)
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "p",
            "value_format": "protobuf",
            "value_schema_file": str(tmp_path / "order.proto"),
            "value_message": "shop.Refund",
        }
    )
    transform = pipeline_transform(settings)
    assert (transform.faster, transform.columns_from) == (
        "arrow",
        f"value_schema_file {str(tmp_path / 'order.proto')!r}",
    )
    form = transform.arrow_form()
    assert [f.name for f in form.schema.fields][-2:] == ["id", "_quarantine_reason"]
