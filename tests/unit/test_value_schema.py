"""A user's own payload without code: the ``value_schema`` setting (a Spark DDL schema, read
with no JVM), the transform built from it, and the records landing raw without one."""

from __future__ import annotations

import json
import pickle
import re

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import from_arrow_schema

from modeswitch.control.settings import PipelineSettings, layer_settings
from modeswitch.control.value_schema import RESERVED_NAMES, PayloadField, parse_value_schema
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
        "e Float, f REAL, g boolean NOT NULL, h INTEGER, j SHORT"
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
    ]


@pytest.mark.parametrize(
    ("ddl", "what"),
    [
        ("id BIGINT, at TIMESTAMP", r"field 'at' has type 'TIMESTAMP', which value_schema"),
        ("price DECIMAL(10,2), id INT", r"field 'price' has type 'DECIMAL\(10,2\)'"),
        ("tags ARRAY<STRING>", r"field 'tags' has type 'ARRAY<STRING>'"),
        ("name VARCHAR(10)", r"field 'name' has type 'VARCHAR\(10\)'"),
        ("day DATE", r"field 'day' has type 'DATE'"),
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
    with pytest.raises(ConfigError, match=r"^Airflow Variable value_schema: 'at TIMESTAMP'"):
        layer_settings(("Airflow Variable", {"value_schema": "at TIMESTAMP"}))


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
    ddl += "e DOUBLE NOT NULL, f FLOAT NOT NULL, g STRING NOT NULL, h BOOLEAN NOT NULL"
    fields = parse_value_schema(ddl)
    form = load_transform("value_schema", value_schema=ddl).arrow_form(INPUT)
    assert form is not None
    values = [json.dumps(warm_up_payload(fields, i)) for i in range(300)]
    (out,) = list(form.function(iter([records(values)])))
    assert out.column(QUARANTINE_REASON).null_count == 300
