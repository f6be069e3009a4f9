"""The transform of an Avro payload (``value_format = avro``): each value decoded into the
top-level fields of the Avro reader schema, in both forms, by one decoder.

The decoder (:class:`AvroDecoder`, fastavro) runs where the records are: in the Python workers
of batch waves and of the ``bucketlog`` reader (the Arrow form), and, for Spark's Kafka source,
in ``mapInArrow`` (the Spark form). Both forms so give the same rows and reasons by
construction. Its schemas are read once, when the job starts (:func:`avro_transform`): from
``value_schema_file``, or from the registry's subject (every version by schema id, and the
version to read as), and travel with the pickled decoder; a worker asks the registry only about
a schema id the job did not know.

A source keeps a value's bytes as text (:data:`~modeswitch.sources.kafka.NOT_UTF8_PREFIX` and
base64 where they are not UTF-8, the text's UTF-8 otherwise); the decoder takes them back. The
``value`` column stays as the source gave it (lineage). Column types:
:mod:`modeswitch.transforms.avro_types`.

Reasons, record by record (the typed columns are null on a row with one):

- ``value is null``;
- ``value is not in the schema registry's wire format (a zero magic byte and a 4-byte schema
  id)`` (framed values only);
- ``schema id N is not a version of subject S``: the registry, asked, does not list it;
- ``value does not decode as Avro with schema id N (version V of S)`` (or ``with the schema of
  value_schema_file``): the body ends early or holds what its schema cannot (an enum index, a
  union branch out of range, a length below zero);
- ``value written with schema id N (version W of S) cannot be read as version V: <why>``: the
  two versions are not compatible for this value (a field without a default, a type Avro does
  not promote);
- ``value does not fit its columns: <why>``: decoded, but a decimal holds more digits than its
  precision.

A value written with a version registered after the job began (its id was unknown, the registry
lists it under the subject) stops the job's run before it commits anything of its wave or
micro-batch (:class:`~modeswitch.errors.SchemaChangedError`), under ``on_schema_change = evolve``
or ``fail``; with ``evolve`` the job is resolved again at once and reads the new version
(:func:`modeswitch.runners.jobs.run`), with ``fail`` it stops. Under ``quarantine`` the value is
read as the job's version like an older one (its ``value`` keeps everything), or quarantined
with the reason above when it cannot be.
"""

from __future__ import annotations

import base64
import functools
import io
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from modeswitch.control.payload_settings import AvroSchemaSource
from modeswitch.control.value_schema import RESERVED_NAMES, SCHEMA_TRANSFORM
from modeswitch.errors import ConfigError, SchemaChangedError
from modeswitch.sources.kafka import NOT_UTF8_PREFIX
from modeswitch.transforms.avro_types import columns_of, decoding_schema
from modeswitch.transforms.contract import QUARANTINE_REASON, ArrowForm, Transform

NOT_FRAMED = (
    "value is not in the schema registry's wire format (a zero magic byte and a 4-byte schema id)"
)


class AvroDecoder:
    """Decodes a batch's values into the reader schema's columns and reasons (module
    docstring). Picklable: it holds the schemas' text and parses them where it first decodes.

    ``reader`` is the Avro schema every value is read as; ``writers`` maps each schema id the
    job knows to its version and schema (empty for a schema file: every value is the bare body
    written with ``reader``); ``subject``/``version`` name them in reasons and errors."""

    def __init__(
        self,
        reader: str,
        writers: Mapping[int, tuple[int, str]],
        *,
        subject: str = "",
        version: int = 0,
        on_schema_change: str = "evolve",
        what: str,
    ) -> None:
        self.reader = reader
        self.writers = dict(writers)
        self.subject = subject
        self.version = version
        self.on_schema_change = on_schema_change
        self.what = what
        self.columns = columns_of(decoding_schema(reader), what=what)
        self._check_names()
        self._parsed: dict[Any, Any] | None = None

    @property
    def framed(self) -> bool:
        return bool(self.writers)

    @functools.cached_property
    def reader_id(self) -> int | None:
        """The schema id of the version values are read as (None for a schema file)."""
        return next((i for i, (v, _) in self.writers.items() if v == self.version), None)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_parsed": None}

    def _check_names(self) -> None:
        seen: dict[str, str] = {}
        for column in self.columns:
            folded = column.name.lower()
            if folded in RESERVED_NAMES:
                raise ConfigError(
                    f"{self.what}: field {column.name!r} clashes with a column every record has "
                    f"already ({', '.join(RESERVED_NAMES)})"
                )
            if folded in seen:
                raise ConfigError(
                    f"{self.what}: fields {seen[folded]!r} and {column.name!r} differ in case "
                    "alone, which Spark's and Delta's column names do not tell apart"
                )
            seen[folded] = column.name

    @property
    def struct(self) -> pa.StructType:
        return pa.struct(self.columns)

    def _schemas(self) -> dict[Any, Any]:
        if self._parsed is None:
            parsed: dict[Any, Any] = {"reader": decoding_schema(self.reader)}
            for schema_id, (_, text) in self.writers.items():
                parsed[schema_id] = decoding_schema(text)
            self._parsed = parsed
        return self._parsed

    def _writer(self, schema_id: int, where: tuple[int, int]) -> Any:
        """The parsed writer schema of ``schema_id``: known, newer (asked of the registry), or
        None when it is not one of the subject's."""
        schemas = self._schemas()
        if schema_id in schemas:
            return schemas[schema_id]
        from modeswitch.sources.schema_registry import find_schema_id

        found = find_schema_id(schema_id, self.subject)
        if found is None:
            schemas[schema_id] = None
            return None
        version, text = found
        if self.on_schema_change != "quarantine":
            raise SchemaChangedError(
                f"subject {self.subject!r}: the value at bucket {where[0]} offset {where[1]} is "
                f"written with version {version} (schema id {schema_id}), registered after this "
                f"job began reading as version {self.version}; on_schema_change = "
                f"{self.on_schema_change}: nothing of this wave or micro-batch is committed, "
                + (
                    f"and the job, resolved again, reads version {version} and adds its new "
                    "columns to the sink"
                    if self.on_schema_change == "evolve"
                    else "and the job stops until the settings say what to read as "
                    "(value_schema_version, or on_schema_change = evolve or quarantine)"
                )
            )
        self.writers[schema_id] = (version, text)
        schemas[schema_id] = decoding_schema(text)
        return schemas[schema_id]

    def decode(
        self, values: pa.Array, buckets: pa.Array, offsets: pa.Array
    ) -> tuple[list[pa.Array], pa.Array]:
        """The columns (null on a quarantined row) and the reasons (null when good) of
        ``values``; ``buckets``/``offsets`` name a record in an error."""
        from fastavro import schemaless_reader
        from fastavro.read import SchemaResolutionError

        schemas = self._schemas()
        reader = schemas["reader"]
        reader_id = self.reader_id
        rows: list[dict | None] = []
        reasons: list[str | None] = []
        texts = values.to_pylist()
        for index, text in enumerate(texts):
            if text is None:
                rows.append(None)
                reasons.append("value is null")
                continue
            raw = (
                base64.b64decode(text[len(NOT_UTF8_PREFIX) :])
                if text.startswith(NOT_UTF8_PREFIX)
                else text.encode("utf-8")
            )
            schema_id = None
            writer = reader
            if self.framed:
                if len(raw) < 5 or raw[0] != 0:
                    rows.append(None)
                    reasons.append(NOT_FRAMED)
                    continue
                schema_id = int.from_bytes(raw[1:5], "big")
                writer = self._writer(schema_id, (buckets[index].as_py(), offsets[index].as_py()))
                if writer is None:
                    rows.append(None)
                    reasons.append(
                        f"schema id {schema_id} is not a version of subject {self.subject}"
                    )
                    continue
                raw = raw[5:]
            try:
                row = schemaless_reader(
                    io.BytesIO(raw),
                    writer,
                    None if schema_id == reader_id or not self.framed else reader,
                )
            except SchemaResolutionError as exc:
                rows.append(None)
                reasons.append(
                    f"value written with schema id {schema_id} ({self._version_of(schema_id)}) "
                    f"cannot be read as version {self.version}: {exc}"
                )
                continue
            except Exception:  # the body ends early or holds what its schema cannot
                rows.append(None)
                reasons.append(f"value does not decode as Avro {self._named(schema_id)}")
                continue
            rows.append(row)
            reasons.append(None)
        return self._columns(rows, reasons), pa.array(reasons, pa.string())

    def _version_of(self, schema_id: int | None) -> str:
        version = self.writers.get(schema_id, (None,))[0] if schema_id is not None else None
        return f"version {version} of {self.subject}"

    def _named(self, schema_id: int | None) -> str:
        if schema_id is None:
            return f"with the schema of {self.what}"
        return f"with schema id {schema_id} ({self._version_of(schema_id)})"

    def _columns(self, rows: list[dict | None], reasons: list[str | None]) -> list[pa.Array]:
        struct = self.struct
        try:
            array = pa.array(rows, struct)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError):
            for index, row in enumerate(rows):  # find the rows that do not fit, quarantine them
                if row is None:
                    continue
                try:
                    pa.array([row], struct)
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError) as exc:
                    rows[index] = None
                    reasons[index] = f"value does not fit its columns: {exc}"
            array = pa.array(rows, struct)
        return array.flatten()

    def batches(
        self, batches: Iterator[pa.RecordBatch], *, keep: list[str]
    ) -> Iterator[pa.RecordBatch]:
        """The Arrow form's work: each batch with the payload's columns and the reason added."""
        names = [column.name for column in self.columns]
        for batch in batches:
            columns, reasons = self.decode(
                batch.column("value"), batch.column("bucket"), batch.column("offset")
            )
            yield pa.RecordBatch.from_arrays(
                [*(batch.column(name) for name in keep), *columns, reasons],
                names=[*keep, *names, QUARANTINE_REASON],
            )


def avro_decoder(source: AvroSchemaSource) -> AvroDecoder:
    """The decoder of ``source``'s schemas, read now: the file's, or the registry subject's
    versions (:func:`~modeswitch.sources.schema_registry.read_subject`). Raises
    :class:`ConfigError` naming the setting for a file that cannot be read, or a schema whose
    fields have no column."""
    if not source.framed:
        path = Path(source.schema_file)
        what = f"value_schema_file {source.schema_file!r}"
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(
                f"{what}: cannot be read ({exc.strerror})", setting="value_schema_file"
            ) from exc
        try:
            return AvroDecoder(text, {}, what=what)
        except ConfigError:
            raise
        except Exception as exc:  # not JSON, not an Avro schema
            raise ConfigError(
                f"{what}: not an Avro schema ({exc})", setting="value_schema_file"
            ) from exc
    from modeswitch.sources.schema_registry import read_subject

    subject = read_subject(source.subject, source.version)
    return AvroDecoder(
        subject.reader,
        subject.writers,
        subject=subject.subject,
        version=subject.version,
        on_schema_change=source.on_schema_change,
        what=f"version {subject.version} of subject {subject.subject!r} at {subject.registry}",
    )


def avro_transform(source: AvroSchemaSource) -> Transform:
    """The transform of an Avro payload (module docstring), its schemas read now."""
    return avro_transform_of(avro_decoder(source))


def avro_transform_of(decoder: AvroDecoder) -> Transform:
    """The transform that runs ``decoder``, in both forms."""
    return Transform(
        name=SCHEMA_TRANSFORM,
        spark=functools.partial(_decode_spark, decoder=decoder),
        arrow=functools.partial(_decode_form, decoder=decoder),
    )


def _decode_form(input_schema: Any, *, decoder: AvroDecoder) -> ArrowForm:
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StringType, StructField, StructType

    payload = from_arrow_schema(pa.schema(decoder.columns))
    out = StructType(
        [*input_schema.fields, *payload.fields, StructField(QUARANTINE_REASON, StringType())]
    )
    return ArrowForm(functools.partial(decoder.batches, keep=list(input_schema.names)), out)


def _decode_spark(df: Any, *, decoder: AvroDecoder) -> Any:
    form = _decode_form(df.schema, decoder=decoder)
    return df.mapInArrow(form.function, form.schema)


__all__ = ["NOT_FRAMED", "AvroDecoder", "avro_decoder", "avro_transform", "avro_transform_of"]
