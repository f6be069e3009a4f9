"""A Protobuf payload in Spark: the transform's Spark form (the decoder through ``mapInArrow``)
gives the decoder's rows with Spark's types for every Protobuf type, written to Delta by
delta-spark and read back by delta-rs as the same types; a schema id the job does not know stops
the query naming the record. (Both forms run the same decoder: tests/unit/test_protobuf_payload.py
holds its cases.)"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import protobuf_tools as pb
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from modeswitch.errors import UnknownSchemaIdError
from modeswitch.runners.jobs import modeswitch_errors
from modeswitch.sources.base import SPARK_RECORD_DDL
from modeswitch.transforms import QUARANTINE_REASON
from modeswitch.transforms.protobuf import transform_of

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_the_spark_form_lands_every_type_in_delta(spark, tmp_path) -> None:
    cls = pb.message_class(pb.compiled(pb.V1))
    values = [pb.as_text(pb.framed(11, pb.order(cls, n).SerializeToString())) for n in range(4)]
    values.append(pb.as_text(pb.framed(11, b"\x08\x96")))
    df = spark.createDataFrame(
        [(0, offset, None, None, value) for offset, value in enumerate(values)], SPARK_RECORD_DDL
    )
    out = transform_of(pb.framed_decoder(1))(df)
    types = {f.name: f.dataType.simpleString() for f in out.schema.fields}
    assert types["big"] == "decimal(20,0)" and types["attrs"] == "map<string,bigint>"
    assert types["stops"] == "array<struct<city:string,zip:string>>"
    assert types["at"] == "timestamp" and types["channel"] == "string"
    assert out.columns[-1] == QUARANTINE_REASON
    path = str(tmp_path / "orders")
    out.write.format("delta").save(path)

    table = DeltaTable(path).to_pyarrow_table()
    assert table.schema.field("big").type == pa.decimal128(20, 0)
    assert table.schema.field("at").type == pa.timestamp("us", tz="UTC")
    rows = sorted(table.to_pylist(), key=lambda r: r["offset"])
    assert rows[1]["big"] == Decimal(2**64 - 2) and rows[1]["small"] == 2**32 - 2
    assert rows[1]["at"] == dt.datetime(2026, 11, 29, 0, 0, 0, 1, tzinfo=dt.UTC)
    assert rows[1]["channel"] == "APP" and rows[1]["note"] == "note 1"
    assert rows[0]["ship"] is None and rows[0]["phone"] == "0" and rows[0]["email"] is None
    assert [r[QUARANTINE_REASON] for r in rows] == [None] * 4 + [
        "value does not decode as Protobuf message shop.Order with schema id 11 (version 1 of "
        "orders-value)"
    ]


def test_an_unknown_schema_id_stops_the_spark_form(spark) -> None:
    df = spark.createDataFrame(
        [(2, 0, None, None, pb.as_text(pb.framed(41, b"")))], SPARK_RECORD_DDL
    )
    with pytest.raises(Exception) as raised:  # noqa: PT011 (Spark's own error types)
        transform_of(pb.framed_decoder(2))(df).collect()
    assert modeswitch_errors(raised.value, UnknownSchemaIdError) == [
        "unknown schema id 41 in a value of subject 'orders-value' at bucket 2 offset 0: this "
        "job reads as version 2"
    ]
