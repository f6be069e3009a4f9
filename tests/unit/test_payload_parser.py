"""The Arrow parse's Python side without Spark: reasons, typed values, the text a string field
takes from other JSON values, and what it refuses to be built for (the comparison with
Spark's from_json is in tests/spark/test_arrow_parse.py; this module's name differs from
that one's because pytest imports test modules by their basename)."""

from __future__ import annotations

import math
import pickle

import pyarrow as pa
import pytest

from modeswitch.errors import ConfigError
from modeswitch.sources.kafka import NOT_UTF8_PREFIX
from modeswitch.transforms.arrow import PayloadParser
from modeswitch.transforms.jackson import java_double

pytestmark = pytest.mark.unit

FIELDS = [("id", "long"), ("n", "integer"), ("x", "double"), ("s", "string"), ("b", "boolean")]


def parse(*values: str | None, required=("id",)) -> list[tuple]:
    parser = PayloadParser(FIELDS, list(required))
    columns, reasons = parser.parse(pa.array(values, pa.string()))
    assert [c.type for c in columns] == [
        pa.int64(),
        pa.int32(),
        pa.float64(),
        pa.string(),
        pa.bool_(),
    ]
    return list(zip(*(c.to_pylist() for c in columns), reasons.to_pylist(), strict=True))


def test_good_records_in_the_typed_decode_and_out_of_it() -> None:
    assert parse('{"id": 1, "n": 2, "x": 3, "s": "é", "b": true}') == [(1, 2, 3.0, "é", True, None)]
    # Trailing text and a repeated name leave the typed decode; the reading goes on.
    assert parse('{"id": 1, "s": "a"} tail') == [(1, None, None, "a", None, None)]
    assert parse('{"id": "x", "id": 7}', '{"id": 7, "id": "x"}', '{"id": 7, "id": null}') == [
        (7, None, None, None, None, None),
        (7, None, None, None, None, None),
        (None, None, None, None, None, "field id is missing or not an integer"),
    ]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "value is null"),
        (NOT_UTF8_PREFIX + "AAEC", "value is not UTF-8"),
        ("", "value is empty"),
        (" \n", "value is empty"),
        ("null", "value is not a JSON object"),
        ("[1]", "value is not a JSON object"),
        ('"text"', "value is not a JSON object"),
        ('{"id": 1', "value is not valid JSON"),
        ('{"id": NaN}', "value is not valid JSON"),
        ("{'id': 1}", "value is not valid JSON"),
        ('{"id": 1.0}', "field id is missing or not an integer"),
        ('{"id": 9223372036854775808}', "field id is missing or not an integer"),
        ('{"id": 1, "s": "a\tb"}', "field id is missing or not an integer"),  # as from_json
    ],
)
def test_reasons(value: str | None, reason: str) -> None:
    [row] = parse(value)
    assert row == (None, None, None, None, None, reason)


def test_ranges_and_types_of_each_field() -> None:
    rows = parse(
        '{"id": -9223372036854775808, "n": 2147483648, "x": 1e400, "b": 1}',
        '{"id": 1, "n": -2147483648, "x": 12345678901234567890123, "b": false}',
        required=(),
    )
    assert rows[0][:2] == (-(2**63), None) and math.isinf(rows[0][2]) and rows[0][4] is None
    assert rows[1][:3] == (1, -(2**31), 1.2345678901234568e22) and rows[1][4] is False


@pytest.mark.parametrize(
    ("token", "text"),
    [
        ("5", "5"),
        ("-0", "0"),
        ("1e2", "100.0"),
        ("1.50", "1.5"),
        ("true", "true"),
        ('{"a": [1, 2.0, "\\u00e9", null]}', '{"a":[1,2.0,"é",null]}'),
        ('"\\ud800x"', "?x"),
        ('["\\ud800", "😀", "\\u001f", "\\\\"]', '["\\uD800","\\uD83D\\uDE00","\\u001F","\\\\"]'),
    ],
)
def test_a_string_field_takes_any_json_value_as_spark_writes_it(token: str, text: str) -> None:
    [row] = parse(f'{{"id": 1, "s": {token}}}')
    assert row[3] == text and row[5] is None


@pytest.mark.parametrize(
    ("token", "java"),
    [
        ("0.001", "0.001"),
        ("0.0001", "1.0E-4"),
        ("9999999", "9999999.0"),
        ("1e7", "1.0E7"),
        ("-1.5e-5", "-1.5E-5"),
        ("-0.0", "-0.0"),
        ("123.456e3", "123456.0"),
        ("1e400", '"Infinity"'),  # Jackson writes an infinite double as a JSON string
        ("-2e999", '"-Infinity"'),
    ],
)
def test_doubles_are_written_as_java_writes_them(token: str, java: str) -> None:
    assert java_double(token) == java


def test_names_that_are_not_python_identifiers() -> None:
    parser = PayloadParser([("user-id", "long"), ("class", "string")], ["user-id"])
    columns, reasons = parser.parse(pa.array(['{"user-id": 4, "class": "x"}', '{"class": "y"}']))
    assert [c.to_pylist() for c in columns] == [[4, None], ["x", None]]
    assert reasons.to_pylist() == [None, "field user-id is missing or not an integer"]


def test_the_parser_travels_to_python_workers_and_refuses_types_it_cannot_parse() -> None:
    parser = pickle.loads(pickle.dumps(PayloadParser(FIELDS, ["id"])))
    columns, reasons = parser.parse(pa.array(['{"id": 3}']))
    assert columns[0].to_pylist() == [3] and reasons.to_pylist() == [None]
    with pytest.raises(ConfigError, match=r"when \(binary\)"):
        PayloadParser([("id", "long"), ("when", "binary")], ["id"])
