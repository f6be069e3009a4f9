"""What the decoders of binary payloads share (Avro's, :mod:`modeswitch.transforms.avro`;
Protobuf's, :mod:`modeswitch.transforms.protobuf`): :class:`SchemaDecoder` (the schemas a job
knows, its columns' names checked, the reasons and errors in words), a value's bytes back from
the source's text, decoded rows made the payload's columns, and a decoder's Arrow form.
"""

from __future__ import annotations

import binascii
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa

from modeswitch.control.payload_settings import SchemaSource, column_prefix
from modeswitch.control.value_schema import RESERVED_NAMES, check_beside_record
from modeswitch.errors import ConfigError, UnknownSchemaIdError
from modeswitch.sources.kafka import NOT_UTF8_PREFIX
from modeswitch.transforms.contract import QUARANTINE_REASON, ArrowForm
from modeswitch.transforms.schema_ids import unknown_id_template

_PREFIX_LENGTH = len(NOT_UTF8_PREFIX)
_DOES_NOT_FIT = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError)


class SchemaDecoder:
    """What a decoder of a binary payload knows and how it says things. ``reader`` is the
    schema every value is read as (in the format's own form); ``writers`` maps each schema id
    the job knows to its version and schema (empty for a schema file: every value is the bare
    body written with ``reader``); ``foreign`` the ids found not to be the subject's;
    ``subject``/``version`` name them in reasons and errors, ``what`` the schema's source;
    ``column`` is the record's column it decodes (``value``, or ``key``: reasons then name the
    key, its columns are named ``key_<field>``, and a null key is no reason). A subclass sets
    :attr:`columns` (the schema's fields as Arrow fields) and :attr:`decodes_as`, then calls
    :meth:`check_names`, and gives ``decode(values, buckets, offsets)``: the columns and the
    reasons of a batch's values (or keys)."""

    columns: list[pa.Field]
    decodes_as: str
    """What a value that does not decode is not: ``Avro``, ``Protobuf message shop.Order``."""

    def __init__(
        self,
        reader: Any,
        writers: Mapping[int, tuple[int, Any]],
        *,
        subject: str,
        version: int,
        foreign: frozenset[int],
        what: str,
        column: str = "value",
    ) -> None:
        self.column = column
        self.prefix = column_prefix(column)
        self.null_reason = {"value": "value is null", "key": None}[column]
        """The reason of a null value; a null key is none (its columns are null)."""
        self.reader = reader
        self.writers = dict(writers)
        self.foreign = frozenset(foreign)
        self.subject = subject
        self.version = version
        self.what = what
        self.framed = bool(self.writers)
        self.columns_from = f"version {version} of subject {subject!r}" if subject else what

    def check_names(self) -> None:
        """Refuses, naming the fields, a column named as every record's are, or two whose
        names differ in case alone."""
        seen: dict[str, str] = {}
        for name in self.names:
            folded = name.lower()
            if folded in RESERVED_NAMES:
                raise ConfigError(
                    f"{self.what}: field {name!r} clashes with a column every record has "
                    f"already ({', '.join(RESERVED_NAMES)})"
                )
            if folded in seen:
                raise ConfigError(
                    f"{self.what}: fields {seen[folded]!r} and {name!r} differ in case "
                    "alone, which Spark's and Delta's column names do not tell apart"
                )
            seen[folded] = name

    def check_beside(self, source: SchemaSource) -> SchemaDecoder:
        """Itself, once no column is named as one the records of ``source`` have beyond every
        log's (:func:`~modeswitch.control.value_schema.check_beside_record`)."""
        check_beside_record(self.names, source.record_columns, what=self.what)
        return self

    @property
    def names(self) -> list[str]:
        """Its columns' names in the transform's output: the fields', after :attr:`prefix`."""
        return [self.prefix + column.name for column in self.columns]

    @property
    def output_columns(self) -> list[pa.Field]:
        """Its columns as the transform's output has them (:attr:`names`)."""
        return [c.with_name(n) for c, n in zip(self.columns, self.names, strict=True)]

    @property
    def struct(self) -> pa.StructType:
        return pa.struct(self.columns)

    @property
    def unknown_id_template(self) -> str:
        """The message of a value naming an id the job does not know, in every form
        (:func:`~modeswitch.transforms.schema_ids.unknown_id_template`)."""
        return unknown_id_template(self.subject, self.version, self.column)

    def not_known(self, schema_id: int, buckets: pa.Array, offsets: pa.Array, index: int) -> str:
        """The reason of a value framed with ``schema_id``, not one of :attr:`writers`: one
        found foreign to the subject. Raises :class:`UnknownSchemaIdError` for an id the job
        does not know, naming the record at ``index`` of ``buckets``/``offsets``."""
        if schema_id in self.foreign:
            return f"schema id {schema_id} is not a version of subject {self.subject}"
        raise UnknownSchemaIdError(
            self.unknown_id_template.format(
                schema_id=schema_id, bucket=buckets[index].as_py(), offset=offsets[index].as_py()
            )
        )

    def undecodable(self, schema_id: int | None) -> str:
        """The reason of a value that does not decode, or not as the job's version."""
        if schema_id is None:
            return (
                f"{self.column} does not decode as {self.decodes_as} with the schema of {self.what}"
            )
        version = self.writers[schema_id][0]
        read_as = "" if version == self.version else f" read as version {self.version}"
        return (
            f"{self.column} does not decode as {self.decodes_as} with schema id {schema_id} "
            f"(version {version} of {self.subject}){read_as}"
        )

    _built: Any = None
    """What a process built of the schemas (parsed, compiled), when it first decodes."""

    def __getstate__(self) -> dict[str, Any]:
        """What travels to the Python workers: the schemas, not what a process built of them."""
        return {**self.__dict__, "_built": None}


def value_bytes(text: str) -> bytes:
    """A value's bytes from the text a source keeps them as
    (:data:`~modeswitch.sources.kafka.NOT_UTF8_PREFIX` and base64 where they are not UTF-8,
    the text's UTF-8 otherwise)."""
    if text.startswith(NOT_UTF8_PREFIX):
        return binascii.a2b_base64(text[_PREFIX_LENGTH:])
    return text.encode("utf-8")


def fitted_columns(
    rows: list[tuple | dict | None],
    reasons: list[str | None],
    struct: pa.StructType,
    reason_of: Callable[[int], str],
) -> list[pa.Array]:
    """``rows`` as the columns of ``struct`` (null where a row is None). A row whose values do
    not fit their columns (a decimal wider than its precision, a time out of range) is made
    None, its reason in ``reasons`` ``reason_of(its index)``."""
    try:
        return pa.array(rows, struct).flatten()
    except _DOES_NOT_FIT:
        for index, row in enumerate(rows):
            if row is None:
                continue
            try:
                pa.array([row], struct)
            except _DOES_NOT_FIT:
                rows[index] = None
                reasons[index] = reason_of(index)
        return pa.array(rows, struct).flatten()


def decoder_form(input_schema: Any, *, decoder: Any) -> ArrowForm:
    """The Arrow form of ``decoder`` for input of ``input_schema``: its batches with the
    payload's columns and :data:`~modeswitch.transforms.contract.QUARANTINE_REASON` added."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StringType, StructField, StructType

    payload = from_arrow_schema(pa.schema(decoder.output_columns))
    out = StructType(
        [*input_schema.fields, *payload.fields, StructField(QUARANTINE_REASON, StringType())]
    )
    return ArrowForm(
        functools.partial(decoded_batches, decoder=decoder, keep=list(input_schema.names)), out
    )


def decoded_batches(
    batches: Iterator[pa.RecordBatch], *, decoder: Any, keep: list[str]
) -> Iterator[pa.RecordBatch]:
    """The Arrow form's work: each batch's ``keep`` columns with the payload's columns and the
    reason added."""
    names = decoder.names
    for batch in batches:
        columns, reasons = decoder.decode(
            batch.column(decoder.column), batch.column("bucket"), batch.column("offset")
        )
        yield pa.RecordBatch.from_arrays(
            [*(batch.column(name) for name in keep), *columns, reasons],
            names=[*keep, *names, QUARANTINE_REASON],
        )


__all__ = [
    "SchemaDecoder",
    "decoded_batches",
    "decoder_form",
    "fitted_columns",
    "value_bytes",
]
