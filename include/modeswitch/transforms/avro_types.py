"""An Avro schema's types as the sink's columns: the Arrow (and so Spark and Delta) type of each
Avro type, as Spark's own Avro reader (``from_avro``) maps them.

| Avro | column |
|---|---|
| `boolean`, `int`, `long`, `float`, `double` | `boolean`, `int`, `bigint`, `float`, `double` |
| `string`, `enum` (its symbol), `string` with `uuid` | `string` |
| `bytes`, `fixed` | `binary` |
| `bytes` or `fixed` with `decimal(p, s)` | `decimal(p, s)` |
| `int` with `date` | `date` |
| `int` with `time-millis` | `int` (milliseconds of the day) |
| `long` with `time-micros` | `bigint` (microseconds of the day) |
| `long` with `timestamp-millis`/`-micros` | `timestamp` (an instant, UTC) |
| `long` with `local-timestamp-millis`/`-micros` | `timestamp_ntz` (a wall-clock time) |
| `record` | `struct` of its fields |
| `array`, `map` | `array`, `map<string, ...>` |
| a union of `null` and one type | that type (null where the value is null) |

Refused, naming the field: a union of two or more types besides ``null`` (Spark makes it a
struct of ``member0``, ``member1``...; read it in a transform of your own), and a record that
holds itself (a recursive type has no column type). Every column is nullable: a quarantined
row's are null.

:func:`decoding_schema` is the schema the decoder reads with: the same, but for the logical
types whose Python values would need a conversion back (``uuid``, ``time-millis``,
``time-micros``), read as their plain type (the same column).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pyarrow as pa

from modeswitch.errors import ConfigError

_PRIMITIVES = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "bytes": pa.binary(),
}
_LOGICAL = {
    "date": pa.date32(),
    "timestamp-millis": pa.timestamp("us", tz="UTC"),
    "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "local-timestamp-millis": pa.timestamp("us"),
    "local-timestamp-micros": pa.timestamp("us"),
}
_PLAIN_LOGICAL = ("uuid", "time-millis", "time-micros")
"""Logical types read as their plain type (:func:`decoding_schema`)."""
_LOGICAL_BASE = {
    "date": ("int",),
    "timestamp-millis": ("long",),
    "timestamp-micros": ("long",),
    "local-timestamp-millis": ("long",),
    "local-timestamp-micros": ("long",),
    "decimal": ("bytes", "fixed"),
}


def columns_of(schema: Any, *, what: str) -> list[pa.Field]:
    """The columns of a parsed Avro record schema (``fastavro.parse_schema``'s): one per
    top-level field, in order. Raises :class:`ConfigError` naming ``what`` (the schema's
    source) and the field when the schema is not a record or a field's type has no column."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigError(
            f"{what}: the schema is not an Avro record (it is {_short(schema)}); a value's "
            "columns are a record's fields"
        )
    named = schema.get("__named_schemas", {})
    return [
        pa.field(f["name"], _arrow_type(f["type"], named, (schema["name"],), f["name"], what))
        for f in schema["fields"]
    ]


def _arrow_type(
    node: Any, named: dict, within: tuple[str, ...], path: str, what: str
) -> pa.DataType:
    if isinstance(node, str):
        if node in _PRIMITIVES:
            return _PRIMITIVES[node]
        if node == "null":
            return pa.null()
        if node in within:
            raise _recursive(what, path, node)
        return _arrow_type(named[node], named, within, path, what)
    if isinstance(node, list):
        members = [m for m in node if m != "null"]
        if len(members) != 1:
            raise ConfigError(
                f"{what}: field {path!r} is a union of {', '.join(_short(m) for m in members)}; "
                "a column takes one type (besides null): read such a field in a transform of "
                "your own"
            )
        return _arrow_type(members[0], named, within, path, what)
    kind, logical = node.get("type"), node.get("logicalType")
    if logical == "decimal" and kind in _LOGICAL_BASE["decimal"]:
        precision, scale = int(node["precision"]), int(node.get("scale", 0))
        if precision > 38:
            raise ConfigError(
                f"{what}: field {path!r} is a decimal of precision {precision}; Spark's and "
                "Delta's decimals hold 38 digits at most"
            )
        return pa.decimal128(precision, scale)
    if logical in _LOGICAL and kind in _LOGICAL_BASE[logical]:
        return _LOGICAL[logical]
    if kind == "record":
        name = node["name"]
        if name in within:
            raise _recursive(what, path, name)
        return pa.struct(
            [
                pa.field(
                    f["name"],
                    _arrow_type(f["type"], named, (*within, name), f"{path}.{f['name']}", what),
                )
                for f in node["fields"]
            ]
        )
    if kind == "enum":
        return pa.string()
    if kind == "fixed":
        return pa.binary()
    if kind == "array":
        return pa.list_(_arrow_type(node["items"], named, within, f"{path}[]", what))
    if kind == "map":
        return pa.map_(pa.string(), _arrow_type(node["values"], named, within, f"{path}{{}}", what))
    return _arrow_type(kind, named, within, path, what)


def _recursive(what: str, path: str, name: str) -> ConfigError:
    return ConfigError(
        f"{what}: field {path!r} holds the record {name!r} it is in (a recursive type has no "
        "column type)"
    )


def decoding_schema(text: str) -> Any:
    """The Avro schema of ``text`` (its JSON) as the decoder reads with it (module docstring),
    parsed by fastavro."""
    import fastavro

    return fastavro.parse_schema(_plain_logical(json.loads(text)))


def plain_schema_text(text: str) -> str:
    """:func:`decoding_schema`'s schema as JSON text, for Spark's ``from_avro``."""
    return json.dumps(_plain_logical(json.loads(text)))


def _plain_logical(node: Any) -> Any:
    if isinstance(node, list):
        return [_plain_logical(member) for member in node]
    if not isinstance(node, dict):
        return node
    node = copy.copy(node)
    if node.get("logicalType") in _PLAIN_LOGICAL:
        del node["logicalType"]
    for key in ("items", "values"):
        if key in node:
            node[key] = _plain_logical(node[key])
    if node.get("type") == "record":
        node["fields"] = [dict(f, type=_plain_logical(f["type"])) for f in node.get("fields", [])]
    elif isinstance(node.get("type"), (dict, list)):
        node["type"] = _plain_logical(node["type"])
    return node


def _short(node: Any) -> str:
    if isinstance(node, dict):
        return str(node.get("name") or node.get("type"))
    return json.dumps(node) if not isinstance(node, str) else node


__all__ = ["columns_of", "decoding_schema", "plain_schema_text"]
