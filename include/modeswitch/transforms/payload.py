"""The default transform, built from settings: ``transform = "value_schema"``.

A user states the payload in settings, with no code: ``value_schema`` is a Spark DDL schema of
the records' JSON ``value`` (:mod:`modeswitch.control.value_schema`: its grammar, its types and
what ``NOT NULL`` means). :func:`schema_transform` builds the pipeline's
:class:`~modeswitch.transforms.Transform` from it:

- with a schema, the payload parse in both forms (in the Spark form alone for a schema with a
  nested type: ``STRUCT``, ``ARRAY``, ``MAP``, which ``from_json`` reads, each as Spark 4.2 reads
  it: a struct's mistyped field null, its other fields kept, in an array too; an array or a map
  holding one mistyped value of its own null whole), giving the same rows and the same
  quarantine reasons: the
  Spark form is Spark SQL's ``from_json``
  (:func:`modeswitch.transforms.parse_json_values`, no Python worker), the Arrow form is the
  msgspec parse (:func:`modeswitch.transforms.arrow.json_values_form`) that batch waves and the
  ``bucketlog`` reader run in their Python workers. The ``NOT NULL`` fields are the required
  ones. With ``event_time_field`` set, both forms put that field's time in ``event_time``
  (:mod:`modeswitch.control.value_schema`: the payload's time where the value holds one, the
  log's timestamp elsewhere; a ``NOT NULL`` event-time field quarantines a record without one);
- with none, :data:`raw_records`: the records land as they are (``bucket, offset, event_time,
  key, value``); the only record quarantined is one whose value is not UTF-8
  (``value is not UTF-8``: a Kafka source keeps such bytes as
  :data:`~modeswitch.sources.kafka.NOT_UTF8_PREFIX` + base64, which is not the value).

The demo's events (:data:`modeswitch.transforms.EVENT_SCHEMA`) are
:data:`EVENT_VALUE_SCHEMA`, which the demo's settings set; parsed with it, they give exactly
what :func:`~modeswitch.transforms.parse_events` and
:data:`~modeswitch.transforms.arrow.parse_events_arrow` give.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from modeswitch.control.field_types import decimal_type
from modeswitch.control.value_schema import SCHEMA_TRANSFORM, PayloadField, is_nested
from modeswitch.sources.kafka import NOT_UTF8_PREFIX
from modeswitch.transforms.arrow import json_values_form
from modeswitch.transforms.contract import QUARANTINE_REASON, ArrowForm, Transform
from modeswitch.transforms.spark_json import parse_json_values

EVENT_VALUE_SCHEMA = (
    "event_id BIGINT NOT NULL, user_id BIGINT NOT NULL, action STRING NOT NULL, "
    "amount DOUBLE NOT NULL, country STRING NOT NULL"
)
"""The demo's events (:data:`~modeswitch.transforms.EVENT_SCHEMA`, every field required) as a
``value_schema``."""

NOT_UTF8 = "value is not UTF-8"

_SPARK_TYPES: dict[str, DataType] = {
    "long": LongType(),
    "integer": IntegerType(),
    "short": ShortType(),
    "double": DoubleType(),
    "float": FloatType(),
    "string": StringType(),
    "boolean": BooleanType(),
    "timestamp": TimestampType(),
    "timestamp_ntz": TimestampNTZType(),
    "date": DateType(),
}


def payload_struct(fields: tuple[PayloadField, ...]) -> StructType:
    """The Spark schema of ``value_schema``'s fields (nullable: a quarantined row's are null)."""
    return StructType([StructField(f.name, spark_type(f.type)) for f in fields])


def spark_type(type_name: str) -> DataType:
    """The Spark type of a ``value_schema`` field's type name (``long``, ``decimal(7,2)``, a
    nested type's: ``struct<city:string,zip:integer>``, ``array<long>``,
    ``map<string,double>``; :data:`~modeswitch.control.value_schema.NESTED_TYPES`)."""
    dtype, end = _read_type(type_name, 0)
    assert end == len(type_name), f"not a value_schema type name: {type_name!r}"
    return dtype


def _read_type(text: str, at: int) -> tuple[DataType, int]:
    """The type whose name starts at ``at`` of ``text``, and where its name ends."""
    if text.startswith("array<", at):
        element, at = _read_type(text, at + len("array<"))
        return ArrayType(element), at + 1
    if text.startswith("map<string,", at):
        value, at = _read_type(text, at + len("map<string,"))
        return MapType(StringType(), value), at + 1
    if text.startswith("struct<", at):
        at += len("struct<")
        fields = []
        while True:
            name, at = _read_name(text, at)
            dtype, at = _read_type(text, at + 1)  # after the ':'
            fields.append(StructField(name, dtype))
            at += 1  # the ',' or the '>'
            if text[at - 1] == ">":
                return StructType(fields), at
    if text.startswith("decimal(", at):  # its size holds a comma
        end = text.index(")", at) + 1
    else:
        end = at
        while end < len(text) and text[end] not in ",>":
            end += 1
    name = text[at:end]
    size = decimal_type(name)
    return (_SPARK_TYPES[name] if size is None else DecimalType(*size)), end


def _read_name(text: str, at: int) -> tuple[str, int]:
    """A struct field's name from ``at`` (backquoted, a doubled backquote inside, or an
    identifier), and where it ends."""
    if text[at] != "`":
        end = text.index(":", at)
        return text[at:end], end
    out, at = [], at + 1
    while True:
        end = text.index("`", at)
        out.append(text[at:end])
        if text.startswith("``", end):
            out.append("`")
            at = end + 2
            continue
        return "".join(out), end + 1


def schema_transform(
    fields: tuple[PayloadField, ...], *, event_time: PayloadField | None = None
) -> Transform:
    """The transform ``transform = "value_schema"`` stands for (module docstring), from
    ``value_schema``'s parsed ``fields``: the payload parse into their columns, with
    ``event_time``'s time as the event time when given, or :data:`raw_records` without fields.
    The fields and the event-time field come checked from
    :func:`~modeswitch.control.value_schema.describe_payload`."""
    if not fields:
        return raw_records
    schema = payload_struct(fields)
    required = tuple(f.name for f in fields if f.required)
    event_time_name = None if event_time is None else event_time.name
    nested = any(is_nested(f.type) for f in fields)
    return Transform(
        name=SCHEMA_TRANSFORM,
        spark=functools.partial(
            _parse_spark, schema=schema, required=required, event_time=event_time_name
        ),
        # The Arrow parse reads flat payloads: a nested type's is from_json's alone.
        arrow=None
        if nested
        else functools.partial(
            _parse_arrow, schema=schema, required=required, event_time=event_time_name
        ),
        faster="spark" if nested else "arrow",
        columns_from="value_schema",
    )


def _parse_spark(
    df: DataFrame, *, schema: StructType, required: tuple[str, ...], event_time: str | None
) -> DataFrame:
    return parse_json_values(df, schema, required=required, event_time=event_time)


def _parse_arrow(
    input_schema: StructType,
    *,
    schema: StructType,
    required: tuple[str, ...],
    event_time: str | None,
) -> ArrowForm:
    return json_values_form(input_schema, schema, required=required, event_time=event_time)


def _raw_spark(df: DataFrame) -> DataFrame:
    value = F.col("value")
    return df.withColumn(
        QUARANTINE_REASON, F.when(value.startswith(NOT_UTF8_PREFIX), F.lit(NOT_UTF8))
    )


def _raw_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        value = batch.column("value")
        not_utf8 = pc.starts_with(value, NOT_UTF8_PREFIX)
        reason = pc.if_else(not_utf8, pa.scalar(NOT_UTF8), pa.scalar(None, pa.string()))
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, reason], names=[*batch.schema.names, QUARANTINE_REASON]
        )


def _raw_form(input_schema: StructType) -> ArrowForm:
    return ArrowForm(
        _raw_batches,
        StructType([*input_schema.fields, StructField(QUARANTINE_REASON, StringType())]),
    )


raw_records = Transform(name=SCHEMA_TRANSFORM, spark=_raw_spark, arrow=_raw_form)
"""``transform = "value_schema"`` with no ``value_schema``: every record as it is, with a null
quarantine reason, except a value that is not UTF-8 (module docstring)."""


__all__ = [
    "EVENT_VALUE_SCHEMA",
    "payload_struct",
    "raw_records",
    "schema_transform",
    "spark_type",
]
