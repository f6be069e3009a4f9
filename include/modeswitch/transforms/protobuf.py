"""The transform of a Protobuf payload (``value_format = protobuf``): each value decoded as the
job's message (``value_message``, by default its schema's first) into its fields' columns
(:mod:`modeswitch.transforms.protobuf_types`).

Its schemas are read once, when the job starts (:func:`binary_transform`): from
``value_schema_file`` (a ``.proto``, or a descriptor set), or from the registry's subject
(every version by schema id, each compiled with its references,
:mod:`modeswitch.transforms.protobuf_schemas`), and travel with the job as descriptor sets; no
task asks the registry.

Framed values are as registry clients write them: a zero magic byte, the 4-byte big-endian
schema id, the *message indexes* (zigzag varints: how many, then the path of the message in
its file, ``[0]`` written as one zero byte), then the body. Protobuf needs no resolution step
between versions: every value is parsed as the job's version of the message, whatever version
wrote it; fields match by number, a field the job's version lacks is dropped, one the value
lacks reads as absent.

Both forms of the transform run this one decoder (:class:`ProtobufDecoder`, Protobuf's own
``upb`` parser in the Python workers): Spark's ``from_protobuf`` is in a jar Maven Central does
not serve here (spark-protobuf, tried for 4.2.0, 4.1.1 and 4.0.0), so the Spark form is the
decoder through ``mapInArrow``, and the Arrow form is the faster (no row through the JVM).

Reasons, record by record (the typed columns are null on a row with one):

- ``value is null``;
- :data:`NOT_FRAMED` (framed values only): too short, another magic byte, or message indexes
  that do not parse;
- ``schema id N is not a version of subject S``: the registry, asked, does not list it;
- ``value is message X of schema id N, not M`` (the indexes name another message, or none);
- ``value does not decode as Protobuf message M with schema id N (version W of S)``, with
  `` read as version V`` when the job reads as another version (or ``with the schema of
  value_schema_file ...``): the body is cut short or not Protobuf, a string is not UTF-8, a
  field arrived with another wire type than the job's version has for its number, or an enum's
  number has no symbol in the job's version.

A value naming a schema id the job did not know stops the job's run before it commits, as an
Avro payload's does (:mod:`modeswitch.transforms.schema_ids`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from modeswitch.control.payload_settings import SchemaSource
from modeswitch.control.value_schema import SCHEMA_TRANSFORM
from modeswitch.errors import ConfigError
from modeswitch.transforms.contract import Transform
from modeswitch.transforms.decoding import (
    SchemaDecoder,
    decoder_form,
    fitted_columns,
    value_bytes,
)
from modeswitch.transforms.protobuf_schemas import (
    descriptor_set,
    find_message,
    message_at,
    pool_of,
    registered_file,
    root_file,
    schema_file_set,
)
from modeswitch.transforms.protobuf_types import message_columns, row_reader
from modeswitch.transforms.schema_ids import SchemaIdsSeen, read_as_seen

_NOT_FRAMED = (
    "is not in the schema registry's wire format for Protobuf (a zero magic byte, a 4-byte "
    "schema id, the message indexes)"
)
NOT_FRAMED = f"value {_NOT_FRAMED}"
ROOT = "modeswitch_registered.proto"
"""The file name a registered schema is compiled under (no schema imports it)."""
FIRST_MESSAGE = (0,)
"""The message indexes of a file's first message, written as one zero byte."""
DIRECT = 6
"""The length of a framing whose indexes are :data:`FIRST_MESSAGE` (decoded without parsing
it, by a table of the framings of the job's message)."""


def message_indexes(raw: bytes) -> tuple[tuple[int, ...], int] | None:
    """The message indexes after a framed value's schema id, and where its body starts; None
    when they do not parse (a varint cut short, a negative count)."""
    if len(raw) > 5 and raw[5] == 0:
        return FIRST_MESSAGE, 6
    numbers: list[int] = []
    at = 5
    count = None
    while count is None or len(numbers) < count:
        shift = value = 0
        while True:
            if at >= len(raw) or shift > 63:
                return None
            byte = raw[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        number = (value >> 1) ^ -(value & 1)
        if count is None:
            if number < 0:
                return None
            count = number
        else:
            numbers.append(number)
    return tuple(numbers) or FIRST_MESSAGE, at


class ProtobufDecoder(SchemaDecoder):
    """Decodes a batch's values into the job's message's columns and reasons (module
    docstring). Picklable: it holds descriptor sets' bytes and builds the descriptors where it
    first decodes.

    ``reader`` is the descriptor set of the version every value is read as, ``message`` the
    message's full name in it (empty: its root file's first); ``writers`` maps each schema id
    the job knows to its version and descriptor set
    (:class:`~modeswitch.transforms.decoding.SchemaDecoder`)."""

    def __init__(
        self,
        reader: bytes,
        message: str,
        writers: Mapping[int, tuple[int, bytes]],
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
        descriptor = find_message(reader, message, what=what)
        self.message = descriptor.full_name
        self.decodes_as = f"Protobuf message {self.message}"
        self.columns = message_columns(descriptor, what=what)
        self.check_names()

    def _parts(self) -> dict[str, Any]:
        """The job's message class and row reader, built once per process."""
        if self._built is None:
            from google.protobuf import message_factory

            descriptor = pool_of(self.reader).FindMessageTypeByName(self.message)
            self._built = {
                "parse": message_factory.GetMessageClass(descriptor).FromString,
                "row": row_reader(descriptor),
                "names": {},  # (schema id, indexes) -> the message's full name, or None
                "direct": {},  # a framing of the job's message as [0] -> its schema id
            }
            for schema_id in self.writers:
                if self._message_of(schema_id, FIRST_MESSAGE) == self.message:
                    frame = b"\x00" + schema_id.to_bytes(4, "big") + b"\x00"
                    self._built["direct"][frame] = schema_id
        return self._built

    def _message_of(self, schema_id: int, indexes: tuple[int, ...]) -> str | None:
        names = self._parts()["names"]
        key = (schema_id, indexes)
        if key not in names:
            found = message_at(root_file(self.writers[schema_id][1]), indexes)
            names[key] = None if found is None else found.full_name
        return names[key]

    def decode(
        self, values: pa.Array, buckets: pa.Array, offsets: pa.Array
    ) -> tuple[list[pa.Array], pa.Array]:
        """The columns (null on a quarantined row) and the reasons (null when good) of
        ``values``; ``buckets``/``offsets`` name a record in an error."""
        parts = self._parts()
        parse, row_of = parts["parse"], parts["row"]
        rows: list[tuple | dict | None] = []
        reasons: list[str | None] = []
        ids: list[int | None] = []
        direct = parts["direct"]
        for index, text in enumerate(values.to_pylist()):
            if text is None:  # no body to parse: a null key's columns are null too
                rows.append(None)
                reasons.append(self.null_reason)
                ids.append(None)
                continue
            row, reason = None, None
            raw = value_bytes(text)
            schema_id = direct.get(raw[:DIRECT])
            if schema_id is not None:  # the job's message, as most values are
                body = raw[DIRECT:]
            else:
                body, reason, schema_id = self._body(raw, buckets, offsets, index)
            if reason is None:
                try:
                    row = row_of(parse(body))
                except Exception:  # cut short, not Protobuf, NotReadable
                    reason = self.undecodable(schema_id)
            rows.append(row)
            reasons.append(reason)
            ids.append(schema_id)
        columns = fitted_columns(rows, reasons, self.struct, lambda i: self.undecodable(ids[i]))
        return columns, pa.array(reasons, pa.string())

    def _body(
        self, raw: bytes, buckets: pa.Array, offsets: pa.Array, index: int
    ) -> tuple[bytes, str | None, int | None]:
        """A value's body, the reason it has none, and its schema id (None unframed)."""
        if not self.framed:
            return raw, None, None
        indexed = message_indexes(raw) if len(raw) > 5 and raw[0] == 0 else None
        if indexed is None:
            return b"", f"{self.column} {_NOT_FRAMED}", None
        schema_id = int.from_bytes(raw[1:5], "big")
        if schema_id not in self.writers:
            return b"", self.not_known(schema_id, buckets, offsets, index), None
        indexes, start = indexed
        named = self._message_of(schema_id, indexes)
        if named != self.message:
            path = "[" + ", ".join(map(str, indexes)) + "]"
            return (
                b"",
                f"{self.column} is message {named or path} of schema id {schema_id}, not "
                f"{self.message}",
                schema_id,
            )
        return raw[start:], None, schema_id


def protobuf_decoder(source: SchemaSource, seen: SchemaIdsSeen | None = None) -> ProtobufDecoder:
    """The decoder of ``source``'s schemas, read now: the file's, or the registry subject's
    versions (:func:`~modeswitch.sources.schema_registry.read_subject`, each compiled with its
    references), with what the job's earlier runs learned (``seen``). Raises
    :class:`ConfigError` naming the setting for a schema that cannot be read or compiled, a
    message it lacks, or a field without a column."""
    if not source.framed:
        setting = f"{source.column}_schema_file"
        what = f"{setting} {source.schema_file!r}"
        try:
            content = schema_file_set(source.schema_file, what=what)
        except ConfigError as exc:
            raise ConfigError(str(exc), setting=setting) from exc
        return ProtobufDecoder(content, source.message, {}, what=what, column=source.column)
    subject, named = read_as_seen(source, seen, kind="PROTOBUF")
    writers = {
        schema_id: (
            number,
            descriptor_set(
                {**subject.imports[schema_id], ROOT: registered_file(text)},
                ROOT,
                what=f"{source.column}_subject: version {number} of subject "
                f"{subject.subject!r} (schema id {schema_id}) at {subject.registry}",
            ),
        )
        for schema_id, (number, text) in subject.writers.items()
    }
    return ProtobufDecoder(
        writers[subject.reader_id][1], source.message, writers, **named, column=source.column
    )


def binary_decoder(source: SchemaSource, seen: SchemaIdsSeen | None = None) -> ProtobufDecoder:
    """The decoder of a Protobuf value or key (``source.column``), its schemas read now
    (:func:`protobuf_decoder`), its columns checked beside those every record of the source
    has."""
    return protobuf_decoder(source, seen).check_beside(source)


def binary_transform(source: SchemaSource, seen: SchemaIdsSeen | None = None) -> Transform:
    """The transform of a Protobuf payload (module docstring), its schemas read now."""
    return transform_of(binary_decoder(source, seen))


def transform_of(decoder: ProtobufDecoder) -> Transform:
    """The transform that runs ``decoder``: in the Python workers in both forms (the Spark form
    through ``mapInArrow``)."""
    return Transform(
        name=SCHEMA_TRANSFORM,
        spark=functools.partial(_through_arrow, decoder=decoder),
        arrow=functools.partial(decoder_form, decoder=decoder),
        faster="arrow",  # the same decoder; the Spark form adds the JVM's rows
        columns_from=decoder.columns_from,
    )


def _through_arrow(df: Any, *, decoder: ProtobufDecoder) -> Any:
    form = decoder_form(df.schema, decoder=decoder)
    return df.mapInArrow(form.function, form.schema)


__all__ = [
    "FIRST_MESSAGE",
    "NOT_FRAMED",
    "ProtobufDecoder",
    "binary_decoder",
    "binary_transform",
    "message_indexes",
    "protobuf_decoder",
    "transform_of",
]
