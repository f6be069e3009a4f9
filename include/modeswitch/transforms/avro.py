"""The transform of an Avro payload (``value_format = avro``): each value decoded into the
top-level fields of the Avro reader schema, in two forms that give the same rows and reasons.

The Spark form is Spark's own Avro reader, ``from_avro``, one expression per schema id the job
knows (:mod:`modeswitch.transforms.avro_spark`): the stream's query and the batch paths that
read with Spark run it. The Arrow form is :class:`AvroDecoder` (fastavro) in the Python workers
of the Arrow waves and of the ``bucketlog`` reader. ``from_avro`` spends about a third of
fastavro's CPU (docs/BENCHMARKS.md, "Avro payloads"); the same cases and a property test hold
the two alike (tests/spark/test_avro_forms.py). The schemas are read once, when the job starts
(:func:`avro_transform`): from ``value_schema_file``, or from the registry's subject (every
version by schema id, and the version to read as), and travel with the job; no task asks the
registry.

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
driver asks the registry what the id is (:func:`learn_schema_id`) and the job is resolved again
(:func:`modeswitch.runners.jobs.run`): a foreign id's values are then quarantined with their
reason; a version registered since the job began is read under ``on_schema_change = evolve``
(the job reads the newest version, or the pinned one, and its commit adds the new columns),
read as the job's version under ``quarantine`` (quarantined where it cannot be), and stops the
job under ``fail`` (:class:`~modeswitch.errors.SchemaChangedError`).
"""

from __future__ import annotations

import base64
import functools
import io
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from modeswitch.control.payload_settings import AvroSchemaSource
from modeswitch.control.value_schema import RESERVED_NAMES, SCHEMA_TRANSFORM
from modeswitch.errors import ConfigError, SchemaChangedError, UnknownSchemaIdError
from modeswitch.sources.kafka import NOT_UTF8_PREFIX
from modeswitch.transforms.avro_spark import decode_with_spark
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
        foreign: frozenset[int] = frozenset(),
        what: str,
    ) -> None:
        self.reader = reader
        self.writers = dict(writers)
        self.foreign = frozenset(foreign)
        self.subject = subject
        self.version = version
        self.what = what
        self.columns_from = f"version {version} of subject {subject!r}" if subject else what
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

    def _writer(self, schema_id: int, buckets: pa.Array, offsets: pa.Array, index: int) -> Any:
        """The parsed writer schema of ``schema_id``, or None for an id found foreign to the
        subject; raises :class:`UnknownSchemaIdError` for an id the job does not know, naming
        the record at ``index`` of ``buckets``/``offsets`` (read only then)."""
        schemas = self._schemas()
        if schema_id in schemas:
            return schemas[schema_id]
        if schema_id in self.foreign:
            return None
        raise UnknownSchemaIdError(
            self.unknown_id_template.format(
                schema_id=schema_id, bucket=buckets[index].as_py(), offset=offsets[index].as_py()
            )
        )

    @property
    def unknown_id_template(self) -> str:
        """The message of a value naming an id the job does not know (``{schema_id}``,
        ``{bucket}`` and ``{offset}`` to fill), in both forms; :func:`unknown_id` reads
        it back."""
        subject = repr(self.subject).replace("{", "{{").replace("}", "}}")
        return (
            f"unknown schema id {{schema_id}} in a value of subject {subject} at bucket "
            f"{{bucket}} offset {{offset}}: this job reads as version {self.version}"
        )

    @property
    def not_framed(self) -> str:
        return NOT_FRAMED

    def undecodable(self, schema_id: int | None) -> str:
        """The reason of a value that does not decode, or not as the job's version."""
        if schema_id is None:
            return f"value does not decode as Avro with the schema of {self.what}"
        version = self.writers[schema_id][0]
        read_as = "" if version == self.version else f" read as version {self.version}"
        return (
            f"value does not decode as Avro with schema id {schema_id} (version {version} of "
            f"{self.subject}){read_as}"
        )

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
                reason = "value is null"
            else:
                raw = (
                    base64.b64decode(text[len(NOT_UTF8_PREFIX) :])
                    if text.startswith(NOT_UTF8_PREFIX)
                    else text.encode("utf-8")
                )
                if self.framed and (len(raw) < 5 or raw[0] != 0):
                    reason = NOT_FRAMED
                elif self.framed:
                    schema_id = int.from_bytes(raw[1:5], "big")
                    writer = self._writer(schema_id, buckets, offsets, index)
                    if writer is None:
                        reason = f"schema id {schema_id} is not a version of subject {self.subject}"
                    else:
                        row, reason = self._read(raw[5:], writer, schema_id, reader_id, reader)
                else:
                    row, reason = self._read(raw, reader, None, None, None)
            rows.append(row)
            reasons.append(reason)
            ids.append(schema_id)
        return self._columns(rows, reasons, ids), pa.array(reasons, pa.string())

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

    def _columns(
        self, rows: list[dict | None], reasons: list[str | None], ids: list[int | None]
    ) -> list[pa.Array]:
        struct = self.struct
        try:
            array = pa.array(rows, struct)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError):
            for index, row in enumerate(rows):  # find the rows that do not fit, quarantine them
                if row is None:
                    continue
                try:
                    pa.array([row], struct)
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError):
                    rows[index] = None  # a decimal wider than its precision: Spark's too
                    reasons[index] = self.undecodable(ids[index])
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


def avro_decoder(source: AvroSchemaSource, seen: SchemaIdsSeen | None = None) -> AvroDecoder:
    """The decoder of ``source``'s schemas, read now: the file's, or the registry subject's
    versions (:func:`~modeswitch.sources.schema_registry.read_subject`), with what the job's earlier
    runs learned (``seen``). Raises
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

    seen = seen or SchemaIdsSeen()
    version = source.version if seen.read_as is None else seen.read_as
    subject = read_subject(source.subject, version)
    return AvroDecoder(
        subject.reader,
        subject.writers,
        subject=subject.subject,
        version=subject.version,
        foreign=seen.foreign,
        what=f"version {subject.version} of subject {subject.subject!r} at {subject.registry}",
    )


@dataclass(frozen=True)
class SchemaIdsSeen:
    """What a job's earlier runs learned of the schema ids its values name
    (:func:`learn_schema_id`): ids the registry does not list under the subject (their values
    are quarantined), and the version to go on reading as (``on_schema_change = quarantine``;
    None: the settings' version)."""

    foreign: frozenset[int] = frozenset()
    read_as: int | None = None


_UNKNOWN = re.compile(r"unknown schema id (\d+) in a value of subject .*reads as version (\d+)")


def unknown_id(message: str) -> tuple[int, int] | None:
    """The schema id and the job's version an :class:`UnknownSchemaIdError`'s ``message``
    (:attr:`AvroDecoder.unknown_id_template`) names, or None for another text."""
    found = _UNKNOWN.search(message)
    return None if found is None else (int(found[1]), int(found[2]))


@dataclass(frozen=True)
class SchemaIdLearned:
    """What :func:`learn_schema_id` found: what the job run again knows, and in words."""

    seen: SchemaIdsSeen
    said: str
    """A sentence for the job's log and the decision log: the id, what it is, what the job
    does with it."""
    schema_id: int
    version: int | None
    """The subject's version the id is (None: foreign to the subject)."""


def learn_schema_id(message: str, source: AvroSchemaSource, seen: SchemaIdsSeen) -> SchemaIdLearned:
    """What the job run again knows after a value named a schema id it did not
    (``message``: an :class:`UnknownSchemaIdError`'s, from either form), asked of the registry
    on the driver: an id foreign to the subject is remembered (its values quarantined with that
    reason); a version registered since the job began is read as it is (``evolve``: the job
    resolved again reads the newest version, or the pinned one, and its commit adds the new
    columns), read as the job's version (``quarantine``), or stops the job
    (``fail``: :class:`SchemaChangedError`)."""
    from modeswitch.sources.schema_registry import find_schema_id

    found = unknown_id(message)
    if found is None:
        raise ValueError(f"not an unknown schema id's message: {message!r}")
    schema_id, read_as = found
    registered = find_schema_id(schema_id, source.subject)
    subject = repr(source.subject)
    if registered is None:
        return SchemaIdLearned(
            replace(seen, foreign=seen.foreign | {schema_id}),
            f"schema id {schema_id} is not a version of subject {subject}: its values are "
            "quarantined",
            schema_id,
            None,
        )
    version = registered[0]
    what = (
        f"schema id {schema_id} is version {version} of {subject}, registered after the job began"
    )
    if source.on_schema_change == "fail":
        raise SchemaChangedError(
            f"{message}: {what}; on_schema_change = fail: nothing of this wave or micro-batch "
            "is committed, and the job stops until the settings say what to read as "
            "(value_schema_version, or on_schema_change = evolve or quarantine)"
        )
    if source.on_schema_change == "quarantine":
        return SchemaIdLearned(
            replace(seen, read_as=read_as),
            f"{what}: its values are read as version {read_as} (on_schema_change = quarantine)",
            schema_id,
            version,
        )
    return SchemaIdLearned(
        seen,
        f"{what}: the job reads the subject again and adds the new columns "
        "(on_schema_change = evolve)",
        schema_id,
        version,
    )


def avro_transform(source: AvroSchemaSource, seen: SchemaIdsSeen | None = None) -> Transform:
    """The transform of an Avro payload (module docstring), its schemas read now."""
    return avro_transform_of(avro_decoder(source, seen))


def avro_transform_of(decoder: AvroDecoder) -> Transform:
    """The transform that runs ``decoder``: Spark's ``from_avro``
    (:mod:`modeswitch.transforms.avro_spark`) in its Spark form, fastavro in its Arrow form."""
    return Transform(
        name=SCHEMA_TRANSFORM,
        spark=functools.partial(decode_with_spark, decoder=decoder),
        arrow=functools.partial(_decode_form, decoder=decoder),
        faster="spark",  # about a third of fastavro's CPU (docs/BENCHMARKS.md, "Avro payloads")
        columns_from=decoder.columns_from,
    )


def _decode_form(input_schema: Any, *, decoder: AvroDecoder) -> ArrowForm:
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StringType, StructField, StructType

    payload = from_arrow_schema(pa.schema(decoder.columns))
    out = StructType(
        [*input_schema.fields, *payload.fields, StructField(QUARANTINE_REASON, StringType())]
    )
    return ArrowForm(functools.partial(decoder.batches, keep=list(input_schema.names)), out)


__all__ = [
    "NOT_FRAMED",
    "AvroDecoder",
    "SchemaIdLearned",
    "SchemaIdsSeen",
    "avro_decoder",
    "avro_transform",
    "avro_transform_of",
    "learn_schema_id",
    "unknown_id",
]
