"""The Spark form of an Avro payload's decode: Spark's own Avro reader (``from_avro``, the
``spark-avro`` jar of ``jvm/pom.xml``) in one expression per schema id the job knows, chosen by
the id in each value's framing. It reads the same values into the same rows, with the same
reasons, as the decoder's Arrow form (:class:`~modeswitch.transforms.avro.AvroDecoder`, fastavro
in the Python workers), on a fifth of its CPU (docs/BENCHMARKS.md, "Avro and Protobuf payloads").

Per value, in Spark SQL, no Python: the bytes back from the source's text (the
``NOT_UTF8_PREFIX`` and base64, or the text's UTF-8), the framing checked (a zero byte, then the
schema id's four bytes), the body read by ``from_avro`` with the writer schema of its id (and,
for another version than the job's, ``avroSchema`` set to the job's: Avro's resolution, as
fastavro's), in ``PERMISSIVE`` mode, cast to the payload's all-nullable columns. A value that
does not decode or resolve is then a row of nulls: a field of the job's version that is never
null tells it apart (one reason, as in the Arrow form); a version without one gets one more
field that only its default fills, and every value is resolved against it. Both forms read
the schemas with :func:`~modeswitch.transforms.avro_types.plain_schema_text`.

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
"""The field only its default fills, where the job's version has no field that is never null
(:class:`_Found`)."""
_RAW, _ID, _PAYLOAD = "_modeswitch_raw", "_modeswitch_schema_id", "_modeswitch_payload"
"""The staged columns of :func:`decode_with_spark`: the bytes, the schema id, the struct."""
_REST = 1 << 30
"""A substring's length that reaches the end of any value."""


def decode_with_spark(df: Any, *, decoder: Any) -> Any:
    """``df`` with the payload's columns and the reason added (module docstring), by
    ``decoder``'s schemas and words (an :class:`~modeswitch.transforms.avro.AvroDecoder`).

    In three projections, so that Spark computes each step once per row (its optimizer keeps
    apart projections whose merge would repeat an expression that is not cheap): the bytes and
    the schema id, then the decoded struct, then the reason."""
    from pyspark.sql import functions as F

    kept = [f"`{name}`" for name in df.columns]
    value = F.col(decoder.column)
    raw = F.when(
        value.startswith(NOT_UTF8_PREFIX),
        F.unbase64(F.substring(value, len(NOT_UTF8_PREFIX) + 1, _REST)),
    ).otherwise(F.encode(value, "UTF-8"))
    schema_id = F.conv(F.hex(F.substring(F.col(_RAW), 2, 4)), 16, 10).cast("long")
    staged = df.select(*kept, raw.alias(_RAW)).select(*kept, _RAW, schema_id.alias(_ID))
    found = _Found(decoder)
    decoded = staged.select(*kept, _RAW, _ID, found.decoded().alias(_PAYLOAD))
    return decoded.select(
        *kept,
        *(
            F.col(_PAYLOAD)[column.name].alias(name)
            for column, name in zip(decoder.columns, decoder.names, strict=True)
        ),
        found.reason().alias(QUARANTINE_REASON),
    )


class _Found:
    """The decoded struct and the reason of a value, as Spark expressions on the staged
    columns (:func:`decode_with_spark`)."""

    def __init__(self, decoder: Any) -> None:
        from pyspark.sql.pandas.types import from_arrow_schema

        self.decoder = decoder
        reader = json.loads(plain_schema_text(decoder.reader))
        required = [f["name"] for f in reader["fields"] if _required(f["type"])]
        # A value from_avro cannot read is a row of nulls (PERMISSIVE): a field that is never
        # null tells it apart, else one more field that only its default fills.
        self.marker = required[0] if required else _DECODED
        fields = [*decoder.columns, *([] if required else [pa.field(_DECODED, pa.bool_())])]
        self.columns = from_arrow_schema(pa.schema(fields))
        if not required:
            reader["fields"] = [
                *reader["fields"],
                {"name": _DECODED, "type": "boolean", "default": True},
            ]
        self.reader = json.dumps(reader)
        self.resolve_all = not required

    def _read(self, body: Any, text: str, version: int | None) -> Any:
        """``body`` read by ``from_avro`` with the writer schema ``text`` (of ``version``),
        as the job's version."""
        from pyspark.sql.avro.functions import from_avro

        options = {"mode": "PERMISSIVE"}
        if self.resolve_all or version != self.decoder.version:
            options["avroSchema"] = self.reader
        return from_avro(body, plain_schema_text(text), options).cast(self.columns)

    def decoded(self) -> Any:
        from pyspark.sql import functions as F

        raw, schema_id = F.col(_RAW), F.col(_ID)
        if not self.decoder.framed:
            return F.when(
                raw.isNotNull(), self._read(raw, self.decoder.reader, self.decoder.version)
            )
        body = F.substring(raw, 6, _REST)
        decoded = F.when(raw.isNull() | ~_framed(raw), F.lit(None).cast(self.columns))
        for known, (version, text) in self.decoder.writers.items():
            decoded = decoded.when(schema_id == known, self._read(body, text, version))
        foreign = sorted(self.decoder.foreign)
        return decoded.when(schema_id.isin(foreign), F.lit(None).cast(self.columns)).otherwise(
            F.raise_error(_unknown_message(self.decoder, schema_id))
        )

    def reason(self) -> Any:
        from pyspark.sql import functions as F

        failed = F.col(_PAYLOAD)[self.marker].isNull()
        column = F.col(self.decoder.column)
        reason = F.when(column.isNull(), F.lit(self.decoder.null_reason).cast("string"))
        if not self.decoder.framed:
            return reason.when(failed, F.lit(self.decoder.undecodable(None)))
        schema_id = F.col(_ID)
        reason = reason.when(~_framed(F.col(_RAW)), F.lit(self.decoder.not_framed)).when(
            schema_id.isin(sorted(self.decoder.foreign)),
            F.concat(
                F.lit("schema id "),
                schema_id.cast("string"),
                F.lit(f" is not a version of subject {self.decoder.subject}"),
            ),
        )
        for known in self.decoder.writers:
            reason = reason.when(
                (schema_id == known) & failed, F.lit(self.decoder.undecodable(known))
            )
        return reason


def _framed(raw: Any) -> Any:
    """Whether the bytes ``raw`` hold the registry's framing: a zero byte, then an id."""
    from pyspark.sql import functions as F

    return (F.length(raw) >= 5) & (F.hex(F.substring(raw, 1, 1)) == F.lit("00"))


def _required(avro_type: Any) -> bool:
    """Whether a field of ``avro_type`` is never null in a value that decodes."""
    if isinstance(avro_type, list):
        return "null" not in avro_type
    return avro_type != "null"


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


__all__ = ["decode_with_spark"]
