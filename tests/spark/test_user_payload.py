"""A user's own payload without code (issue 32): a topic of ``{"id", "user", "amount"}``
records and settings naming only pipeline, source and warehouse, then ``value_schema``.

With the schema, the batch epoch's waves (the Arrow waves, and Spark's ``from_json`` on the
``bucketlog`` path) put the records into its columns; with none, they land raw; with a schema
that does not match, the batch job says so in its log, once."""

from __future__ import annotations

import json
import logging
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.modes.batch import run_batch_epoch
from modeswitch.modes.job import resolve_job
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.sources.segments import SegmentLog
from modeswitch.transforms.loading import load_transform

RECORDS = 1_000
USER_SCHEMA = "id BIGINT NOT NULL, user STRING, amount DOUBLE"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def user_payload(i: int) -> dict[str, object]:
    # A price with more places than its column: rounded half up (0.125 -> 0.13).
    price = f"{i}.125" if i % 2 else i + 0.125
    return {
        "id": i,
        "user": f"u{i % 7}",
        "amount": i / 4,
        "due": f"2026-03-{i % 28 + 1:02d}",
        "price": price,
        "local": f"2026-03-01T08:{i % 60:02d}:00.5",
    }


def user_log(root: Path) -> SegmentLog:
    """Two buckets of the user's records; every hundredth is not JSON."""
    log = SegmentLog.create(str(root / "log"), buckets=2)
    for bucket in (0, 1):
        ids = range(bucket, RECORDS, 2)
        values = ["{cut" if i % 100 == 99 else json.dumps(user_payload(i)) for i in ids]
        log.append(
            bucket,
            pa.table(
                {
                    "event_time": [T0 + timedelta(seconds=i) for i in ids],
                    "key": [str(i) for i in ids],
                    "value": values,
                }
            ),
        )
    return log


def drained(spark, root: Path, **extra: str) -> PipelineSettings:
    settings = PipelineSettings.from_mapping(
        {"pipeline": "payload", "source": str(root / "log"), "warehouse": str(root / "wh")} | extra
    )
    plan = decide(settings, force_mode="batch")
    run_batch_epoch(spark, resolve_job(settings, "batch"), plan.epoch)
    assert close_epoch(settings, plan.epoch)[0] == "completed"
    totals = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline).totals
    assert (totals.expected, totals.missing, totals.duplicated) == (RECORDS, 0, 0)
    return settings


def table(uri: str) -> pa.Table | None:
    """The table's rows in position order; None if nothing was ever written to it."""
    try:
        rows = DeltaTable(uri).to_pyarrow_table()
    except TableNotFoundError:
        return None
    return rows.sort_by([("bucket", "ascending"), ("offset", "ascending")])


@pytest.mark.parametrize("batch_reader", ["arrow", "bucketlog"])  # Arrow form, from_json
def test_with_value_schema_the_records_land_in_its_columns(
    spark, tmp_path: Path, batch_reader: str
) -> None:
    user_log(tmp_path)
    schema = f"{USER_SCHEMA}, due DATE, price DECIMAL(10,2), local TIMESTAMP_NTZ"
    settings = drained(spark, tmp_path, value_schema=schema, batch_reader=batch_reader)
    sink = table(settings.sink)
    assert sink is not None and sink.num_rows == RECORDS - 10
    assert sink.schema.names[-6:] == ["id", "user", "amount", "due", "price", "local"]
    assert str(sink.schema.field("id").type) == "int64"
    assert sink.schema.field("due").type == pa.date32()
    assert sink.schema.field("price").type == pa.decimal128(10, 2)
    assert sink.schema.field("local").type == pa.timestamp("us")  # no time zone
    rows = sink.filter(pa.compute.is_in(sink.column("id"), pa.array([42, 43]))).to_pylist()
    assert [(r["user"], r["amount"], r["due"], r["price"], r["local"]) for r in rows] == [
        ("u0", 10.5, date(2026, 3, 15), Decimal("42.13"), datetime(2026, 3, 1, 8, 42, 0, 500_000)),
        ("u1", 10.75, date(2026, 3, 16), Decimal("43.13"), datetime(2026, 3, 1, 8, 43, 0, 500_000)),
    ]
    # A timestamp_ntz column needs its table feature (Delta protocol 3/7); delta-spark reads
    # the wall clock as written, whatever the session's time zone.
    protocol = DeltaTable(settings.sink).protocol()
    assert "timestampNtz" in (protocol.reader_features or [])
    spark.conf.set("spark.sql.session.timeZone", "Asia/Kolkata")
    try:
        [read] = spark.read.format("delta").load(settings.sink).where("id = 42").collect()
    finally:
        spark.conf.unset("spark.sql.session.timeZone")
    assert read.local == datetime(2026, 3, 1, 8, 42, 0, 500_000)
    bad = table(settings.quarantine)
    assert bad is not None and set(bad.column("reason").to_pylist()) == {"value is not valid JSON"}
    assert bad.num_rows == 10


def test_with_no_schema_the_records_land_raw(spark, tmp_path: Path) -> None:
    user_log(tmp_path)
    settings = drained(spark, tmp_path)
    sink = table(settings.sink)
    assert sink is not None and sink.num_rows == RECORDS  # the malformed ones too, as they are
    assert sink.schema.names == ["bucket", "offset", "event_time", "key", "value"]
    assert table(settings.quarantine) is None


def test_a_schema_that_does_not_match_the_payload_is_said_once_in_the_jobs_log(
    spark, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=2)
    produce_backlog(log, EventGenerator(seed=1, buckets=2), records=RECORDS, chunk=250)
    with caplog.at_level(logging.WARNING, logger="modeswitch.modes.batch"):
        drained(spark, tmp_path, value_schema=USER_SCHEMA, wave_records="300")  # 4 waves
    warnings = [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("pipeline 'payload': epoch 1 quarantined 300 of 300 records")
    assert "most common reason: field id is missing or not an integer" in warnings[0]


TIMED_SCHEMA = "id BIGINT NOT NULL, user STRING, at TIMESTAMP NOT NULL"


def timed_log(root: Path) -> dict[str, datetime | None]:
    """Two buckets of records whose ``at`` is a day after their log timestamp, given with an
    offset; every 50th lacks it, every 100th is not JSON. Each key's payload time (None
    without one)."""
    log = SegmentLog.create(str(root / "log"), buckets=2)
    payload_times: dict[str, datetime | None] = {}
    for bucket in (0, 1):
        ids = range(bucket, RECORDS, 2)
        values = []
        for i in ids:
            at = T0 + timedelta(days=1, seconds=i, milliseconds=i % 1000)
            body = {"id": i, "user": f"u{i % 7}", "at": at.astimezone(OFFSET).isoformat()}
            payload_times[str(i)] = at
            if i % 50 == 49:
                del body["at"]
                payload_times[str(i)] = None
            values.append("{cut" if i % 100 == 99 else json.dumps(body))
        log.append(
            bucket,
            pa.table(
                {
                    "event_time": [T0 + timedelta(seconds=i) for i in ids],
                    "key": [str(i) for i in ids],
                    "value": values,
                }
            ),
        )
    return payload_times


OFFSET = timezone(timedelta(hours=-5, minutes=-30))


def test_the_event_time_from_a_payload_field_is_the_same_by_both_forms(
    spark, tmp_path: Path
) -> None:
    """The Arrow waves and Spark's from_json on the bucketlog path put the same time in
    ``event_time``, and quarantine the same records with the same reasons."""
    payload_times = timed_log(tmp_path)
    landed = {}
    for batch_reader in ("arrow", "bucketlog"):
        settings = drained(
            spark,
            tmp_path,
            value_schema=TIMED_SCHEMA,
            event_time_field="at",
            batch_reader=batch_reader,
            pipeline=f"timed-{batch_reader}",
        )
        sink, bad = table(settings.sink), table(settings.quarantine)
        assert sink is not None and bad is not None
        landed[batch_reader] = (
            sink.select(["bucket", "offset", "event_time", "key", "at"]).to_pylist(),
            bad.select(["bucket", "offset", "event_time", "reason"]).to_pylist(),
        )
        times = {row["key"]: row["event_time"] for row in landed[batch_reader][0]}
        assert times == {k: t for k, t in payload_times.items() if t is not None}
        assert {row["reason"] for row in landed[batch_reader][1]} == {
            "value is not valid JSON",
            "field at is missing or not a timestamp",
        }
        # A quarantined record keeps the log's timestamp: its value held no time.
        assert all(row["event_time"] < T0 + timedelta(days=1) for row in landed[batch_reader][1])
    assert landed["arrow"] == landed["bucketlog"]


def test_nested_types_land_as_from_json_reads_them(spark, tmp_path: Path) -> None:
    """A payload with a struct, an array of structs and a map: the batch (batch_reader = auto:
    Spark's Parquet reader and from_json, the only form for nested types) writes them as
    Delta's nested types, each mistyped part as Spark 4.2 reads it."""
    log = SegmentLog.create(str(tmp_path / "log"), buckets=1)
    values = [
        {
            "id": 0,
            "ship": {"city": "Oslo", "zip": 150},
            "lines": [{"sku": "a", "qty": 2}],
            "attrs": {"x": 1},
        },
        {"id": 1, "ship": {"city": "Rome", "zip": "bad"}, "lines": [], "attrs": {}},
        {
            "id": 2,
            "ship": 7,
            "lines": [{"sku": "b", "qty": 1}, {"sku": "c", "qty": "two"}],
            "attrs": {"x": 1, "y": "bad"},
        },
        {"id": 3, "lines": None},
        {"ship": {"city": "Lima"}},  # no id: quarantined
    ]
    log.append(
        0,
        pa.table(
            {
                "event_time": [T0] * len(values),
                "key": ["k"] * len(values),
                "value": [json.dumps(v) for v in values],
            }
        ),
    )
    schema = (
        "id BIGINT NOT NULL, ship STRUCT<city: STRING, zip: INT>, "
        "lines ARRAY<STRUCT<sku: STRING, qty: INT>>, attrs MAP<STRING, BIGINT>"
    )
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "nested",
            "source": str(tmp_path / "log"),
            "warehouse": str(tmp_path / "wh"),
            "value_schema": schema,
        }
    )
    job = resolve_job(settings, "batch")
    assert job.waves.reader == "native"
    plan = decide(settings, force_mode="batch")
    run_batch_epoch(spark, job, plan.epoch)
    assert close_epoch(settings, plan.epoch)[0] == "completed"
    sink = table(settings.sink)
    assert sink.schema.field("ship").type == pa.struct([("city", pa.string()), ("zip", pa.int32())])
    assert sink.schema.field("lines").type == pa.list_(
        pa.struct([("sku", pa.string()), ("qty", pa.int32())])
    )
    rows = {r["id"]: r for r in sink.to_pylist()}
    assert rows[0]["ship"] == {"city": "Oslo", "zip": 150}
    assert rows[0]["lines"] == [{"sku": "a", "qty": 2}] and rows[0]["attrs"] == [("x", 1)]
    assert rows[1]["ship"] == {"city": "Rome", "zip": None}  # a struct's mistyped field
    assert rows[1]["lines"] == [] and rows[1]["attrs"] == []
    # Not an object: null. A struct's mistyped field inside an array: that field null. A map
    # (or an array) holding one mistyped value of its own: null whole.
    assert (rows[2]["ship"], rows[2]["attrs"]) == (None, None)
    assert rows[2]["lines"] == [{"sku": "b", "qty": 1}, {"sku": "c", "qty": None}]
    assert (rows[3]["ship"], rows[3]["lines"]) == (None, None)
    [bad] = table(settings.quarantine).to_pylist()
    assert bad["reason"] == "field id is missing or not an integer"


def test_times_inside_nested_types_read_by_the_top_level_s_text_rules(spark) -> None:
    """A timestamp, a wall-clock time and a date inside a struct, an array, a map and an array
    of arrays: each read by the text rules of a top-level field of its type, and one whose
    text does not read is a mistyped value as Spark reads one there (a struct's field null,
    its siblings kept; an array or a map holding it null whole, through the arrays around it)."""
    transform = load_transform(
        value_schema="id INT, ship STRUCT<at: TIMESTAMP, day: DATE, n: INT>, "
        "stops ARRAY<TIMESTAMP_NTZ>, due MAP<STRING, DATE>, legs ARRAY<ARRAY<DATE>>"
    )
    values = [
        {
            "id": 0,
            "ship": {"at": "2026-05-01T12:00:00.250+02:00", "day": "2026-05-01", "n": 1},
            "stops": ["2026-05-01T08:30:00"],
            "due": {"a": "2026-06-01"},
            "legs": [["2026-01-02"], []],
        },
        {
            "id": 1,
            "ship": {"at": "2026-05-01T12:00:00", "day": "2026-02-30", "n": 2},
            "stops": ["2026-05-01T08:30:00", "2026-05-01T08:30:00Z"],
            "due": {"a": "2026-06-01", "b": 5},
            "legs": [["2026-01-02"], ["x"]],
        },
        {
            "id": 2,
            "ship": {"at": None},
            "stops": [None],
            "due": {"a": None},
            "legs": [None, [None]],
        },
        {"id": 3, "ship": "2026-05-01", "stops": "2026-05-01T08:30:00", "legs": [["2026-01-02"]]},
    ]
    df = spark.createDataFrame(
        [(0, i, T0, "k", json.dumps(v)) for i, v in enumerate(values)],
        "bucket int, offset long, event_time timestamp, key string, value string",
    )
    out = transform.spark(df)
    types = {f.name: f.dataType.simpleString() for f in out.schema.fields}
    assert types["ship"] == "struct<at:timestamp,day:date,n:int>"
    assert (types["stops"], types["due"]) == ("array<timestamp_ntz>", "map<string,date>")
    assert types["legs"] == "array<array<date>>"
    rows = {r["id"]: r.asDict(recursive=True) for r in out.collect()}
    assert all(r["_quarantine_reason"] is None for r in rows.values())
    at = datetime(2026, 5, 1, 10, 0, 0, 250_000, tzinfo=UTC)
    assert rows[0]["ship"]["at"].astimezone(UTC) == at
    assert (rows[0]["ship"]["day"], rows[0]["ship"]["n"]) == (date(2026, 5, 1), 1)
    assert rows[0]["stops"] == [datetime(2026, 5, 1, 8, 30)]
    assert rows[0]["due"] == {"a": date(2026, 6, 1)}
    assert rows[0]["legs"] == [[date(2026, 1, 2)], []]
    # No offset for a TIMESTAMP, a day that does not exist: those fields null, `n` kept.
    assert rows[1]["ship"] == {"at": None, "day": None, "n": 2}
    # An offset for a TIMESTAMP_NTZ, a number for a DATE, a bad date two arrays deep: null whole.
    assert (rows[1]["stops"], rows[1]["due"], rows[1]["legs"]) == (None, None, None)
    assert rows[2]["ship"] == {"at": None, "day": None, "n": None}
    assert (rows[2]["stops"], rows[2]["due"], rows[2]["legs"]) == (
        [None],
        {"a": None},
        [None, [None]],
    )
    assert (rows[3]["ship"], rows[3]["stops"], rows[3]["due"]) == (None, None, None)
    assert rows[3]["legs"] == [[date(2026, 1, 2)]]
