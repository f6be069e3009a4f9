"""The Spark form of an Avro payload's decode: Spark's own Avro reader (``from_avro``, the
``spark-avro`` jar of ``jvm/pom.xml``) in one expression per schema id the job knows, chosen by
the id in each value's framing. It reads the same values into the same rows, with the same
reasons, as the decoder's Arrow form (:class:`~modeswitch.transforms.avro.AvroDecoder`, fastavro
in the Python workers), and spends a sixth of its CPU (docs/BENCHMARKS.md, "Avro payloads").

Per value, in Spark SQL, no Python: the bytes back from the source's text (the
``NOT_UTF8_PREFIX`` and base64, or the text's UTF-8), the framing checked (a zero byte, then the
schema id's four bytes), the body read by ``from_avro`` with the writer schema of its id and
``avroSchema`` set to the job's version (Avro's resolution, as fastavro's), in ``PERMISSIVE``
mode (a value that does not decode or resolve is null: one reason, as in the Arrow form), cast
to the payload's all-nullable columns. Both forms read the schemas with
:func:`~modeswitch.transforms.avro_types.plain_schema_text`.

A schema id the job does not know, and that is not among the ids already found foreign to the
subject, raises :class:`~modeswitch.errors.UnknownSchemaIdError` in the task (``raise_error``,
its message on a line of its own as a Python worker's would be), so nothing of the wave or
micro-batch is committed; the driver asks the registry and runs the job again
(:func:`modeswitch.runners.jobs.run`).
"""

from __future__ import annotations

import json
import string
from typing import Any

import pyarrow as pa

from modeswitch.errors import UnknownSchemaIdError
from modeswitch.sources.kafka import NOT_UTF8_PREFIX
from modeswitch.transforms.avro_types import plain_schema_text
from modeswitch.transforms.contract import QUARANTINE_REASON

UNKNOWN_SCHEMA_ID_ERROR = f"{UnknownSchemaIdError.__module__}.{UnknownSchemaIdError.__name__}"
"""How a Python worker's traceback names the error, which the Spark form's message starts with."""
_DECODED = "_modeswitch_decoded"
"""The field that is true where ``from_avro`` read the value (:func:`_flagged`)."""
_REST = 1 << 30
"""A substring's length that reaches the end of any value."""


def decode_with_spark(df: Any, *, decoder: Any) -> Any:
    """``df`` with the payload's columns and the reason added (module docstring), by
    ``decoder``'s schemas and words (an :class:`~modeswitch.transforms.avro.AvroDecoder`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro
    from pyspark.sql.pandas.types import from_arrow_schema

    columns = from_arrow_schema(pa.schema([*decoder.columns, pa.field(_DECODED, pa.bool_())]))
    value = F.col("value")
    raw = F.when(
        value.startswith(NOT_UTF8_PREFIX),
        F.unbase64(F.substring(value, len(NOT_UTF8_PREFIX) + 1, _REST)),
    ).otherwise(F.encode(value, "UTF-8"))
    reader = {"mode": "PERMISSIVE", "avroSchema": _flagged(decoder.reader)}
    if not decoder.framed:
        decoded = F.when(
            value.isNotNull(), from_avro(raw, plain_schema_text(decoder.reader), reader)
        ).cast(columns)
        reason = F.when(value.isNull(), F.lit("value is null")).when(
            decoded[_DECODED].isNull(), F.lit(decoder.undecodable(None))
        )
        return _with_payload(df, decoded, reason, decoder)
    framed = (F.length(raw) >= 5) & (F.hex(F.substring(raw, 1, 1)) == F.lit("00"))
    schema_id = F.conv(F.hex(F.substring(raw, 2, 4)), 16, 10).cast("long")
    body = F.substring(raw, 6, _REST)
    foreign = sorted(decoder.foreign)
    decoded = F.when(value.isNull() | ~framed, F.lit(None).cast(columns))
    for known, (_, text) in decoder.writers.items():
        decoded = decoded.when(
            schema_id == known, from_avro(body, plain_schema_text(text), reader).cast(columns)
        )
    decoded = decoded.when(schema_id.isin(foreign), F.lit(None).cast(columns)).otherwise(
        F.raise_error(_unknown_message(decoder, schema_id))
    )
    reason = (
        F.when(value.isNull(), F.lit("value is null"))
        .when(~framed, F.lit(decoder.not_framed))
        .when(
            schema_id.isin(foreign),
            F.concat(
                F.lit("schema id "),
                schema_id.cast("string"),
                F.lit(f" is not a version of subject {decoder.subject}"),
            ),
        )
    )
    for known in decoder.writers:
        reason = reason.when(
            (schema_id == known) & decoded[_DECODED].isNull(), F.lit(decoder.undecodable(known))
        )
    return _with_payload(df, decoded, reason, decoder)


def _flagged(schema: str) -> str:
    """The job's version of the schema (``schema``'s text, read as
    :func:`~modeswitch.transforms.avro_types.plain_schema_text` reads it) with one more field,
    :data:`_DECODED`, which only its default fills: ``from_avro`` in ``PERMISSIVE`` mode gives a
    row of nulls for a value it cannot read, and so tells it apart from one whose fields are all
    null."""
    node = json.loads(plain_schema_text(schema))
    node["fields"] = [*node["fields"], {"name": _DECODED, "type": "boolean", "default": True}]
    return json.dumps(node)


def _unknown_message(decoder: Any, schema_id: Any) -> Any:
    """:attr:`AvroDecoder.unknown_id_template`'s text, the row's id, bucket and offset in it,
    on a line of its own as a Python worker's error is (what the driver looks for)."""
    from pyspark.sql import functions as F

    fields = {
        "schema_id": schema_id.cast("string"),
        "bucket": F.col("bucket").cast("string"),
        "offset": F.col("offset").cast("string"),
    }
    parts = [F.lit(f"\n{UNKNOWN_SCHEMA_ID_ERROR}: ")]
    for literal, field, _, _ in string.Formatter().parse(decoder.unknown_id_template):
        parts.append(F.lit(literal))
        if field:
            parts.append(fields[field])
    return F.concat(*parts, F.lit("\n"))


def _with_payload(df: Any, decoded: Any, reason: Any, decoder: Any) -> Any:
    payload = "_modeswitch_avro"
    kept = [f"`{name}`" for name in df.columns]
    return df.select(*kept, decoded.alias(payload), reason.alias(QUARANTINE_REASON)).select(
        *kept,
        *(f"`{payload}`.`{column.name}`" for column in decoder.columns),
        QUARANTINE_REASON,
    )


__all__ = ["decode_with_spark"]
