"""The transform of an Avro payload (``value_format = avro``): each value decoded into the
top-level fields of the Avro reader schema, in two forms that give the same rows and reasons.

The Spark form is Spark's own Avro reader, ``from_avro``, one expression per schema id the job
knows (:mod:`modeswitch.transforms.avro_spark`): the stream's query and the batch paths that
read with Spark run it. The Arrow form is :class:`AvroDecoder` (fastavro) in the Python workers
of the Arrow waves and of the ``bucketlog`` reader. ``from_avro`` spends about a third of
fastavro's CPU (docs/BENCHMARKS.md, "Avro and Protobuf payloads"); the same cases and a
property test hold the two alike (tests/spark/test_avro_forms.py). The schemas are read once,
when the job starts (:func:`binary_transform`): from ``value_schema_file``, or from the
registry's subject (every version by schema id, and the version to read as), and travel with
the job; no task asks the registry.

A source keeps a value's bytes as text (:data:`~modeswitch.sources.kafka.NOT_UTF8_PREFIX` and
base64 where they are not UTF-8, the text's UTF-8 otherwise); both forms take them back. The
``value`` column stays as the source gave it (lineage). Column types:
:mod:`modeswitch.transforms.avro_types`.

Reasons, record by record (the typed columns are null on a row with one):

- ``value is null``;
- ``value is not in the schema registry's wire format (a zero magic byte and a 4-byte schema
  id)`` (framed values only);
- ``schema id N is not a version of subject S``: the registry, asked, does not list it;
- ``value does not decode as Avro with schema id N (version W of S)``, with `` read as version
  V`` when the job reads as another version (or ``with the schema of value_schema_file ...``):
  the body ends early, holds what its schema cannot (an enum index, a union branch out of
  range, a length below zero), cannot be read as the job's version (a field without a default,
  a type Avro does not promote, a symbol the reader lacks), or holds a decimal wider than its
  column's precision. Spark's reader tells these apart from none of the others, so neither
  form does.

Where they differ (a deliberate choice, not a bug): a string field whose bytes are not UTF-8 is
kept by Spark's reader as those bytes and quarantined by fastavro.

A value naming a schema id the job did not know, and not one already found foreign to the
subject, stops the job's run before it commits anything of its wave or micro-batch
(:class:`~modeswitch.errors.UnknownSchemaIdError`, raised in the task by either form). The
driver asks the registry what the id is and the job is resolved again
(:mod:`modeswitch.transforms.schema_ids`): a foreign id's values are then quarantined with their
reason; a version registered since the job began is read under ``on_schema_change = evolve``
(the job reads the newest version, or the pinned one, and its commit adds the new columns),
read as the job's version under ``quarantine`` (quarantined where it cannot be), and stops the
job under ``fail`` (:class:`~modeswitch.errors.SchemaChangedError`).
"""

from __future__ import annotations

import functools
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from modeswitch.control.payload_settings import SchemaSource
from modeswitch.control.value_schema import SCHEMA_TRANSFORM
from modeswitch.errors import ConfigError
from modeswitch.transforms.avro_spark import decode_with_spark
from modeswitch.transforms.avro_types import columns_of, decoding_schema
from modeswitch.transforms.contract import Transform
from modeswitch.transforms.decoding import (
    SchemaDecoder,
    decoder_form,
    fitted_columns,
    value_bytes,
)
from modeswitch.transforms.schema_ids import SchemaIdsSeen, read_as_seen

_NOT_FRAMED = (
    "is not in the schema registry's wire format (a zero magic byte and a 4-byte schema id)"
)
NOT_FRAMED = f"value {_NOT_FRAMED}"


class AvroDecoder(SchemaDecoder):
    """Decodes a batch's values into the reader schema's columns and reasons (module
    docstring). Picklable: it holds the schemas' text and parses them where it first decodes.

    ``reader`` is the Avro schema every value is read as; ``writers`` maps each schema id the
    job knows to its version and schema (:class:`~modeswitch.transforms.decoding.SchemaDecoder`)."""

    decodes_as = "Avro"

    def __init__(
        self,
        reader: str,
        writers: Mapping[int, tuple[int, str]],
        *,
        subject: str = "",
        version: int = 0,
        foreign: frozenset[int] = frozenset(),
        what: str,
        column: str = "value",
    ) -> None:
        super().__init__(
            reader,
            writers,
            subject=subject,
            version=version,
            foreign=foreign,
            what=what,
            column=column,
        )
        self.columns = columns_of(decoding_schema(reader), what=what)
        self.check_names()

    @functools.cached_property
    def reader_id(self) -> int | None:
        """The schema id of the version values are read as (None for a schema file)."""
        return next((i for i, (v, _) in self.writers.items() if v == self.version), None)

    def _schemas(self) -> dict[Any, Any]:
        if self._built is None:
            parsed: dict[Any, Any] = {"reader": decoding_schema(self.reader)}
            for schema_id, (_, text) in self.writers.items():
                parsed[schema_id] = decoding_schema(text)
            self._built = parsed
        return self._built

    def _writer(
        self, schema_id: int, buckets: pa.Array, offsets: pa.Array, index: int
    ) -> tuple[Any, str | None]:
        """The parsed writer schema of ``schema_id``, or the reason of a value framed with an id
        not the subject's (:meth:`~modeswitch.transforms.decoding.SchemaDecoder.not_known`)."""
        schemas = self._schemas()
        if schema_id in schemas:
            return schemas[schema_id], None
        return None, self.not_known(schema_id, buckets, offsets, index)

    @property
    def not_framed(self) -> str:
        """:data:`NOT_FRAMED`, naming the decoder's column."""
        return f"{self.column} {_NOT_FRAMED}"

    def decode(
        self, values: pa.Array, buckets: pa.Array, offsets: pa.Array
    ) -> tuple[list[pa.Array], pa.Array]:
        """The columns (null on a quarantined row) and the reasons (null when good) of
        ``values``; ``buckets``/``offsets`` name a record in an error."""
        schemas = self._schemas()
        reader = schemas["reader"]
        reader_id = self.reader_id
        rows: list[dict | None] = []
        reasons: list[str | None] = []
        ids: list[int | None] = []  # each row's schema id (None for a schema file)
        for index, text in enumerate(values.to_pylist()):
            row, reason, schema_id = None, None, None
            if text is None:
                reason = self.null_reason
            else:
                raw = value_bytes(text)
                if self.framed and (len(raw) < 5 or raw[0] != 0):
                    reason = self.not_framed
                elif self.framed:
                    schema_id = int.from_bytes(raw[1:5], "big")
                    writer, reason = self._writer(schema_id, buckets, offsets, index)
                    if reason is None:
                        row, reason = self._read(raw[5:], writer, schema_id, reader_id, reader)
                else:
                    row, reason = self._read(raw, reader, None, None, None)
            rows.append(row)
            reasons.append(reason)
            ids.append(schema_id)
        columns = fitted_columns(rows, reasons, self.struct, lambda i: self.undecodable(ids[i]))
        return columns, pa.array(reasons, pa.string())

    def _read(
        self, body: bytes, writer: Any, schema_id: int | None, reader_id: int | None, reader: Any
    ) -> tuple[dict | None, str | None]:
        from fastavro import schemaless_reader

        try:
            return schemaless_reader(
                io.BytesIO(body), writer, None if schema_id == reader_id else reader
            ), None
        except Exception:  # ends early, holds what its schema cannot, does not resolve
            return None, self.undecodable(schema_id)


def avro_decoder(source: SchemaSource, seen: SchemaIdsSeen | None = None) -> AvroDecoder:
    """The decoder of ``source``'s schemas, read now: the file's, or the registry subject's
    versions (:func:`~modeswitch.sources.schema_registry.read_subject`), with what the job's earlier
    runs learned (``seen``). Raises
    :class:`ConfigError` naming the setting for a file that cannot be read, or a schema whose
    fields have no column."""
    if not source.framed:
        path = Path(source.schema_file)
        setting = f"{source.column}_schema_file"
        what = f"{setting} {source.schema_file!r}"
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"{what}: cannot be read ({exc.strerror})", setting=setting) from exc
        try:
            return AvroDecoder(text, {}, what=what, column=source.column)
        except ConfigError:
            raise
        except Exception as exc:  # not JSON, not an Avro schema
            raise ConfigError(f"{what}: not an Avro schema ({exc})", setting=setting) from exc
    subject, named = read_as_seen(source, seen, kind="AVRO")
    return AvroDecoder(subject.reader, subject.writers, **named, column=source.column)


def binary_decoder(source: SchemaSource, seen: SchemaIdsSeen | None = None) -> AvroDecoder:
    """The decoder of an Avro value or key (``source.column``), its schemas read now
    (:func:`avro_decoder`), its columns checked beside those every record of the source
    has."""
    return avro_decoder(source, seen).check_beside(source)


def binary_transform(source: SchemaSource, seen: SchemaIdsSeen | None = None) -> Transform:
    """The transform of a Avro payload (module docstring), its schemas read now."""
    return transform_of(binary_decoder(source, seen))


def transform_of(decoder: AvroDecoder) -> Transform:
    """The transform that runs ``decoder``: Spark's ``from_avro``
    (:mod:`modeswitch.transforms.avro_spark`) in its Spark form, fastavro in its Arrow form."""
    return Transform(
        name=SCHEMA_TRANSFORM,
        spark=functools.partial(decode_with_spark, decoder=decoder),
        arrow=functools.partial(decoder_form, decoder=decoder),
        faster="spark",  # a third of fastavro's CPU (BENCHMARKS.md, "Avro and Protobuf payloads")
        columns_from=decoder.columns_from,
    )


__all__ = [
    "NOT_FRAMED",
    "AvroDecoder",
    "avro_decoder",
    "binary_decoder",
    "binary_transform",
    "transform_of",
]
