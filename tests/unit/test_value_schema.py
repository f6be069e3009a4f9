"""A user's own payload without code: the ``value_schema`` setting (a Spark DDL schema, read
with no JVM), the transform built from it, and the records landing raw without one."""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import msgspec
import pyarrow as pa
import pytest
from payload_cases import SPARK_DECIMAL_5_2
from pyspark.sql.pandas.types import from_arrow_schema

from modeswitch.control.field_types import (
    date_text_days,
    timestamp_text_micros,
    wall_clock_text_micros,
)
from modeswitch.control.settings import PipelineSettings
from modeswitch.control.settings_layers import layer_settings
from modeswitch.control.value_schema import (
    RESERVED_NAMES,
    PayloadField,
    find_event_time_field,
    parse_value_schema,
)
from modeswitch.errors import ConfigError
from modeswitch.modes.warmup import warm_up_payload
from modeswitch.sources.base import RECORD_SCHEMA
from modeswitch.sources.kafka import NOT_UTF8_PREFIX
from modeswitch.transforms import (
    EVENT_SCHEMA,
    QUARANTINE_REASON,
    SOURCE_COLUMNS,
    load_transform,
)
from modeswitch.transforms.arrow import payload_event_times
from modeswitch.transforms.jackson import MISTYPED
from modeswitch.transforms.payload import (
    EVENT_VALUE_SCHEMA,
    payload_struct,
    raw_records,
)

pytestmark = pytest.mark.unit

INPUT = from_arrow_schema(RECORD_SCHEMA)
USER = "id BIGINT NOT NULL, user STRING, amount DOUBLE"


def records(values: list[str | None]) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([0] * n, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.array([0] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            pa.array(["k"] * n),
            pa.array(values, pa.string()),
        ],
        schema=RECORD_SCHEMA,
    )


def test_a_flat_ddl_schema_is_read_without_spark() -> None:
    assert parse_value_schema(USER) == (
        PayloadField("id", "long", True),
        PayloadField("user", "string", False),
        PayloadField("amount", "double", False),
    )
    assert parse_value_schema("") == parse_value_schema("   ") == ()
    fields = parse_value_schema(
        " `user-id` int not null comment 'who, really' ,`a``b` SmallInt,c SMALLINT ,d LONG, "
        "e Float, f REAL, g boolean NOT NULL, h INTEGER, j SHORT, k date, l DECIMAL(7, 2), "
        "m dec, n Numeric(38) NOT NULL, o timestamp_ntz, p TIMESTAMP_LTZ"
    )
    assert [(f.name, f.type, f.required) for f in fields] == [
        ("user-id", "integer", True),
        ("a`b", "short", False),
        ("c", "short", False),
        ("d", "long", False),
        ("e", "float", False),
        ("f", "float", False),
        ("g", "boolean", True),
        ("h", "integer", False),
        ("j", "short", False),
        ("k", "date", False),
        ("l", "decimal(7,2)", False),
        ("m", "decimal(10,0)", False),  # Spark's defaults
        ("n", "decimal(38,0)", True),
        ("o", "timestamp_ntz", False),
        ("p", "timestamp", False),
    ]


@pytest.mark.parametrize(
    ("ddl", "what"),
    [
        ("id BIGINT, at TIMESTAMP_NTZ(3)", r"field 'at' has type 'TIMESTAMP_NTZ\(3\)'"),
        ("id BIGINT, raw BINARY", r"field 'raw' has type 'BINARY', which value_sch"),
        ("price DECIMAL(39,2), id INT", r"field 'price': DECIMAL\(39,2\) is not a decimal Sp"),
        ("price DECIMAL(3,4)", r"DECIMAL\(3,4\) is not a decimal Spark and Delta hold"),
        ("price NUMERIC(3,)", r"field 'price': a decimal's size is \(precision\[, scale\]\)"),
        ("price DEC<3>", r"field 'price' has type 'DEC<3>'"),
        ("attrs MAP<INT, STRING>", r"field 'attrs': a MAP's keys are STRING"),
        ("ship STRUCT<city STRING NOT NULL>", r"'ship.city': NOT NULL and COMMENT go with top"),
        ("ship STRUCT<city STRING, City INT>", r"field 'ship.City' is there twice"),
        ("tags ARRAY<STRING", r"field 'tags': expected '>' or ',' in its type"),
        ("tags ARRAY<TINYINT>", r"field 'tags\[\]' has type 'TINYINT': Spark's from_json"),
        ("name VARCHAR(10)", r"field 'name' has type 'VARCHAR\(10\)'"),
        ("day DATE(3)", r"field 'day' has type 'DATE\(3\)'"),
        ("n TINYINT", r"field 'n' has type 'TINYINT': Spark's from_json reads 128 to 255"),
        ("id", r"field 'id' has no type"),
        ("id BIGINT,", r"expected a field name, found 'the end'"),
        ("id BIGINT NOT", r"expected NULL after NOT"),
        ("id BIGINT PRIMARY KEY", r"unexpected 'PRIMARY KEY'"),
        ("1id BIGINT", r"expected a field name, found '1id BIGINT'"),
        ("`id BIGINT", r"a backquoted name is not closed"),
        ("id BIGINT, ID STRING", r"field 'ID' is there twice \(as 'id'"),
        ("value STRING", r"field 'value' clashes with a column every record has"),
        ("id BIGINT COMMENT oops", r"COMMENT takes a quoted string"),
    ],
)
def test_a_schema_either_form_cannot_parse_is_refused_naming_the_setting(ddl, what) -> None:
    with pytest.raises(ConfigError, match=rf"^value_schema: {re.escape(repr(ddl))}: .*{what}"):
        parse_value_schema(ddl)
    with pytest.raises(ConfigError, match=r"^value_schema: "):
        PipelineSettings(value_schema=ddl)


def test_the_setting_is_checked_where_the_settings_are_built_naming_its_layer() -> None:
    settings = PipelineSettings.from_mapping({"value_schema": f"  {USER} "})
    assert settings.value_schema == USER
    assert settings.transform == "value_schema"
    assert PipelineSettings.from_mapping(settings.to_mapping()) == settings
    with pytest.raises(ConfigError, match=r"^Airflow Variable value_schema: 'at DATE_TIME'"):
        layer_settings(("Airflow Variable", {"value_schema": "at DATE_TIME"}))


def test_an_explicit_transform_and_a_value_schema_are_not_both_set() -> None:
    explicit = "modeswitch.transforms:parse_events"
    assert PipelineSettings(transform=explicit).value_schema == ""
    with pytest.raises(ConfigError, match=r"^value_schema: .* transform = .*parse_events"):
        PipelineSettings(transform=explicit, value_schema=USER)
    with pytest.raises(ConfigError, match=r"^value_schema: .*parses the records itself"):
        load_transform(explicit, value_schema=USER)
    with pytest.raises(ConfigError, match=r"transform: 'parse' is neither 'value_schema' nor"):
        PipelineSettings(transform="parse")


def test_quarantine_warn_fraction_is_a_fraction_above_zero() -> None:
    assert PipelineSettings().quarantine_warn_fraction == 0.5
    assert PipelineSettings.from_mapping({"quarantine_warn_fraction": "80%"}) == (
        PipelineSettings(quarantine_warn_fraction=0.8)
    )
    for bad in ("0", "1.5", "half"):
        with pytest.raises(ConfigError, match=rf"^quarantine_warn_fraction: '{bad}'"):
            PipelineSettings.from_mapping({"quarantine_warn_fraction": bad})


def test_the_names_a_payload_may_not_take_are_the_columns_every_output_has() -> None:
    assert (*SOURCE_COLUMNS, QUARANTINE_REASON) == RESERVED_NAMES


def test_the_demo_schema_is_the_demo_parse() -> None:
    fields = parse_value_schema(EVENT_VALUE_SCHEMA)
    assert payload_struct(fields) == EVENT_SCHEMA
    assert all(f.required for f in fields)


def test_with_a_schema_the_payload_is_parsed_into_its_columns_and_not_null_is_required() -> None:
    transform = load_transform("value_schema", value_schema=USER)
    form = transform.arrow_form(INPUT)
    assert form is not None
    assert form.schema.names == [*INPUT.names, "id", "user", "amount", QUARANTINE_REASON]
    function = pickle.loads(pickle.dumps(form.function))  # what the workers get
    values = [
        '{"id": 1, "user": "ann", "amount": 2.5}',
        '{"id": 2}',  # the optional fields are null
        '{"id": 3, "amount": "lots"}',  # an optional field of another type: null
        '{"user": "bob"}',  # the required one is missing
        "[1, 2]",
        None,
    ]
    (out,) = list(function(iter([records(values)])))
    assert out.column("id").to_pylist() == [1, 2, 3, None, None, None]
    assert out.column("user").to_pylist() == ["ann", None, None, None, None, None]
    assert out.column("amount").to_pylist() == [2.5, None, None, None, None, None]
    assert out.column(QUARANTINE_REASON).to_pylist() == [
        None,
        None,
        None,
        "field id is missing or not an integer",
        "value is not a JSON object",
        "value is null",
    ]


def test_with_no_schema_the_records_land_raw_but_what_is_not_utf8() -> None:
    transform = load_transform("value_schema")
    assert transform is load_transform() is raw_records
    form = transform.arrow_form(INPUT)
    assert form is not None
    assert form.schema.names == [*INPUT.names, QUARANTINE_REASON]
    function = pickle.loads(pickle.dumps(form.function))
    values = ['{"id": 1}', "not json at all", None, f"{NOT_UTF8_PREFIX}gA=="]
    (out,) = list(function(iter([records(values)])))
    assert out.column("value").to_pylist() == values
    assert out.column(QUARANTINE_REASON).to_pylist() == [None, None, None, "value is not UTF-8"]


def test_a_warm_up_payload_fits_the_pipeline_schema() -> None:
    ddl = "a BIGINT NOT NULL, b INT NOT NULL, c SMALLINT NOT NULL, "
    ddl += "e DOUBLE NOT NULL, f FLOAT NOT NULL, g STRING NOT NULL, h BOOLEAN NOT NULL, "
    ddl += "t TIMESTAMP NOT NULL, d DATE NOT NULL, m DECIMAL(1,0) NOT NULL, n DECIMAL(38,37) "
    ddl += "NOT NULL, w TIMESTAMP_NTZ NOT NULL"
    fields = parse_value_schema(ddl)
    form = load_transform("value_schema", value_schema=ddl).arrow_form(INPUT)
    assert form is not None
    values = [json.dumps(warm_up_payload(fields, i)) for i in range(300)]
    (out,) = list(form.function(iter([records(values)])))
    assert out.column(QUARANTINE_REASON).null_count == 300


# --- the event time from a payload field (event_time_field) ----------------------------------

LOG_TIME = datetime(2020, 5, 5, tzinfo=UTC)


def records_at(values: list[str | None]) -> pa.RecordBatch:
    """:func:`records`, every record's log timestamp :data:`LOG_TIME`."""
    batch = records(values)
    times = pa.array([LOG_TIME] * len(values), pa.timestamp("us", tz="UTC"))
    return batch.set_column(2, "event_time", times)


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("2026-03-01T12:30:45Z", datetime(2026, 3, 1, 12, 30, 45, tzinfo=UTC)),
        ("2026-03-01t12:30:45z", datetime(2026, 3, 1, 12, 30, 45, tzinfo=UTC)),
        ("2026-03-01 12:30:45+02:00", datetime(2026, 3, 1, 10, 30, 45, tzinfo=UTC)),
        ("2026-03-01T00:00:00-05:30", datetime(2026, 3, 1, 5, 30, tzinfo=UTC)),
        ("2024-02-29T23:59:59.5Z", datetime(2024, 2, 29, 23, 59, 59, 500_000, tzinfo=UTC)),
        ("1969-12-31T23:59:59.999999999Z", datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)),
        ("0001-01-01T00:00:00Z", datetime(1, 1, 1, tzinfo=UTC)),
        (
            "9999-12-31T23:59:59.999999+00:00",
            datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        ),
        ("2026-03-01T12:30:45", None),  # no offset: which zone is unknown
        ("2023-02-29T00:00:00Z", None),  # no such day
        ("2026-04-31T00:00:00Z", None),
        ("2026-13-01T00:00:00Z", None),
        ("2026-03-01T24:00:00Z", None),
        ("2026-03-01T23:59:60Z", None),  # a leap second
        ("0000-01-01T00:00:00Z", None),
        ("0001-01-01T00:00:00+00:01", None),  # before the year 0001 in UTC
        ("2026-03-01T12:30:45.Z", None),
        ("2026-03-01T12:30:45.1234567890Z", None),
        ("2026-03-01T12:30:45Z ", None),
        ("2026-03-01T12:30:45Z\n", None),
        (" 2026-03-01T12:30:45Z", None),
        ("2026-03-01T12:30:45+0200", None),
        ("\uff12026-03-01T12:30:45Z", None),  # a digit that is not ASCII
        ("1772368245000", None),
        ("", None),
    ],
)
def test_a_timestamp_field_takes_rfc_3339_text_with_its_offset(text, moment) -> None:
    micros = timestamp_text_micros(text)
    expected = None if moment is None else (moment - datetime(1970, 1, 1, tzinfo=UTC))
    assert micros == (None if expected is None else expected // timedelta(microseconds=1))


@pytest.mark.parametrize(
    ("text", "clock"),
    [
        ("2026-03-01T12:30:45", datetime(2026, 3, 1, 12, 30, 45)),
        ("2026-03-01t12:30:45", datetime(2026, 3, 1, 12, 30, 45)),
        ("2026-03-01 12:30:45.25", datetime(2026, 3, 1, 12, 30, 45, 250_000)),
        ("1969-12-31T23:59:59.999999999", datetime(1969, 12, 31, 23, 59, 59, 999_999)),
        ("0001-01-01T00:00:00", datetime(1, 1, 1)),
        ("9999-12-31T23:59:59.999999", datetime(9999, 12, 31, 23, 59, 59, 999_999)),
        ("2024-02-29T00:00:00", datetime(2024, 2, 29)),
        ("2026-03-01T12:30:45Z", None),  # an instant: its wall clock depends on where
        ("2026-03-01T12:30:45+02:00", None),
        ("2026-03-01T12:30:45-00:00", None),
        ("2023-02-29T00:00:00", None),  # no such day
        ("2026-03-01T24:00:00", None),
        ("2026-03-01T12:30", None),
        ("2026-03-01", None),
        ("0000-01-01T00:00:00", None),
        ("2026-03-01T12:30:45.", None),
        ("2026-03-01T12:30:45.1234567890", None),
        ("2026-03-01T12:30:45 ", None),
        ("\uff12026-03-01T12:30:45", None),  # a digit that is not ASCII
        ("", None),
    ],
)
def test_a_timestamp_ntz_field_takes_the_same_text_without_an_offset_as_a_wall_clock(
    text, clock
) -> None:
    expected = (
        None if clock is None else (clock - datetime(1970, 1, 1)) // timedelta(microseconds=1)
    )
    assert wall_clock_text_micros(text) == expected


def test_a_timestamp_ntz_field_parses_into_a_column_without_a_time_zone() -> None:
    ddl = "id BIGINT NOT NULL, at TIMESTAMP_NTZ NOT NULL, seen TIMESTAMP_NTZ"
    form = load_transform("value_schema", value_schema=ddl).arrow_form(INPUT)
    assert form is not None
    values = [
        '{"id": 1, "at": "2026-03-01T12:30:45.5", "seen": "2026-03-01T12:30:45Z"}',
        '{"id": 2, "at": "2026-03-01T12:30:45+02:00"}',
        '{"id": 3, "at": 1772368245000}',
    ]
    (out,) = list(form.function(iter([records(values)])))
    assert out.schema.field("at").type == pa.timestamp("us")
    rows = out.select(["id", "at", "seen", QUARANTINE_REASON]).to_pylist()
    assert [tuple(r.values()) for r in rows] == [
        (1, datetime(2026, 3, 1, 12, 30, 45, 500_000), None, None),
        *[(None, None, None, "field at is missing or not a timestamp without an offset")] * 2,
    ]


@pytest.mark.parametrize(("raw", "expected"), SPARK_DECIMAL_5_2.items())
def test_a_decimal_field_reads_a_json_value_as_spark_does(raw, expected) -> None:
    from modeswitch.transforms.jackson import STRICT_JSON, field_converter, raw_decimal_converter

    wanted = MISTYPED if expected is None else Decimal(expected)
    assert field_converter("decimal(5,2)")(STRICT_JSON.decode(raw)) == wanted
    converter = raw_decimal_converter("decimal(5,2)")
    assert converter is not None
    assert converter(msgspec.Raw(raw.encode())) == wanted
    assert raw_decimal_converter("double") is None


@pytest.mark.parametrize(
    ("text", "day"),
    [
        ("2026-03-01", date(2026, 3, 1)),
        ("0001-01-01", date(1, 1, 1)),
        ("9999-12-31", date(9999, 12, 31)),
        ("1970-01-01", date(1970, 1, 1)),
        ("2024-02-29", date(2024, 2, 29)),
        ("2026-02-29", None),  # not a day of that year
        ("0000-01-01", None),
        ("2026-1-05", None),
        ("2026-01-05T00:00:00Z", None),
        (" 2026-01-05", None),
        ("2026-01-05 ", None),
        ("20260105", None),
        ("\uff12026-01-05", None),  # a digit that is not ASCII
        ("", None),
    ],
)
def test_a_date_field_takes_yyyy_mm_dd_text_of_a_day_that_exists(text, day) -> None:
    expected = None if day is None else (day - date(1970, 1, 1)).days
    assert date_text_days(text) == expected


def test_date_and_decimal_fields_parse_into_their_columns_and_quarantine_when_required() -> None:
    ddl = "id BIGINT NOT NULL, due DATE NOT NULL, price DECIMAL(5,2) NOT NULL, tax DECIMAL(4,4)"
    form = load_transform("value_schema", value_schema=ddl).arrow_form(INPUT)
    assert form is not None
    values = [
        '{"id": 1, "due": "2026-03-01", "price": 12.345, "tax": 0.19}',
        '{"id": 2, "due": "2026-03-01", "price": "1,0.5", "tax": 1}',  # tax too wide: null
        '{"id": 3, "due": "2026-02-30", "price": 1}',
        '{"id": 4, "due": "2026-03-01", "price": 1000}',
        '{"id": 5, "due": "2026-03-01", "price": 1, "price": "x"}',  # the last that converts
        '{"id": 6, "due": 20260301, "price": 1}',
    ]
    (out,) = list(form.function(iter([records(values)])))
    assert out.schema.field("due").type == pa.date32()
    assert out.schema.field("price").type == pa.decimal128(5, 2)
    rows = out.select(["id", "due", "price", "tax", QUARANTINE_REASON]).to_pylist()
    assert [tuple(r.values()) for r in rows] == [
        (1, date(2026, 3, 1), Decimal("12.35"), Decimal("0.1900"), None),
        (2, date(2026, 3, 1), Decimal("10.50"), None, None),
        (None, None, None, None, "field due is missing or not a date"),
        (None, None, None, None, "field price is missing or not a number of DECIMAL(5,2)"),
        (5, date(2026, 3, 1), Decimal("1.00"), None, None),
        (None, None, None, None, "field due is missing or not a date"),
    ]


def test_event_time_field_names_a_time_field_of_value_schema() -> None:
    fields = parse_value_schema(
        "id BIGINT NOT NULL, At TIMESTAMP, ms BIGINT, n INT, s STRING, w TIMESTAMP_NTZ"
    )
    assert find_event_time_field(fields, "") is None
    assert find_event_time_field(fields, "  ") is None
    assert find_event_time_field(fields, "at") == PayloadField("At", "timestamp", False)
    assert find_event_time_field(fields, " ms ") == PayloadField("ms", "long", False)
    for name, what in [
        ("nope", r"'nope' is not a field of value_schema \(its fields: id, At, ms, n, s, w\)"),
        ("w", r"'w' is a field of type TIMESTAMP_NTZ .* \(RFC 3339 text with its offset\)"),
        ("n", r"'n' is a field of type INT in value_schema; an event time is an instant"),
        ("s", r"'s' is a field of type STRING"),
    ]:
        with pytest.raises(ConfigError, match=rf"^event_time_field: {what}") as raised:
            find_event_time_field(fields, name)
        assert raised.value.setting == "event_time_field"
    with pytest.raises(ConfigError, match=r"^event_time_field: 'at' names .* value_schema is em"):
        find_event_time_field((), "at")


def test_a_transform_of_ones_own_keeps_the_logs_event_time() -> None:
    with pytest.raises(ConfigError, match=r"^event_time_field: 'at' is set, but transform = ") as e:
        load_transform("modeswitch.transforms:parse_events", event_time_field="at")
    assert e.value.setting == "event_time_field"
    with pytest.raises(ConfigError, match=r"^event_time_field: 'at' is not a field"):
        load_transform("value_schema", value_schema=USER, event_time_field="at")


TIMED = "id BIGINT NOT NULL, at TIMESTAMP NOT NULL, note STRING"
OPTIONAL_TIME = "id BIGINT NOT NULL, at TIMESTAMP, note STRING"
MILLIS = "id BIGINT NOT NULL, ms BIGINT, note STRING"
TIMED_VALUES = [
    '{"id": 1, "at": "2026-01-02T03:04:05.678Z", "note": "a"}',
    '{"id": 2, "at": "2026-01-02T05:04:05+02:00"}',
    '{"id": 3}',  # no event time
    '{"id": 4, "at": "2026-01-02 03:04:05"}',  # no offset: not a timestamp
    '{"id": 5, "at": 1767323045000}',  # a number is not a timestamp
    '{"at": "2026-01-02T03:04:05Z"}',  # quarantined for id, its time kept
    "[1]",
    "{cut",
    None,
]


def arrow_rows(ddl: str, field: str, values: list[str | None]) -> pa.RecordBatch:
    form = load_transform("value_schema", value_schema=ddl, event_time_field=field).arrow_form(
        INPUT
    )
    assert form is not None
    assert form.schema.names[:5] == list(SOURCE_COLUMNS)  # event_time in its place
    function = pickle.loads(pickle.dumps(form.function))
    (out,) = list(function(iter([records_at(values)])))
    return out


def test_a_not_null_event_time_field_is_the_event_time_and_quarantines_records_without_it() -> None:
    out = arrow_rows(TIMED, "at", TIMED_VALUES)
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert out.column("event_time").to_pylist() == [
        at.replace(microsecond=678_000),
        at,
        LOG_TIME,
        LOG_TIME,
        LOG_TIME,
        at,  # a quarantined record's event time is its payload's too
        LOG_TIME,
        LOG_TIME,
        LOG_TIME,
    ]
    assert out.column("at").to_pylist() == [at.replace(microsecond=678_000), at, *[None] * 7]
    assert out.column(QUARANTINE_REASON).to_pylist() == [
        None,
        None,
        "field at is missing or not a timestamp",
        "field at is missing or not a timestamp",
        "field at is missing or not a timestamp",
        "field id is missing or not an integer",
        "value is not a JSON object",
        "value is not valid JSON",
        "value is null",
    ]


def test_a_nullable_event_time_field_falls_back_to_the_logs_timestamp() -> None:
    out = arrow_rows(OPTIONAL_TIME, "at", TIMED_VALUES)
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert out.column("event_time").to_pylist() == [
        at.replace(microsecond=678_000),
        at,
        *[LOG_TIME] * 3,
        at,
        *[LOG_TIME] * 3,
    ]
    assert out.column(QUARANTINE_REASON).to_pylist()[:6] == [
        *[None] * 5,
        "field id is missing or not an integer",
    ]
    assert out.column("event_time").null_count == 0


def test_a_bigint_event_time_field_is_epoch_milliseconds_of_the_years_1_to_9999() -> None:
    values = [
        '{"id": 1, "ms": 1767323045678}',
        '{"id": 2, "ms": -1}',
        '{"id": 3, "ms": 253402300799999}',
        '{"id": 4, "ms": 253402300800000}',  # the year 10000
        '{"id": 5, "ms": "1767323045678"}',  # text is not an integer
        '{"id": 6, "ms": 1.5}',
        '{"id": 7}',
    ]
    out = arrow_rows(MILLIS, "ms", values)
    assert out.column("event_time").to_pylist() == [
        datetime(2026, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC),
        *[LOG_TIME] * 4,
    ]
    assert out.column("ms").to_pylist() == [1767323045678, -1, 253402300799999, *[None] * 4]
    required = arrow_rows(MILLIS.replace("ms BIGINT", "ms BIGINT NOT NULL"), "ms", values)
    assert required.column(QUARANTINE_REASON).to_pylist() == [
        *[None] * 3,
        *["field ms is missing or not a time in epoch milliseconds"] * 4,
    ]


def test_an_event_time_read_with_its_field_alone_is_the_transforms() -> None:
    """What a backfill and the audit use to match records to windows without the schema."""
    values = [
        *TIMED_VALUES,
        '{"id": "x", "at": "2026-01-02T03:04:05Z"}',  # another field mistyped
        '{"id": 1, "at": "2026-01-02T03:04:05Z", "at": null}',
        '{"id": 1, "at": "2026-01-02T03:04:05Z", "at": 7}',
        '{"id": 1, "at": "2026-01-02T03:04:05Z", "note": "\x01"}',  # a raw control character
        '{"id": 1, "at": "2026-01-02T03:04:05Z"} trailing',
    ]
    for ddl in (TIMED, OPTIONAL_TIME, "at TIMESTAMP"):
        out = arrow_rows(ddl, "at", values)
        batch = records_at(values)
        alone = payload_event_times(
            batch.column("value"), batch.column("event_time"), field="at", kind="timestamp"
        )
        assert alone.to_pylist() == out.column("event_time").to_pylist(), ddl


def test_event_time_field_is_checked_where_the_settings_are_built() -> None:
    timed = {"value_schema": TIMED, "event_time_field": " at "}
    settings = PipelineSettings.from_mapping(timed)
    assert settings.event_time_field == "at"
    assert PipelineSettings.from_mapping(settings.to_mapping()) == settings
    assert PipelineSettings().event_time_field == ""  # the log's timestamp
    refused = [
        ({"event_time_field": "at"}, r"'at' names a payload field, but value_schema is empty"),
        ({"value_schema": USER, "event_time_field": "at"}, r"'at' is not a field of value_sch"),
        ({"value_schema": USER, "event_time_field": "user"}, r"'user' is a field of type STR"),
        (
            {"transform": "modeswitch.transforms:parse_events", "event_time_field": "at"},
            r"'at' is set, but transform = 'modeswitch.transforms:parse_events' parses",
        ),
        (
            {**timed, "source": "kafka://orders?event_time=ts"},
            r"'at' is set, and source 'kafka://orders\?event_time=ts' takes the event time",
        ),
    ]
    for raw, what in refused:
        with pytest.raises(ConfigError, match=rf"^event_time_field: {what}") as raised:
            PipelineSettings.from_mapping(raw)
        assert raised.value.setting == "event_time_field"
    with pytest.raises(ConfigError, match=r"^Airflow Variable event_time_field: 'at' is not a f"):
        layer_settings(
            ("file", {"value_schema": USER}), ("Airflow Variable", {"event_time_field": "at"})
        )
    # A Kafka source's own event time field, alone, stays what it was.
    assert PipelineSettings.from_mapping(
        {**timed, "event_time_field": "", "source": "kafka://o?event_time=ts"}
    )


NESTED = (
    "id BIGINT NOT NULL, ship STRUCT<city: STRING, `zip-code` INT>, "
    "lines ARRAY<STRUCT<sku STRING, price DECIMAL(7,2)>>, attrs MAP<STRING, BIGINT>, "
    "stops ARRAY<STRUCT<at: TIMESTAMP, local: TIMESTAMP_NTZ, day: DATE>>"
)


def test_nested_types_are_read_by_from_json_alone() -> None:
    from modeswitch.modes.job import resolve_job
    from modeswitch.transforms.payload import payload_struct, schema_transform

    fields = parse_value_schema(NESTED)
    assert [f.type for f in fields] == [
        "long",
        "struct<city:string,`zip-code`:integer>",
        "array<struct<sku:string,price:decimal(7,2)>>",
        "map<string,long>",
        "array<struct<at:timestamp,local:timestamp_ntz,day:date>>",
    ]
    assert payload_struct(fields).simpleString() == (
        "struct<id:bigint,ship:struct<city:string,zip-code:int>,"
        "lines:array<struct<sku:string,price:decimal(7,2)>>,attrs:map<string,bigint>,"
        "stops:array<struct<at:timestamp,local:timestamp_ntz,day:date>>>"
    )
    transform = schema_transform(fields)
    assert transform.arrow is None and transform.faster == "spark"
    # A stream's warm-up writes values of every field's type: empty ones for nested types.
    assert warm_up_payload(fields, 3) == {
        "id": 3,
        "ship": {},
        "lines": [],
        "attrs": {},
        "stops": [],
    }
    settings = PipelineSettings(value_schema=NESTED)
    assert resolve_job(settings, "batch").waves.reader == "native"  # batch_reader = auto
    with pytest.raises(ConfigError, match="a value_schema with a nested type is read by from_j"):
        resolve_job(dataclasses.replace(settings, batch_reader="arrow"), "batch")
