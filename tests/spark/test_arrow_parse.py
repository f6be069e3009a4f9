"""The Arrow parse against Spark's ``from_json``: the same typed rows and the same quarantine
reasons, on the fixed cases and on records a property test generates (types, nulls, nesting,
unicode, trailing text, huge values); the differences the module documents are the only ones.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from payload_cases import SPARK_DECIMAL_5_2
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampNTZType, TimestampType
from test_transforms import CASES

from modeswitch.errors import ConfigError
from modeswitch.sources.base import SPARK_RECORD_DDL
from modeswitch.transforms import (
    EVENT_SCHEMA,
    QUARANTINE_REASON,
    load_transform,
    parse_events,
    parse_json_values,
)
from modeswitch.transforms.arrow import parse_events_arrow, parse_json_values_arrow

COLUMNS = ["offset", *EVENT_SCHEMA.fieldNames(), QUARANTINE_REASON]
EVENT_TIME = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def both(spark, values: list[str | None], **required) -> tuple[list[tuple], list[tuple]]:
    """Each value through from_json and through the Arrow parse: rows by offset."""
    rows = [(1, offset, EVENT_TIME, "k", value) for offset, value in enumerate(values)]
    df = spark.createDataFrame(rows, SPARK_RECORD_DDL)
    if required:
        spark_out = parse_json_values(df, EVENT_SCHEMA, **required)
        arrow_out = parse_json_values_arrow(df, EVENT_SCHEMA, **required)
    else:
        spark_out, arrow_out = parse_events(df), parse_events_arrow(df)
    return collect_both(spark_out.select(*COLUMNS), arrow_out.select(*COLUMNS))


def collect_both(spark_out, arrow_out) -> tuple[list[tuple], list[tuple]]:
    """Both forms' rows, each by offset, from one Spark job (a union tagged by form, sorted
    here): the property tests run a few hundred of these."""
    tagged = spark_out.select(F.lit(0).alias("_form"), "*").unionByName(
        arrow_out.select(F.lit(1).alias("_form"), "*")
    )
    rows = tagged.collect()
    offset = spark_out.columns.index("offset")
    expected, got = (
        sorted((tuple(r)[1:] for r in rows if r[0] == form), key=lambda r: r[offset])
        for form in (0, 1)
    )
    return expected, got


MANY_RECORDS_AN_EXAMPLE = settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
"""The property tests' setting: an example is a Spark job of its own (~1 s here, whatever
its size) and each record is parsed alone, so few examples of many records (30-120, ~60 on
average) try more records than many small ones (25 of ~6 before, 58 s for the timed test)."""


def same_number_text(expected: object, got: object) -> bool:
    """Equal, or equal once every number in the text is read as a double: Spark on Java 17
    writes some doubles with a digit more than the shortest (``1.0E23`` ->
    ``9.999999999999999E22``), the difference the module documents."""
    if expected == got or not (isinstance(expected, str) and isinstance(got, str)):
        return expected == got

    def doubles(text: str) -> str:
        return NUMBER.sub(lambda m: repr(float(m.group())), text)

    return doubles(expected) == doubles(got)


def assert_same(values: list[str | None], expected: list[tuple], got: list[tuple]) -> None:
    assert len(got) == len(expected) == len(values)
    for value, want, have in zip(values, expected, got, strict=True):
        assert all(same_number_text(w, h) for w, h in zip(want, have, strict=True)), (
            f"{value!r}:\n  from_json {want}\n  arrow     {have}"
        )


def test_the_fixed_cases_parse_as_from_json_parses_them(spark) -> None:
    values = [value for value, _ in CASES]
    expected, got = both(spark, values)
    assert_same(values, expected, got)
    assert [row[-1] for row in got] == [reason for _, reason in CASES]


def test_optional_fields_parse_as_from_json_parses_them(spark) -> None:
    values = ['{"event_id": 1, "user_id": 2}', "{}", '{"event_id": "x", "country": 5}']
    expected, got = both(spark, values, required=["event_id"])
    assert_same(values, expected, got)
    assert got[0][1:] == (1, 2, None, None, None, None)


def test_single_quotes_are_the_documented_difference(spark) -> None:
    value = "{'event_id': 1, 'user_id': 2, 'action': 'a', 'amount': 1, 'country': 'DE'}"
    expected, got = both(spark, [value])
    assert expected[0][-1] is None  # Spark's reader takes single quotes
    assert got[0][-1] == "value is not valid JSON"


def test_bad_parse_settings_are_refused(spark) -> None:
    df = spark.createDataFrame([(1, 0, EVENT_TIME, "k", "{}")], SPARK_RECORD_DDL)
    with pytest.raises(ConfigError, match=r"required fields \['nope'\]"):
        parse_json_values_arrow(df, EVENT_SCHEMA, required=["nope"])
    with pytest.raises(ConfigError, match=r"clash with input columns"):
        parse_events_arrow(df.withColumnRenamed("key", "user_id"))


# --- generated records -----------------------------------------------------------------------

INTEGERS = st.one_of(
    st.integers(-1000, 1000),
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 0]),
).map(str)
FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.builds(
        "{}{}.{}e{}".format,
        st.sampled_from(["", "-"]),
        st.integers(0, 99),
        st.integers(0, 999),
        st.integers(-400, 400),
    ),
    st.sampled_from(["-0", "-0.0", "1E2", "1e+2", "0.5", "1.50"]),
)
STRINGS = st.one_of(
    st.text(max_size=12).map(lambda s: json.dumps(s, ensure_ascii=False)),
    st.text(max_size=12).map(json.dumps),  # \\u escapes, surrogate pairs among them
    st.sampled_from(['"\\ud800"', '"a\\udc00b"', '"\\u0000"', '"tab\\there"', '""']),
)
SCALARS = st.one_of(INTEGERS, FLOATS, STRINGS, st.sampled_from(["true", "false", "null"]))
NESTED = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.lists(st.tuples(STRINGS, inner), max_size=3).map(
            lambda kv: "{" + ", ".join(f"{k}: {v}" for k, v in kv) + "}"
        ),
    ),
    max_leaves=6,
)
NAMES = st.sampled_from([*EVENT_SCHEMA.fieldNames(), "extra", "EVENT_ID"])
GOOD_FIELD = {
    "event_id": INTEGERS,
    "user_id": st.integers(0, 10**6).map(str),
    "action": STRINGS,
    "amount": FLOATS,
    "country": STRINGS,
}


@st.composite
def records(draw) -> str | None:
    """A JSON value as a producer might send it: mostly an object with the payload's fields
    (each of the right type, of a wrong one, null, nested or missing), sometimes repeated
    names, another root, trailing text, a cut-off text, whitespace or nothing."""
    kind = draw(st.sampled_from(["object"] * 6 + ["root", "cut", "blank", "null"]))
    if kind == "null":
        return None
    if kind == "blank":
        return draw(st.sampled_from(["", " ", "\n\t ", "null", " null "]))
    if kind == "root":
        return draw(NESTED)
    pairs = []
    for name in EVENT_SCHEMA.fieldNames():
        choice = draw(st.sampled_from(["good"] * 5 + ["other", "nested", "null", "missing"]))
        if choice == "missing":
            continue
        value = {
            "good": GOOD_FIELD[name],
            "other": SCALARS,
            "nested": NESTED,
            "null": st.just("null"),
        }[choice]
        pairs.append((name, draw(value)))
    pairs += draw(st.lists(st.tuples(NAMES, SCALARS), max_size=2))  # extra and repeated names
    pairs = draw(st.permutations(pairs))
    space = draw(st.sampled_from(["", " ", "\n  "]))
    text = "{" + space + f",{space}".join(f'"{k}":{space}{v}' for k, v in pairs) + "}"
    if kind == "cut":
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]
    return text + draw(st.sampled_from(["", "", " ", " trailing", '{"x": 1}', "\n", "}"]))


@MANY_RECORDS_AN_EXAMPLE
@given(values=st.lists(records(), min_size=30, max_size=120))
def test_generated_records_parse_as_from_json_parses_them(spark, values) -> None:
    expected, got = both(spark, values)
    assert_same(values, expected, got)


# --- a user's own payload: the transform built from value_schema -----------------------------

USER_SCHEMA = (
    "id BIGINT NOT NULL, n INT, s SMALLINT, t SMALLINT NOT NULL, d DOUBLE, f FLOAT, "
    "name STRING NOT NULL, flag BOOLEAN"
)
USER_GOOD = {
    "id": INTEGERS,
    "n": INTEGERS,
    "s": st.integers(-40_000, 40_000).map(str),
    "t": st.integers(-40_000, 40_000).map(str),
    "d": FLOATS,
    "f": st.floats(-1e6, 1e6, allow_nan=False, width=32).map(repr),
    "name": STRINGS,
    "flag": st.sampled_from(["true", "false"]),
}


def both_forms(
    spark, value_schema: str, values: list[str | None], event_time_field: str = ""
) -> tuple[list, list]:
    """Each value through the Spark form (from_json) and the Arrow form of the transform
    built from ``value_schema`` (and ``event_time_field``): rows by offset, with their
    ``event_time`` when ``event_time_field`` is set."""
    transform = load_transform(
        "value_schema", value_schema=value_schema, event_time_field=event_time_field
    )
    rows = [(1, offset, EVENT_TIME, "k", value) for offset, value in enumerate(values)]
    df = spark.createDataFrame(rows, SPARK_RECORD_DDL)
    form = transform.arrow_form(df.schema)
    assert form is not None
    spark_out = transform(df)
    arrow_out = df.mapInArrow(form.function, form.schema)
    assert spark_out.schema == arrow_out.schema
    left_out = ("bucket", "key") if event_time_field else ("bucket", "event_time", "key")
    # Timestamps as microseconds since the epoch: collect() would make them naive datetimes
    # in this process's time zone, which cannot hold the year 0001 everywhere.
    columns = [
        F.unix_micros(f.name).alias(f.name)
        if isinstance(f.dataType, TimestampType)
        else F.col(f.name).cast("string").alias(f.name)  # a wall clock's text: no time zone
        if isinstance(f.dataType, TimestampNTZType)
        else f.name
        for f in spark_out.schema.fields
        if f.name not in left_out
    ]
    return collect_both(spark_out.select(*columns), arrow_out.select(*columns))


@st.composite
def user_records(draw) -> str | None:
    """Like :func:`records`, over the user schema's fields."""
    kind = draw(st.sampled_from(["object"] * 6 + ["root", "cut", "blank", "null"]))
    if kind == "null":
        return None
    if kind == "blank":
        return draw(st.sampled_from(["", " ", "null"]))
    if kind == "root":
        return draw(NESTED)
    pairs = []
    for name, good in USER_GOOD.items():
        choice = draw(st.sampled_from(["good"] * 5 + ["other", "nested", "null", "missing"]))
        if choice == "missing":
            continue
        value = {"good": good, "other": SCALARS, "nested": NESTED, "null": st.just("null")}
        pairs.append((name, draw(value[choice])))
    pairs = draw(st.permutations(pairs))
    text = "{" + ", ".join(f'"{k}": {v}' for k, v in pairs) + "}"
    if kind == "cut":
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]
    return text + draw(st.sampled_from(["", " trailing", "}"]))


def test_a_user_schema_parses_alike_in_both_forms_with_not_null_required(spark) -> None:
    values = [
        '{"id": 1, "t": 2, "name": "ann", "n": 3, "s": 4, "d": 1.5, "f": 0.25, "flag": true}',
        '{"id": 2, "t": 1, "name": "bob"}',  # the nullable fields are null
        '{"id": 3, "t": 1, "name": "cy", "n": "x", "flag": 1}',  # mistyped nullable: null
        '{"id": 4, "t": 40000, "name": "dee"}',  # beyond SMALLINT
        '{"t": 1, "name": "eve"}',
        "[1]",
        None,
        # Numbers beyond a double's range in a string field: Jackson writes the infinity it
        # parses them to as a JSON string (a generated example found the quotes missing).
        '{"id": 5, "t": 1, "name": 36.968e400}',
        '{"id": 6, "t": 1, "name": [1e400, -2e999, {"a": -1e400}]}',
    ]
    expected, got = both_forms(spark, USER_SCHEMA, values)
    assert_same(values, expected, got)
    assert [row[-1] for row in got] == [
        None,
        None,
        None,
        "field t is missing or not an integer",
        "field id is missing or not an integer",
        "value is not a JSON object",
        "value is null",
        None,
        None,
    ]
    assert '"Infinity"' in got[7]
    assert '["Infinity","-Infinity",{"a":"-Infinity"}]' in got[8]
    assert got[0][2:-1] == (1, 3, 4, 2, 1.5, 0.25, "ann", True)
    assert got[2][2:-1] == (3, None, None, 1, None, None, "cy", None)


@MANY_RECORDS_AN_EXAMPLE
@given(values=st.lists(user_records(), min_size=30, max_size=120))
def test_generated_records_of_a_user_schema_parse_alike_in_both_forms(spark, values) -> None:
    expected, got = both_forms(spark, USER_SCHEMA, values)
    assert_same(values, expected, got)


def test_without_a_schema_both_forms_land_the_records_raw(spark) -> None:
    from modeswitch.sources.kafka import NOT_UTF8_PREFIX

    values = ['{"id": 1}', "not json", None, "", f"{NOT_UTF8_PREFIX}gA=="]
    expected, got = both_forms(spark, "", values)
    assert (
        expected
        == got
        == [
            (0, values[0], None),
            (1, values[1], None),
            (2, None, None),
            (3, "", None),
            (4, values[4], "value is not UTF-8"),
        ]
    )


def test_value_schema_is_read_as_spark_reads_the_same_ddl(spark) -> None:
    from pyspark.sql.types import _parse_datatype_string

    from modeswitch.control.value_schema import parse_value_schema
    from modeswitch.transforms.payload import EVENT_VALUE_SCHEMA, payload_struct

    for ddl in (
        USER_SCHEMA,
        EVENT_VALUE_SCHEMA,
        TYPED_SCHEMA,
        "`a b` LONG COMMENT 'x, y', c REAL, d NUMERIC, e dec(3)",
    ):
        fields = parse_value_schema(ddl)
        spark_schema = _parse_datatype_string(ddl)
        assert payload_struct(fields).fieldNames() == spark_schema.fieldNames()
        assert [f.dataType for f in payload_struct(fields)] == [
            f.dataType for f in spark_schema.fields
        ]
        assert [f.required for f in fields] == [not f.nullable for f in spark_schema.fields]


# --- TIMESTAMP fields and the event time from a payload field (event_time_field) -------------

TIMED_SCHEMA = (
    "id BIGINT NOT NULL, at TIMESTAMP NOT NULL, ms BIGINT, seen TIMESTAMP, name STRING, "
    "wall TIMESTAMP_NTZ"
)


def micros(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def rfc3339(moment: datetime, separator: str, digits: int, zone: str) -> str:
    fraction = f"{moment.microsecond:06d}{moment.microsecond % 997:03d}"[:digits]
    return (
        moment.strftime(f"%Y-%m-%d{separator}%H:%M:%S") + (f".{fraction}" if digits else "") + zone
    )


VALID_TIMES = st.builds(
    rfc3339,
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    st.sampled_from(["T", "t", " "]),
    st.integers(0, 9),
    st.one_of(
        st.sampled_from(["Z", "z", "+00:00", "-00:00"]),
        st.builds(
            "{}{:02d}:{:02d}".format, st.sampled_from("+-"), st.integers(0, 23), st.integers(0, 59)
        ),
    ),
).map(json.dumps)
NEAR_TIMES = st.one_of(
    st.builds(  # every part of the clock and calendar a little out of range, sometimes
        "{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}{}".format,
        st.sampled_from([0, 1, 1900, 2000, 2023, 2024, 9999]),
        st.integers(0, 13),
        st.integers(0, 32),
        st.integers(0, 24),
        st.integers(0, 60),
        st.integers(0, 60),
        st.sampled_from(["Z", "", "+24:00", "-23:59", "+01:60", "+0100", " Z", "Z ", ".Z"]),
    ).map(json.dumps),
    st.sampled_from(
        [
            '"0001-01-01T00:00:00+00:01"',
            '"9999-12-31T23:59:59.999999-00:01"',
            '"2026-01-01T00:00:00.1234567891Z"',
            '"2026-01-01T00:00:00Z\\n"',
            '"\\uff12026-01-01T00:00:00Z"',
            '"2026-01-01T00:00:00\\u005a"',  # an escaped Z is a Z
        ]
    ),
)
TIMES = st.one_of(VALID_TIMES, VALID_TIMES, NEAR_TIMES, SCALARS)
WALL_TIMES = st.one_of(
    st.builds(
        rfc3339,
        st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)),
        st.sampled_from(["T", "t", " "]),
        st.integers(0, 9),
        st.just(""),
    ).map(json.dumps),
    TIMES,
)
MILLIS = st.one_of(
    st.integers(-62_135_596_800_000, 253_402_300_799_999),
    st.sampled_from([-62_135_596_800_001, 253_402_300_800_000, 2**63 - 1, -(2**63)]),
).map(str)
TIMED_GOOD = {
    "id": INTEGERS,
    "at": TIMES,
    "ms": MILLIS,
    "seen": TIMES,
    "name": STRINGS,
    "wall": WALL_TIMES,
}


@st.composite
def timed_records(draw) -> str | None:
    """Like :func:`user_records`, over :data:`TIMED_SCHEMA`'s fields."""
    kind = draw(st.sampled_from(["object"] * 8 + ["root", "cut", "null"]))
    if kind == "null":
        return None
    if kind == "root":
        return draw(NESTED)
    pairs = []
    for name, good in TIMED_GOOD.items():
        choice = draw(st.sampled_from(["good"] * 6 + ["other", "nested", "null", "missing"]))
        if choice == "missing":
            continue
        value = {"good": good, "other": SCALARS, "nested": NESTED, "null": st.just("null")}
        pairs.append((name, draw(value[choice])))
    pairs += draw(st.lists(st.tuples(st.sampled_from(["at", "ms"]), TIMES), max_size=1))
    pairs = draw(st.permutations(pairs))
    text = "{" + ", ".join(f'"{k}": {v}' for k, v in pairs) + "}"
    if kind == "cut":
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]
    return text + draw(st.sampled_from(["", " trailing", "}"]))


def test_every_day_of_the_calendar_reads_alike_in_both_forms(spark) -> None:
    """The Spark form checks a date with Spark's strict date parser, the Arrow form with
    Python's calendar: the same days exist in both, leap years included."""
    days = [
        f"{y:04d}-{m:02d}-{d:02d}"
        for y in (1, 4, 100, 1900, 2000, 2023, 2024, 9999)
        for m in range(0, 14)
        for d in range(0, 33)
    ]
    values = [
        json.dumps({"id": 1, "at": f"{day}T12:00:00Z", "wall": f"{day} 23:59:59.9"}) for day in days
    ]
    expected, got = both_forms(spark, TIMED_SCHEMA, values, "at")
    assert_same(values, expected, got)
    good = sum(row[-1] is None for row in got)
    assert good == 8 * 365 + 3  # 4, 2000 and 2024 are leap years; 1, 100, 1900 are not
    walls = [row[-2] for row in got if row[-1] is None]
    assert None not in walls and "2024-02-29 23:59:59.9" in walls


def test_the_event_time_and_its_quarantine_are_alike_in_both_forms(spark) -> None:
    at = "2026-01-02T03:04:05.678+01:00"
    values = [
        json.dumps({"id": 1, "at": at, "ms": 1767323045678, "seen": at, "name": "a"}),
        json.dumps({"id": 2, "at": at}),
        json.dumps({"id": 3, "at": "2026-01-02 03:04:05"}),  # no offset
        json.dumps({"id": 4, "at": 1767323045678, "ms": -5}),  # a number is no timestamp
        json.dumps({"id": 5, "ms": 253402300800000}),  # missing; beyond the year 9999
        json.dumps({"id": "x", "at": at, "ms": 0}),  # quarantined for id: times kept
        json.dumps({"id": 7, "at": at, "seen": "2023-02-29T00:00:00Z"}),
        "[1]",
        "{cut",
        None,
    ]
    expected, got = both_forms(spark, TIMED_SCHEMA, values, "at")
    assert_same(values, expected, got)
    reasons = [row[-1] for row in got]
    assert reasons == [
        None,
        None,
        "field at is missing or not a timestamp",
        "field at is missing or not a timestamp",
        "field at is missing or not a timestamp",
        "field id is missing or not an integer",
        None,
        "value is not a JSON object",
        "value is not valid JSON",
        "value is null",
    ]
    payload_time = micros(datetime(2026, 1, 2, 2, 4, 5, 678_000, tzinfo=UTC))
    log_time = micros(EVENT_TIME)
    times = [row[1] for row in got]  # offset, event_time, value, ...
    assert times == [payload_time] * 2 + [log_time] * 3 + [payload_time] * 2 + [log_time] * 3
    by_millis, got_millis = both_forms(spark, TIMED_SCHEMA, values, "ms")
    assert_same(values, by_millis, got_millis)
    millis_times = [row[1] for row in got_millis]
    assert millis_times[0] == micros(datetime(2026, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC))
    assert (millis_times[3], millis_times[5]) == (-5000, 0)
    assert [i for i, t in enumerate(millis_times) if t == log_time] == [1, 2, 4, 6, 7, 8, 9]
    assert got_millis[3][-1] == "field at is missing or not a timestamp"


def test_a_timestamp_ntz_field_is_its_wall_clock_alike_in_both_forms(spark) -> None:
    schema = "id BIGINT NOT NULL, wall TIMESTAMP_NTZ NOT NULL"
    values = [
        json.dumps({"id": 1, "wall": "2026-01-02T03:04:05.6789999"}),
        json.dumps({"id": 2, "wall": "0001-01-01 00:00:00"}),
        json.dumps({"id": 3, "wall": "2026-01-02T03:04:05+01:00"}),  # an instant
        json.dumps({"id": 4, "wall": "2026-01-02T03:04:05Z"}),
        json.dumps({"id": 5, "wall": "2023-02-29T00:00:00"}),
        json.dumps({"id": 6, "wall": 1767323045678}),
        '{"id": 7, "wall": "2026-01-02T03:04:05", "wall": "2026-01-02T03:04:06Z"}',
    ]
    expected, got = both_forms(spark, schema, values)
    assert_same(values, expected, got)
    assert [(row[-2], row[-1]) for row in got] == [
        ("2026-01-02 03:04:05.678999", None),
        ("0001-01-01 00:00:00", None),
        *[(None, "field wall is missing or not a timestamp without an offset")] * 5,
    ]  # the last of a repeated name's values, as Spark reads it


@MANY_RECORDS_AN_EXAMPLE
@given(values=st.lists(timed_records(), min_size=30, max_size=120))
def test_generated_records_with_times_parse_alike_in_both_forms(spark, values) -> None:
    for field in ("at", "ms"):
        expected, got = both_forms(spark, TIMED_SCHEMA, values, field)
        assert_same(values, expected, got)


# --- DATE and DECIMAL fields --------------------------------------------------------------

TYPED_SCHEMA = (
    "id BIGINT NOT NULL, due DATE NOT NULL, price DECIMAL(5,2) NOT NULL, big DECIMAL(38,10), "
    "day DATE, ratio DECIMAL(4,4)"
)
DATES = st.one_of(
    st.dates(min_value=date(1, 1, 1)).map(lambda d: json.dumps(d.isoformat())),
    st.builds(  # a little out of range, sometimes
        '"{:04d}-{:02d}-{:02d}{}"'.format,
        st.sampled_from([0, 1, 2024, 2026, 9999]),
        st.integers(0, 13),
        st.integers(0, 32),
        st.sampled_from(["", "", "T00:00:00Z", " ", "Z"]),
    ),
    st.sampled_from(['"2026-1-05"', '" 2026-01-05"', '"\\uff12026-01-05"', "20260105"]),
    SCALARS,
)
DECIMAL_TEXT = st.builds(
    "{}{}{}{}".format,
    st.sampled_from(["", "-", "+", "--"]),
    st.sampled_from(["", "0", "1", "12", "999", "1,0", "\u0661", "1_0", " 1"]),
    st.sampled_from(["", ".", ".5", ".005", ".995", ".12345"]),
    st.sampled_from(["", "e2", "E-3", "e", "e+1", "e-400"]),
).map(json.dumps)
DECIMALS = st.one_of(INTEGERS, FLOATS, DECIMAL_TEXT, DECIMAL_TEXT, SCALARS)
TYPED_GOOD = {
    "id": INTEGERS,
    "due": DATES,
    "price": DECIMALS,
    "big": DECIMALS,
    "day": DATES,
    "ratio": DECIMALS,
}


@st.composite
def typed_records(draw) -> str:
    """Objects over :data:`TYPED_SCHEMA`'s fields, each good, of another type, null, missing
    or there twice."""
    pairs = []
    for name, good in TYPED_GOOD.items():
        choice = draw(st.sampled_from(["good"] * 6 + ["other", "null", "missing", "twice"]))
        if choice == "missing":
            continue
        value = {"good": good, "twice": good, "other": NESTED, "null": st.just("null")}
        pairs.append((name, draw(value[choice])))
        if choice == "twice":
            pairs.append((name, draw(DECIMALS if "DECIMAL" in name else good)))
    pairs = draw(st.permutations(pairs))
    return "{" + ", ".join(f'"{k}": {v}' for k, v in pairs) + "}"


def test_date_and_decimal_fields_parse_as_from_json_parses_them(spark) -> None:
    values = [
        *(f'{{"id": 1, "due": "2026-03-01", "price": {raw}}}' for raw in SPARK_DECIMAL_5_2),
        '{"id": 2, "due": "2026-02-29", "price": 1}',
        '{"id": 3, "due": "0001-01-01", "price": 1, "big": 123456789012345678.0123456789}',
        '{"id": 4, "due": "9999-12-31", "price": 1, "day": "2024-02-29", "ratio": 0.99995}',
    ]
    expected, got = both_forms(spark, TYPED_SCHEMA, values)
    assert_same(values, expected, got)
    prices = [row[4] for row in got[: len(SPARK_DECIMAL_5_2)]]  # offset, event_time, value, ...
    assert prices == [None if v is None else Decimal(v) for v in SPARK_DECIMAL_5_2.values()]
    assert got[-3][-1] == "field due is missing or not a date"
    assert got[-2][5] == Decimal("123456789012345678.0123456789")
    assert got[-1][3:] == (date(9999, 12, 31), Decimal("1.00"), None, date(2024, 2, 29), None, None)


@MANY_RECORDS_AN_EXAMPLE
@given(values=st.lists(typed_records(), min_size=30, max_size=120))
def test_generated_records_with_dates_and_decimals_parse_alike_in_both_forms(spark, values) -> None:
    expected, got = both_forms(spark, TYPED_SCHEMA, values)
    assert_same(values, expected, got)
