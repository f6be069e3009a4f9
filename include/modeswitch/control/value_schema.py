"""The ``value_schema`` setting: a record's JSON payload as a Spark DDL schema, read without Spark;
and the ``event_time_field`` setting: which of its fields is the record's event time.

Why this module stays whole (over 500 lines): it is the one definition of what these settings
mean. The grammar's reader (``_Reader``), the types it takes (:data:`DDL_TYPES`,
:data:`NESTED_TYPES`), what ``NOT NULL`` and the event time mean, and :func:`describe_payload`'s
rules between the payload settings are read together whenever one changes; the reader is private
to :func:`parse_value_schema` and has no other user.

``value_schema = "id BIGINT NOT NULL, user STRING, amount DOUBLE"`` says what each record's
``value`` holds; the pipeline's default transform (``transform = "value_schema"``,
:mod:`modeswitch.transforms.payload`) parses it into those columns, in both of its forms
(Spark's ``from_json`` and the Arrow parse). :func:`parse_value_schema` reads the string on the
driver when the settings are built, with no JVM, and refuses, naming the setting and the
value, what either form could not parse the same way.

The grammar is Spark's DDL: ``name TYPE [NOT NULL] [COMMENT 'text']``, fields
separated by commas; a name is an identifier (letters, digits, ``_``, not starting with a
digit) or any text between backquotes (`` `user-id` ``, a backquote doubled inside); keywords
in any case. The types (:data:`DDL_TYPES`) are those the Arrow parse reads exactly as the Spark
form does: integers (``BIGINT``/``LONG``, ``INT``/``INTEGER``, ``SMALLINT``/``SHORT``),
``DOUBLE``, ``FLOAT``/``REAL``, ``DECIMAL(p,s)`` (``DEC``, ``NUMERIC``), ``STRING``,
``BOOLEAN``, ``DATE``, ``TIMESTAMP``/``TIMESTAMP_LTZ`` (an instant: text with its offset)
and ``TIMESTAMP_NTZ`` (a wall-clock time: text without one): how a JSON value becomes a
DECIMAL, a DATE or a timestamp is :mod:`modeswitch.control.field_types`. The nested types
(:data:`NESTED_TYPES`: ``STRUCT<name: TYPE, ...>``, ``ARRAY<TYPE>``, ``MAP<STRING, TYPE>``, of
those types, at any depth) are read by ``from_json`` alone, as Spark reads them
(:mod:`modeswitch.transforms.payload`), the times inside them by the top level's text rules
(:func:`modeswitch.transforms.spark_json.from_text`); ``NOT NULL`` and ``COMMENT`` go with
top-level fields. Binary and ``VARCHAR``/``CHAR`` are refused: read such a field as
``STRING`` and convert it in a transform of your own. So is ``TINYINT``/``BYTE``:
``from_json`` reads 128 to 255 into one as negative numbers (Jackson's byte), where the Arrow
parse quarantines them; use ``SMALLINT``.

``NOT NULL`` means what it means in Spark: the field must be there, non-null and of its type,
or the record goes to quarantine (``field F is missing or not <type>``); a field without it is
null when the record lacks it, holds null or holds a value of another type. A value that is not
a JSON object is quarantined whatever the schema.

**The event time from the payload** (``event_time_field``, :func:`find_event_time_field`):
empty (the default), the sink's ``event_time`` is the log's record timestamp (Kafka's record
timestamp, the embedded log's ``event_time``). Set, it names a field of ``value_schema`` (any
case) of type ``TIMESTAMP``, or ``BIGINT`` read as epoch milliseconds (a BIGINT event-time
field takes the integers of the years 0001 to 9999; another is a
value not of its type, ``field F is missing or not a time in epoch milliseconds``). Then every
row's ``event_time``, in the sink and in the quarantine, is that field's time when the record
is a JSON object whose field holds a time, and the log's timestamp otherwise: a ``NOT NULL``
event-time field quarantines a record without one (its ``event_time`` stays the log's); a
nullable one lets the record through with the log's timestamp (the watermark never sees a null
event time). A row's event time so depends on its value and on ``event_time_field`` (and that
field's type) only, not on the rest of the schema: what backfills rely on
(:mod:`modeswitch.modes.backfill`). The field's own column is kept, beside ``event_time``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from modeswitch.control.field_types import MAX_DECIMAL_PRECISION, decimal_type
from modeswitch.control.locations import record_columns
from modeswitch.control.payload_settings import (
    PayloadSettings,
    SchemaSource,
    describe_format,
    describe_key,
)
from modeswitch.errors import ConfigError

DDL_TYPES: dict[str, str] = {
    "bigint": "long",
    "long": "long",
    "int": "integer",
    "integer": "integer",
    "smallint": "short",
    "short": "short",
    "double": "double",
    "float": "float",
    "real": "float",
    "string": "string",
    "boolean": "boolean",
    "timestamp": "timestamp",
    "timestamp_ltz": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
    "date": "date",
    "decimal": "decimal(10,0)",
    "dec": "decimal(10,0)",
    "numeric": "decimal(10,0)",
}
"""The DDL type names ``value_schema`` takes (any case), and the Spark type each stands for
(its ``DataType.typeName()``); a decimal's may give its precision and scale,
``DECIMAL(p[,s])``."""

NESTED_TYPES = {
    "struct": "STRUCT<name: TYPE, ...>",
    "array": "ARRAY<TYPE>",
    "map": "MAP<STRING, TYPE>",
}
"""The nested types ``value_schema`` takes (any case), as written: a nested type's Spark type
name is ``struct<name:type,...>`` (a name that is not an identifier backquoted),
``array<type>`` or ``map<string,type>`` of the same names."""

RESERVED_NAMES = ("bucket", "offset", "event_time", "key", "value", "_quarantine_reason")
"""Columns every transform's output has already (the source's and the quarantine reason): a
payload field may not take one of these names, in any case."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPACE = re.compile(r"\s*")
_DECIMAL_SIZE = re.compile(r"\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)")


@dataclass(frozen=True)
class PayloadField:
    """One field of ``value_schema``: its name, its Spark type name (``long``, ``string``...)
    and whether a record must have it (``NOT NULL``)."""

    name: str
    type: str
    required: bool


def parse_value_schema(text: str, *, setting: str = "value_schema") -> tuple[PayloadField, ...]:
    """The fields of a ``value_schema`` string (module docstring), in order; empty for an
    empty string. Raises :class:`ConfigError` naming ``setting``, the value and what is wrong:
    a syntax error (with the position), an unsupported type, a duplicate name (Spark matches
    names case-insensitively) or a name a transform's output already has."""
    if not isinstance(text, str):
        raise ConfigError(f"{setting}: {text!r} is not text (a Spark DDL schema)", setting=setting)
    fields: list[PayloadField] = []
    reader = _Reader(text, setting)
    reader.space()
    if reader.at_end():
        return ()
    while True:
        fields.append(reader.field())
        reader.space()
        if reader.at_end():
            break
        reader.expect(",")
        reader.space()
    seen: dict[str, str] = {}
    for f in fields:
        folded = f.name.lower()
        if folded in RESERVED_NAMES:
            raise ConfigError(
                f"{setting}: {text!r}: field {f.name!r} clashes with a column every record has "
                f"already ({', '.join(RESERVED_NAMES)}); name it otherwise",
                setting=setting,
            )
        if folded in seen:
            raise ConfigError(
                f"{setting}: {text!r}: field {f.name!r} is there twice (as {seen[folded]!r}; "
                "Spark matches names case-insensitively)",
                setting=setting,
            )
        seen[folded] = f.name
    return tuple(fields)


EVENT_TIME_TYPES: dict[str, str] = {
    "timestamp": "a timestamp",
    "long": "a time in epoch milliseconds",
}
"""The types an ``event_time_field`` may have (Spark type names), and how a quarantine reason
names each (``field F is missing or not <word>``)."""


def find_event_time_field(
    fields: Sequence[PayloadField], name: str, *, setting: str = "event_time_field"
) -> PayloadField | None:
    """The field of ``value_schema`` (its ``fields``) that ``event_time_field = name`` names
    (Spark's case-insensitive match), None when ``name`` is empty. Raises
    :class:`ConfigError` naming ``setting`` and the value when there is no schema, no such
    field, or a field of a type that is not a time (:data:`EVENT_TIME_TYPES`)."""
    if not isinstance(name, str):
        raise ConfigError(f"{setting}: {name!r} is not text (a field name)", setting=setting)
    name = name.strip()
    if not name:
        return None
    if not fields:
        raise ConfigError(
            f"{setting}: {name!r} names a payload field, but value_schema is empty; state the "
            "payload in value_schema (with that field), or leave event_time_field empty to "
            "take the log's record timestamp",
            setting=setting,
        )
    found = [f for f in fields if f.name.lower() == name.lower()]
    if not found:
        raise ConfigError(
            f"{setting}: {name!r} is not a field of value_schema (its fields: "
            f"{', '.join(f.name for f in fields)})",
            setting=setting,
        )
    field = found[0]
    if field.type not in EVENT_TIME_TYPES:
        raise ConfigError(
            f"{setting}: {name!r} is a field of type {ddl_name(field.type)} in value_schema; "
            "an event time is an instant: a TIMESTAMP field (RFC 3339 text with its offset) "
            "or a BIGINT field (epoch milliseconds)",
            setting=setting,
        )
    return field


_DDL_NAMES = {
    "long": "BIGINT",
    "integer": "INT",
    "short": "SMALLINT",
    "double": "DOUBLE",
    "float": "FLOAT",
    "string": "STRING",
    "boolean": "BOOLEAN",
    "timestamp": "TIMESTAMP",
    "timestamp_ntz": "TIMESTAMP_NTZ",
    "date": "DATE",
}


def _quoted(name: str) -> str:
    """A struct field's name in a nested type's name: backquoted unless an identifier."""
    if _IDENTIFIER.fullmatch(name):
        return name
    return "`" + name.replace("`", "``") + "`"


def is_nested(type_name: str) -> bool:
    """Whether a field's Spark type name is a nested type's (:data:`NESTED_TYPES`)."""
    return type_name.startswith(("struct<", "array<", "map<"))


def ddl_name(type_name: str) -> str:
    """How ``value_schema`` writes a Spark type name (``decimal(7,2)`` -> ``DECIMAL(7,2)``)."""
    return _DDL_NAMES.get(type_name, type_name.upper())


class _Reader:
    """A cursor over the DDL text, with errors that name the setting, value and position."""

    def __init__(self, text: str, setting: str) -> None:
        self.text = text
        self.at = 0
        self.setting = setting

    def fail(self, what: str) -> ConfigError:
        return ConfigError(
            f"{self.setting}: {self.text!r}: {what} (at character {self.at + 1})",
            setting=self.setting,
        )

    def space(self) -> None:
        match = _SPACE.match(self.text, self.at)
        assert match is not None
        self.at = match.end()

    def at_end(self) -> bool:
        return self.at >= len(self.text)

    def expect(self, token: str) -> None:
        if not self.text.startswith(token, self.at):
            found = self.text[self.at : self.at + 12] or "the end"
            raise self.fail(f"expected {token!r}, found {found!r}")
        self.at += len(token)

    def word(self) -> str | None:
        match = _WORD.match(self.text, self.at)
        if match is None:
            return None
        self.at = match.end()
        return match.group()

    def peek_word(self) -> str | None:
        match = _WORD.match(self.text, self.at)
        return None if match is None else match.group()

    def name(self) -> str:
        if self.text.startswith("`", self.at):
            self.at += 1
            out = []
            while True:
                end = self.text.find("`", self.at)
                if end < 0:
                    raise self.fail("a backquoted name is not closed")
                out.append(self.text[self.at : end])
                self.at = end + 1
                if self.text.startswith("`", self.at):  # a doubled backquote: one in the name
                    out.append("`")
                    self.at += 1
                    continue
                break
            name = "".join(out)
            if not name:
                raise self.fail("a field name is empty")
            return name
        match = _IDENTIFIER.match(self.text, self.at)
        if match is None:
            found = self.text[self.at : self.at + 12] or "the end"
            raise self.fail(f"expected a field name, found {found!r} (backquote other names)")
        self.at = match.end()
        return match.group()

    def field(self) -> PayloadField:
        name = self.name()
        self.space()
        spark_type = self.data_type(name)
        required = False
        self.space()
        if (self.peek_word() or "").lower() == "not":
            self.word()
            self.space()
            if (self.word() or "").lower() != "null":
                raise self.fail(f"field {name!r}: expected NULL after NOT")
            required = True
            self.space()
        if (self.peek_word() or "").lower() == "comment":
            self.word()
            self.space()
            self.comment()
            self.space()
        if not self.at_end() and not self.text.startswith(",", self.at):
            found = self.text[self.at : self.at + 12]
            raise self.fail(f"field {name!r}: unexpected {found!r} after its type")
        return PayloadField(name, spark_type, required)

    def data_type(self, name: str) -> str:
        """The type of field ``name`` (a path inside a nested type: ``ship.city``), from here:
        its Spark type name (:data:`DDL_TYPES`), or a nested type's (:data:`NESTED_TYPES`)."""
        start = self.at
        kind = self.word()
        if kind is None:
            found = self.text[self.at : self.at + 12] or "the end"
            raise self.fail(f"field {name!r} has no type (found {found!r})")
        self.space()
        if kind.lower() in NESTED_TYPES and self.text.startswith("<", self.at):
            self.at += 1
            return getattr(self, f"{kind.lower()}_type")(name)
        self.at = start + len(kind)
        spark_type = DDL_TYPES.get(kind.lower())
        if decimal_type(spark_type or "") is not None:
            spark_type = self.decimal_size(name)
        if spark_type is None or self.text.startswith(("(", "<"), self.at):
            self.at = start
            shown = self.type_text()
            if kind.lower() in ("tinyint", "byte") and shown.lower() == kind.lower():
                raise self.fail(
                    f"field {name!r} has type {shown!r}: Spark's from_json reads 128 to 255 into "
                    "it as negative numbers, which the Arrow parse would not; use SMALLINT"
                )
            raise self.fail(
                f"field {name!r} has type {shown!r}, which value_schema does not take; it takes "
                f"{', '.join(t.upper() for t in DDL_TYPES)} and "
                f"{', '.join(NESTED_TYPES.values())} (read another as STRING and convert it in "
                "a transform of your own)"
            )
        return spark_type

    def array_type(self, name: str) -> str:
        self.space()
        element = self.data_type(f"{name}[]")
        self.close(name)
        return f"array<{element}>"

    def map_type(self, name: str) -> str:
        self.space()
        key = self.data_type(f"{name}{{key}}")
        if key != "string":
            raise self.fail(f"field {name!r}: a MAP's keys are STRING (JSON object names)")
        self.space()
        self.expect(",")
        self.space()
        value = self.data_type(f"{name}{{}}")
        self.close(name)
        return f"map<string,{value}>"

    def struct_type(self, name: str) -> str:
        fields: dict[str, str] = {}
        seen: dict[str, str] = {}
        while True:
            self.space()
            inner = self.name()
            self.space()
            if self.text.startswith(":", self.at):
                self.at += 1
                self.space()
            path = f"{name}.{inner}"
            fields[inner] = self.data_type(path)
            if inner.lower() in seen:
                raise self.fail(
                    f"field {path!r} is there twice (as {seen[inner.lower()]!r}; Spark matches "
                    "names case-insensitively)"
                )
            seen[inner.lower()] = inner
            self.space()
            if (self.peek_word() or "").lower() in ("not", "comment"):
                raise self.fail(
                    f"field {path!r}: NOT NULL and COMMENT go with top-level fields only"
                )
            if self.text.startswith(",", self.at):
                self.at += 1
                continue
            self.close(name)
            return "struct<" + ",".join(f"{_quoted(n)}:{t}" for n, t in fields.items()) + ">"

    def close(self, name: str) -> None:
        self.space()
        if not self.text.startswith(">", self.at):
            found = self.text[self.at : self.at + 12] or "the end"
            raise self.fail(f"field {name!r}: expected '>' or ',' in its type, found {found!r}")
        self.at += 1

    def decimal_size(self, name: str) -> str:
        """A decimal's Spark type name from its optional ``(precision[, scale])``, after the
        type's word (Spark's defaults: 10 and 0)."""
        self.space()
        if not self.text.startswith("(", self.at):
            return "decimal(10,0)"
        size = _DECIMAL_SIZE.match(self.text, self.at)
        if size is None:
            raise self.fail(f"field {name!r}: a decimal's size is (precision[, scale])")
        precision, scale = int(size.group(1)), int(size.group(2) or 0)
        if not 1 <= precision <= MAX_DECIMAL_PRECISION or scale > precision:
            raise self.fail(
                f"field {name!r}: DECIMAL({precision},{scale}) is not a decimal Spark and Delta "
                f"hold (precision 1 to {MAX_DECIMAL_PRECISION}, scale 0 to the precision)"
            )
        self.at = size.end()
        return f"decimal({precision},{scale})"

    def type_text(self) -> str:
        """The type written from here to the next top-level comma (for a message)."""
        depth, end = 0, self.at
        while end < len(self.text) and (depth or self.text[end] not in ",>"):
            depth += {"(": 1, "<": 1, ")": -1, ">": -1}.get(self.text[end], 0)
            end += 1
        return self.text[self.at : end].strip()

    def comment(self) -> None:
        quote = self.text[self.at : self.at + 1]
        if quote not in ("'", '"'):
            raise self.fail("COMMENT takes a quoted string")
        self.at += 1
        while self.at < len(self.text):
            char = self.text[self.at]
            self.at += 2 if char == "\\" else 1
            if char == quote:
                return
        raise self.fail("a COMMENT string is not closed")


def check_beside_record(names: Sequence[str], columns: Sequence[str], *, what: str) -> None:
    """Refuses, naming ``what`` and the field, a payload column named (case aside) as one of
    ``columns``: those the source's records have beyond every log's
    (:func:`~modeswitch.control.locations.record_columns`: ``headers`` where a topic is read
    with them), which would be there twice."""
    for name in names:
        if name.lower() in columns:
            raise ConfigError(
                f"{what}: field {name!r} clashes with the column {name.lower()!r} the source "
                "adds to every record (kafka://<topic>?headers=true); name the field "
                "otherwise, or read the source without it",
                setting="source",
            )


SCHEMA_TRANSFORM = "value_schema"
"""The ``transform`` setting that stands for the transform built from ``value_schema`` (its
default): the payload parsed into ``value_schema``'s columns, or, with no ``value_schema``, the
records as they are."""


@dataclass(frozen=True)
class Payload:
    """What a pipeline's records hold and what parses them, from its ``transform``,
    ``value_schema``, ``event_time_field`` and ``payload`` group settings: read once
    (:func:`describe_payload`), then handed to whatever builds or runs the transform, which never
    parses the text again."""

    transform: str
    """The ``transform`` setting: :data:`SCHEMA_TRANSFORM`, or ``module:function``."""
    fields: tuple[PayloadField, ...] = ()
    """``value_schema``'s fields, in order (only with :data:`SCHEMA_TRANSFORM`)."""
    event_time: PayloadField | None = None
    """The field ``event_time_field`` names, or None: the log's timestamp is the event time."""
    format: str = "json"
    """The values' format with :data:`SCHEMA_TRANSFORM`: ``json``, ``avro``, ``protobuf`` or
    ``raw`` (:mod:`modeswitch.control.payload_settings`)."""
    schemas: SchemaSource | None = None
    """Where a binary (``avro``, ``protobuf``) payload's schemas come from."""
    keys: SchemaSource | None = None
    """Where a binary key's schemas come from (``key_format``); None: the key is text only."""

    @property
    def schema_sources(self) -> dict[str, SchemaSource]:
        """The record columns decoded with a schema (``value``, ``key``), with where it comes
        from."""
        found = {"value": self.schemas, "key": self.keys}
        return {column: source for column, source in found.items() if source is not None}

    @property
    def from_schema(self) -> bool:
        """Whether the transform is the one built from the payload settings."""
        return self.transform == SCHEMA_TRANSFORM


def describe_payload(
    transform: str = SCHEMA_TRANSFORM,
    value_schema: str = "",
    event_time_field: str = "",
    *,
    formats: PayloadSettings | None = None,
    source: str = "",
) -> Payload:
    """The :class:`Payload` of the payload settings (``formats``: the ``payload`` group, its
    defaults when None; ``source`` the ``source`` setting, whose topic names a registry's
    subject), with the rules between them, written here only: ``value_schema``,
    ``event_time_field`` and a ``value_format`` other than ``auto`` go with
    :data:`SCHEMA_TRANSFORM` alone (a transform of one's own parses the records itself and keeps
    the log's event time), ``event_time_field`` names a time field of ``value_schema``
    (:func:`find_event_time_field`), and the format with its schema
    (:func:`~modeswitch.control.payload_settings.describe_format`). Raises :class:`ConfigError`
    naming the setting and its value."""
    formats = formats or PayloadSettings()
    spec = transform.strip() if isinstance(transform, str) else transform
    if spec != SCHEMA_TRANSFORM:
        for setting, value, itself, instead in (
            ("value_schema", value_schema, "", "to parse them into value_schema's columns"),
            (
                "event_time_field",
                event_time_field,
                " and keeps the log's event time",
                "with value_schema",
            ),
            ("value_format", formats.value_format.replace("auto", ""), "", "to read that format"),
            ("key_format", formats.key_format.replace("text", ""), "", "to decode the keys"),
        ):
            if isinstance(value, str) and value.strip():
                raise ConfigError(
                    f"{setting}: {value!r} is set, but transform = {transform!r} parses the "
                    f"records itself{itself}; set transform to {SCHEMA_TRANSFORM!r} (the "
                    f"default) {instead}, or leave {setting} empty",
                    setting=setting,
                )
        return Payload(spec)
    fmt, schemas = describe_format(formats, value_schema=value_schema, source=source)
    if schemas is not None and isinstance(event_time_field, str) and event_time_field.strip():
        raise ConfigError(
            f"event_time_field: {event_time_field!r} is set, and value_format is {fmt!r}: a "
            "binary payload's event time is the log's record timestamp (a field of its "
            "schema as the event time is not read yet); leave event_time_field empty",
            setting="event_time_field",
        )
    fields = parse_value_schema(value_schema)
    check_beside_record(
        [f.name for f in fields], record_columns(source), what=f"value_schema: {value_schema!r}"
    )
    return Payload(
        spec,
        fields,
        find_event_time_field(fields, event_time_field),
        format=fmt,
        schemas=schemas,
        keys=describe_key(formats, source=source),
    )


__all__ = [
    "DDL_TYPES",
    "EVENT_TIME_TYPES",
    "RESERVED_NAMES",
    "SCHEMA_TRANSFORM",
    "Payload",
    "PayloadField",
    "check_beside_record",
    "ddl_name",
    "describe_payload",
    "find_event_time_field",
    "is_nested",
    "parse_value_schema",
]
