"""An Avro payload's two forms against each other: Spark's ``from_avro`` (the Spark form) and
fastavro in ``mapInArrow`` (the Arrow form) give the same rows and the same reasons, on every
type, on values framed with the job's and other versions, on values that do not decode, and on
records and cuts a property test makes; a schema id neither knows stops both the same way."""

from __future__ import annotations

import json
from decimal import Decimal

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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modeswitch.errors import UnknownSchemaIdError
from modeswitch.runners.jobs import modeswitch_errors
from modeswitch.sources.base import SPARK_RECORD_DDL
from modeswitch.transforms import QUARANTINE_REASON
from modeswitch.transforms.avro import AvroDecoder, transform_of

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def both(spark, decoder: AvroDecoder, values: list[str | None]) -> tuple[list, list]:
    """Each value through the Spark form and through the Arrow form: rows by offset."""
    rows = [(1, offset, None, None, value) for offset, value in enumerate(values)]
    df = spark.createDataFrame(rows, SPARK_RECORD_DDL)
    transform = transform_of(decoder)
    form = transform.arrow(df.schema)
    out = []
    for frame in (transform.spark(df), df.mapInArrow(form.function, form.schema)):
        assert frame.columns[-1] == QUARANTINE_REASON
        out.append([r.asDict(recursive=True) for r in frame.orderBy("offset").collect()])
    return out[0], out[1]


def test_every_type_and_every_reason_alike_in_both_forms(spark) -> None:
    good = body(ORDER, RECORD)
    roomy = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
    fields = [dict(f, type=roomy) if f["name"] == "amount" else f for f in ORDER["fields"]]
    wide = body(dict(ORDER, fields=fields), dict(RECORD, amount=Decimal("123456.78")))
    nothing = dict(RECORD, ship=None, note=None, tags=[], attrs={})
    values = [None, as_text(good), as_text(good[:20]), as_text(wide), as_text(body(ORDER, nothing))]
    spark_rows, arrow_rows = both(spark, file_decoder(), values)
    assert spark_rows == arrow_rows
    assert [r[QUARANTINE_REASON] for r in spark_rows] == [
        "value is null",
        None,
        "value does not decode as Avro with the schema of value_schema_file 'order.avsc'",
        "value does not decode as Avro with the schema of value_schema_file 'order.avsc'",
        None,
    ]
    assert spark_rows[1]["amount"] == Decimal("1234.56") and spark_rows[1]["tags"] == ["a", "b"]
    assert spark_rows[2]["id"] is None and spark_rows[4]["ship"] is None


def test_framed_values_alike_in_both_forms(spark) -> None:
    values = [
        as_text(framed(11, body(V1, {"id": 1, "user": "a"}))),
        as_text(framed(12, body(V2, {"id": 2, "user": "b", "note": "n", "channel": "app"}))),
        as_text(framed(12, body(V2, {"id": 3, "user": "", "note": None, "channel": ""}))),
        "plain text",
        as_text(b"\x00\x00\x00"),
        as_text(framed(13, body(V3, {"id": "x", "user": "u"}))),
        as_text(framed(11, b"\x02")),
        as_text(framed(40, body(V1, {"id": 1, "user": "a"}))),
        None,
    ]
    for version in (1, 2):
        decoder = framed_decoder(version, foreign=frozenset({40}))
        spark_rows, arrow_rows = both(spark, decoder, values)
        assert spark_rows == arrow_rows
        reasons = [r[QUARANTINE_REASON] for r in spark_rows]
        assert reasons[:3] == [None, None, None] and None not in reasons[3:]
        assert reasons[7] == "schema id 40 is not a version of subject orders-value"
    assert spark_rows[0]["channel"] == "web"  # version 1's value, read as version 2


def test_an_unknown_schema_id_stops_both_forms_alike(spark) -> None:
    values = [as_text(framed(11, body(V1, {"id": 1, "user": "a"}))), as_text(framed(41, b"\x02"))]
    df = spark.createDataFrame(
        [(2, offset, None, None, value) for offset, value in enumerate(values)], SPARK_RECORD_DDL
    )
    transform = transform_of(framed_decoder(2))
    form = transform.arrow(df.schema)
    said = []
    for frame in (transform.spark(df), df.mapInArrow(form.function, form.schema)):
        with pytest.raises(Exception) as raised:  # noqa: PT011 (Spark's own error types)
            frame.collect()
        said.append(modeswitch_errors(raised.value, UnknownSchemaIdError)[0])
    assert (
        said[0]
        == said[1]
        == (
            "unknown schema id 41 in a value of subject 'orders-value' at bucket 2 offset 1: this "
            "job reads as version 2"
        )
    )


SMALL = {
    "type": "record",
    "name": "Small",
    "fields": [
        {"name": "n", "type": "long"},
        {"name": "s", "type": ["null", "string"], "default": None},
        {"name": "xs", "type": {"type": "array", "items": "int"}},
        {"name": "m", "type": {"type": "map", "values": "double"}},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
    ],
}
records = st.fixed_dictionaries(
    {
        "n": st.integers(-(2**63), 2**63 - 1),
        "s": st.none() | st.text(max_size=8),
        "xs": st.lists(st.integers(-(2**31), 2**31 - 1), max_size=4),
        "m": st.dictionaries(st.text(max_size=3), st.floats(allow_nan=False), max_size=3),
        "e": st.sampled_from(["A", "B", "C"]),
    }
)


# Few examples of many values each (about as many values as 25 examples of up to 12 gave):
# each example is two Spark jobs, a second or two here, whatever its size.
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.tuples(records, st.integers(0, 60), st.binary(max_size=3)), min_size=1, max_size=50)
)
def test_records_cut_short_or_with_bytes_after_alike_in_both_forms(spark, cases) -> None:
    """Whole values, values cut short anywhere, and values with bytes after their end (which
    both readers leave unread) decode alike."""
    decoder = AvroDecoder(json.dumps(SMALL), {}, what="value_schema_file 'small.avsc'")
    values = []
    for record, cut, extra in cases:
        raw = body(SMALL, record)
        values.append(as_text(raw[: min(cut, len(raw))] if cut < 30 else raw + extra))
    spark_rows, arrow_rows = both(spark, decoder, values)
    assert spark_rows == arrow_rows


def test_a_value_whose_fields_are_all_null_is_told_from_one_that_does_not_decode(spark) -> None:
    """Where the job's version has no field that is never null, the Spark form tells a value it
    could not read from one whose fields are all null by a field only its default fills."""
    nullable = {
        "type": "record",
        "name": "Loose",
        "fields": [
            {"name": "a", "type": ["null", "string"], "default": None},
            {"name": "b", "type": ["null", "long"], "default": None},
        ],
    }
    decoder = AvroDecoder(json.dumps(nullable), {}, what="value_schema_file 'loose.avsc'")
    whole = body(nullable, {"a": None, "b": None})
    values = [
        as_text(whole),
        as_text(whole[:1]),
        as_text(b"\x02"),
        as_text(body(nullable, {"b": 4})),
    ]
    spark_rows, arrow_rows = both(spark, decoder, values)
    assert spark_rows == arrow_rows
    undecodable = "value does not decode as Avro with the schema of value_schema_file 'loose.avsc'"
    assert [r[QUARANTINE_REASON] for r in spark_rows] == [None, undecodable, undecodable, None]
    assert spark_rows[3]["b"] == 4


def test_a_decoded_key_alike_in_both_forms(spark, tmp_path) -> None:
    """``key_format = avro`` beside a JSON value: ``from_avro`` on the key after ``from_json``,
    against both parses in the Python workers."""
    from modeswitch.control.settings import PipelineSettings
    from modeswitch.transforms import payload_transform

    key_file = tmp_path / "key.avsc"
    key_file.write_text(json.dumps(V1))
    settings = PipelineSettings.from_mapping(
        {
            "source": "kafka://orders",
            "value_schema": "amount DOUBLE NOT NULL",
            "key_format": "avro",
            "key_schema_file": str(key_file),
        }
    )
    transform = payload_transform(settings.describe_payload())
    key = as_text(body(V1, {"id": 7, "user": "u"}))
    records = [
        (0, 0, None, key, '{"amount": 1.5}'),
        (0, 1, None, None, '{"amount": 2}'),  # no key: null key columns, no reason
        (0, 2, None, "\x80", "{}"),  # the value's reason first
        (0, 3, None, "\x80", '{"amount": 3}'),  # the key's
    ]
    df = spark.createDataFrame(records, SPARK_RECORD_DDL)
    form = transform.arrow_form(df.schema)
    out = []
    for frame in (transform(df), df.mapInArrow(form.function, form.schema)):
        assert frame.columns == [*df.columns, "amount", "key_id", "key_user", QUARANTINE_REASON]
        out.append([r.asDict() for r in frame.orderBy("offset").collect()])
    assert out[0] == out[1]
    assert [(r["key_id"], r[QUARANTINE_REASON]) for r in out[0]] == [
        (7, None),
        (None, None),
        (None, "field amount is missing or not a number"),
        (None, f"key does not decode as Avro with the schema of key_schema_file '{key_file}'"),
    ]
