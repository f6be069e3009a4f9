"""The ``value_schema`` setting: a record's JSON payload as a Spark DDL schema, read without Spark.

``value_schema = "id BIGINT NOT NULL, user STRING, amount DOUBLE"`` says what each record's
``value`` holds; the pipeline's default transform (``transform = "value_schema"``,
:mod:`modeswitch.transforms.payload`) parses it into those columns, in both of its forms
(Spark's ``from_json`` and the Arrow parse). :func:`parse_value_schema` reads the string on the
driver when the settings are built, with no JVM, and refuses, naming the setting and the
value, what either form could not parse the same way.

The grammar is the flat part of Spark's DDL: ``name TYPE [NOT NULL] [COMMENT 'text']``, fields
separated by commas; a name is an identifier (letters, digits, ``_``, not starting with a
digit) or any text between backquotes (`` `user-id` ``, a backquote doubled inside); keywords
in any case. The types (:data:`DDL_TYPES`) are those the Arrow parse reads exactly as
``from_json`` does: integers (``BIGINT``/``LONG``, ``INT``/``INTEGER``, ``SMALLINT``/``SHORT``),
``DOUBLE``, ``FLOAT``/``REAL``, ``STRING`` and ``BOOLEAN``. Timestamps, dates, decimals, binary,
``VARCHAR``/``CHAR`` and nested types are refused: read such a field as ``STRING`` and convert it
in a transform of your own. So is ``TINYINT``/``BYTE``: ``from_json`` reads 128 to 255 into one
as negative numbers (Jackson's byte), where the Arrow parse quarantines them; use ``SMALLINT``.

``NOT NULL`` means what it means in Spark: the field must be there, non-null and of its type,
or the record goes to quarantine (``field F is missing or not <type>``); a field without it is
null when the record lacks it, holds null or holds a value of another type. A value that is not
a JSON object is quarantined whatever the schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
}
"""The DDL type names ``value_schema`` takes (any case), and the Spark type each stands for
(its ``DataType.typeName()``)."""

RESERVED_NAMES = ("bucket", "offset", "event_time", "key", "value", "_quarantine_reason")
"""Columns every transform's output has already (the source's and the quarantine reason): a
payload field may not take one of these names, in any case."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPACE = re.compile(r"\s*")


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
        start = self.at
        kind = self.word()
        if kind is None:
            found = self.text[self.at : self.at + 12] or "the end"
            raise self.fail(f"field {name!r} has no type (found {found!r})")
        spark_type = DDL_TYPES.get(kind.lower())
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
                f"{', '.join(t.upper() for t in DDL_TYPES)} (read a timestamp, date or decimal "
                "as STRING and convert it in a transform of your own)"
            )
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

    def type_text(self) -> str:
        """The type written from here to the next top-level comma (for a message)."""
        depth, end = 0, self.at
        while end < len(self.text) and (depth or self.text[end] != ","):
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


__all__ = [
    "DDL_TYPES",
    "RESERVED_NAMES",
    "PayloadField",
    "parse_value_schema",
]
