"""The shared transform: typed columns, quarantine reasons, no row lost, batch and streaming."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from modeswitch.devtools.produce import MALFORMED, EventGenerator, produce_backlog
from modeswitch.errors import ConfigError
from modeswitch.sources.base import SPARK_RECORD_DDL
from modeswitch.sources.segments import SegmentLog
from modeswitch.transforms import (
    EVENT_SCHEMA,
    QUARANTINE_REASON,
    SPARK_SQL_TRANSFORM,
    check_output_schema,
    load_transform,
    parse_events,
    parse_json_values,
)
from modeswitch.transforms.arrow import ARROW_TRANSFORM

GOOD = '{"event_id": 7, "user_id": 42, "action": "click", "amount": 12.34, "country": "DE"}'
NOT_JSON = "value is not valid JSON"

# (payload, expected reason); offsets are the list positions.
CASES: list[tuple[str | None, str | None]] = [
    (GOOD, None),
    ('{"event_id": 8, "user_id": 1, "action": "view", "amount": 3, "country": "FR", "x": 1}', None),
    ('{"user_id": 17, "action": "cli', NOT_JSON),
    ("not json at all", NOT_JSON),
    ('{"user_id": }', NOT_JSON),
    ('{"event_id": 1, "user_id": 2, "action": "a", "amount": NaN, "country": "DE"}', NOT_JSON),
    ("", "value is empty"),
    ("   ", "value is empty"),
    (None, "value is null"),
    ("[1, 2]", "value is not a JSON object"),
    ("123", "value is not a JSON object"),
    # A string with a lone UTF-16 surrogate is not valid JSON to Spark, a pair is a string.
    ('"\\ud800"', "value is not valid JSON"),
    ('"x\\udc00y"', "value is not valid JSON"),
    ('"\\ud83d\\ude00"', "value is not a JSON object"),
    ('["\\ud800"]', "value is not a JSON object"),
    ("{}", "field event_id is missing or not an integer"),
    (
        '{"event_id": 1, "action": "view", "amount": 1.0, "country": "DE"}',
        "field user_id is missing or not an integer",
    ),
    (
        '{"event_id": 1, "user_id": "42", "action": "view", "amount": 1.0, "country": "DE"}',
        "field user_id is missing or not an integer",
    ),
    (
        '{"event_id": 1.5, "user_id": 2, "action": "view", "amount": 1.0, "country": "DE"}',
        "field event_id is missing or not an integer",
    ),
    (
        '{"event_id": 1, "user_id": 2, "action": "view", "amount": "12.5", "country": "DE"}',
        "field amount is missing or not a number",
    ),
    (
        '{"event_id": 1, "user_id": 2, "action": null, "amount": 1.0, "country": "DE"}',
        "field action is missing or not a string",
    ),
    (
        '{"event_id": 1, "user_id": 2, "action": "view", "amount": 1.0}',
        "field country is missing or not a string",
    ),
]
EVENT_TIME = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


@pytest.fixture(scope="module")
def source_df(spark):
    rows = [
        (3, offset, EVENT_TIME, f"user-{offset}", value) for offset, (value, _) in enumerate(CASES)
    ]
    return spark.createDataFrame(rows, SPARK_RECORD_DDL)


@pytest.fixture(scope="module")
def parsed(source_df) -> dict[int, dict]:
    out = parse_events(source_df)
    return {row["offset"]: row.asDict() for row in out.collect()}


def test_output_schema_keeps_source_columns_and_adds_typed_columns_and_reason(source_df) -> None:
    out = parse_events(source_df)
    assert out.schema.simpleString() == (
        "struct<bucket:int,offset:bigint,event_time:timestamp,key:string,value:string,"
        "event_id:bigint,user_id:bigint,action:string,amount:double,country:string,"
        "_quarantine_reason:string>"
    )
    check_output_schema(out.schema, spec=SPARK_SQL_TRANSFORM)  # the contract the sink relies on


def test_no_row_is_dropped_and_lineage_columns_are_untouched(source_df, parsed) -> None:
    assert sorted(parsed) == list(range(len(CASES)))
    for offset, (value, _) in enumerate(CASES):
        row = parsed[offset]
        assert (row["bucket"], row["key"], row["value"]) == (3, f"user-{offset}", value)
        assert row["event_time"] == EVENT_TIME.replace(tzinfo=None)  # Spark: naive, UTC


@pytest.mark.parametrize(("offset", "case"), list(enumerate(CASES)), ids=lambda x: repr(x)[:40])
def test_each_payload_gets_the_expected_reason(parsed, offset: int, case: tuple) -> None:
    value, reason = case
    row = parsed[offset]
    assert row[QUARANTINE_REASON] == reason
    typed = [row[f.name] for f in EVENT_SCHEMA.fields]
    if reason is None:
        payload = json.loads(value)
        assert typed == [payload[f.name] for f in EVENT_SCHEMA.fields]
        assert isinstance(row["amount"], float)
    else:
        assert typed == [None] * len(typed), "a quarantined row carries no typed values"


def test_optional_fields_may_be_missing(spark) -> None:
    df = spark.createDataFrame(
        [(0, 0, EVENT_TIME, "k", '{"event_id": 1, "user_id": 2}'), (0, 1, EVENT_TIME, "k", "{}")],
        SPARK_RECORD_DDL,
    )
    out = parse_json_values(df, EVENT_SCHEMA, required=["event_id"]).orderBy("offset").collect()
    typed = [(r["event_id"], r["user_id"], r["country"]) for r in out]
    assert typed == [(1, 2, None), (None, None, None)]
    assert [r[QUARANTINE_REASON] for r in out] == [
        None,
        "field event_id is missing or not an integer",
    ]


def test_parse_is_pure_spark_sql_without_python_udfs(source_df) -> None:
    plan = parse_events(source_df)._jdf.queryExecution().executedPlan().toString()
    assert "from_json" in plan
    assert "EvalPython" not in plan  # BatchEvalPython / ArrowEvalPython mean a Python UDF


def test_bad_parse_settings_are_refused(source_df) -> None:
    with pytest.raises(ConfigError, match=r"required fields \['nope'\]"):
        parse_json_values(source_df, EVENT_SCHEMA, required=["nope"])
    clashing = source_df.withColumn("user_id", F.lit(1))
    with pytest.raises(ConfigError, match=r"clash with input columns"):
        parse_events(clashing)


@pytest.mark.parametrize("spec", [SPARK_SQL_TRANSFORM, ARROW_TRANSFORM])
def test_streaming_read_of_the_log_marks_exactly_the_malformed_records(
    spark, tmp_path: Path, spec: str
) -> None:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=2)
    generator = EventGenerator(seed=5, buckets=2, malformed_fraction=0.2)
    produce_backlog(log, generator, records=3_000, segment_records=700)
    source: dict[tuple[int, int], str] = {}
    for bucket, end in log.latest_offsets().items():
        for batch in log.read(bucket, 0, end):
            for offset, value in zip(
                batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True
            ):
                source[(bucket, offset)] = value
    expected_reason = dict.fromkeys(MALFORMED[:3].tolist(), NOT_JSON) | {"": "value is empty"}

    seen: list[dict] = []

    def collect(batch_df, batch_id: int) -> None:
        seen.extend(r.asDict() for r in batch_df.collect())

    stream = spark.readStream.format("bucketlog").option("startingOffsets", "earliest")
    transform = load_transform(spec)
    transformed = transform(stream.load(log.root))
    check_output_schema(transformed.schema, spec=transform.name)
    query = (
        transformed.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120)
    finally:
        query.stop()
    assert query.exception() is None

    assert len(seen) == len(source) == 3_000
    assert {(r["bucket"], r["offset"]) for r in seen} == set(source)
    quarantined = [r for r in seen if r[QUARANTINE_REASON] is not None]
    assert 450 < len(quarantined) < 750  # ~20 % malformed
    for row in seen:
        value = source[(row["bucket"], row["offset"])]
        assert row["value"] == value
        assert row[QUARANTINE_REASON] == expected_reason.get(value)
        if row[QUARANTINE_REASON] is None:
            payload = json.loads(value)
            assert (row["event_id"], row["user_id"], row["amount"]) == (
                payload["event_id"],
                payload["user_id"],
                payload["amount"],
            )


def test_load_transform_resolves_the_default() -> None:
    from modeswitch.transforms.payload import raw_records

    assert load_transform() is raw_records  # value_schema, and none: the records as they are
    assert load_transform("modeswitch.transforms:parse_events").spark is parse_events


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("modeswitch.transforms.parse_events", "'module:function'"),
        ("modeswitch.transforms:", "'module:function'"),
        (":parse_events", "'module:function'"),
        ("a:b:c", "'module:function'"),
        ("modeswitch.no_such_module:parse", "module 'modeswitch.no_such_module' cannot be"),
        ("modeswitch.transforms:no_such_function", "has no attribute 'no_such_function'"),
        ("modeswitch.transforms:QUARANTINE_REASON", "is a str, not a callable"),
    ],
)
def test_load_transform_refuses_a_bad_spec_naming_the_setting(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_transform(spec)
    text = str(err.value)
    assert f"transform={spec!r}" in text
    assert message in text


def test_the_output_check_names_the_transform_and_missing_and_mistyped_columns(
    source_df,
) -> None:
    with pytest.raises(ConfigError) as err:
        check_output_schema(source_df.drop("key").schema, spec="my.mod:fn")
    text = str(err.value)
    assert "transform='my.mod:fn'" in text
    assert "lacks columns key, _quarantine_reason" in text

    mistyped = parse_events(source_df).withColumn("offset", F.col("offset").cast("string"))
    with pytest.raises(ConfigError, match=r"mistyped columns offset \(string, expected bigint\)"):
        check_output_schema(mistyped.schema, spec="my.mod:fn")
