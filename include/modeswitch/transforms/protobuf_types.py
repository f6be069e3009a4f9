"""A Protobuf message's fields as the sink's columns, and each decoded message as a row of them.

| Protobuf | column |
|---|---|
| `bool`, `float`, `double`, `string`, `bytes` | `boolean`, `float`, `double`, `string`, `binary` |
| `int32`, `sint32`, `sfixed32` | `int` |
| `int64`, `sint64`, `sfixed64`, `uint32`, `fixed32` | `bigint` (an unsigned 32-bit value fits) |
| `uint64`, `fixed64` | `decimal(20, 0)` (every unsigned 64-bit value fits) |
| an enum | `string`, its symbol |
| a message | `struct` of its fields |
| `repeated`, `map<K, V>` | `array`, `map` |
| `google.protobuf.Timestamp` | `timestamp` (an instant; nanoseconds cut to microseconds) |
| `google.protobuf.*Value` (the wrappers) | the wrapped type |
| any other well-known message (`Duration`, `Any`, ...) | a `struct` of its fields, as any message |

What a value without a field holds, as Protobuf means it: a field with presence (proto3
``optional``, a member of a ``oneof``, a message, a wrapper, any proto2 ``optional``) is null
where absent; one without (a proto3 scalar) is its zero (``0``, ``""``, ``false``, the enum's first
symbol), as every Protobuf reader sees it. A repeated field or a map is empty where absent.

Spark's own ``from_protobuf`` (not among the jars served here) reads the same types with its
options ``emit.default.values``, ``enums.as.ints=false``, ``upcast.unsigned.ints`` and
``unwrap.primitive.wrapper.types`` set.

Refused, naming the field: a message that holds itself (``google.protobuf.Struct`` and
``Value`` are such: a recursive type has no column type), a proto2 group. Every column is
nullable: a quarantined row's are null.

A value does not decode (:class:`NotReadable`) when a field number the message knows arrives
with another wire type (its writer's type and the reader's differ: Protobuf keeps it as an
unknown field), or an enum's number has no symbol in the reader's enum.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from google.protobuf.unknown_fields import UnknownFieldSet

from modeswitch.errors import ConfigError


class NotReadable(ValueError):
    """A decoded message that cannot be read as its columns (module docstring)."""


_SCALARS: dict[str, pa.DataType] = {
    "TYPE_BOOL": pa.bool_(),
    "TYPE_FLOAT": pa.float32(),
    "TYPE_DOUBLE": pa.float64(),
    "TYPE_STRING": pa.string(),
    "TYPE_BYTES": pa.binary(),
    "TYPE_INT32": pa.int32(),
    "TYPE_SINT32": pa.int32(),
    "TYPE_SFIXED32": pa.int32(),
    "TYPE_INT64": pa.int64(),
    "TYPE_SINT64": pa.int64(),
    "TYPE_SFIXED64": pa.int64(),
    "TYPE_UINT32": pa.int64(),
    "TYPE_FIXED32": pa.int64(),
    "TYPE_UINT64": pa.decimal128(20, 0),
    "TYPE_FIXED64": pa.decimal128(20, 0),
    "TYPE_ENUM": pa.string(),
}
TIMESTAMP = "google.protobuf.Timestamp"
WRAPPERS = frozenset(
    f"google.protobuf.{name}Value"
    for name in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")
)


def _type_name(field: Any) -> str:
    return _type_names()[field.type]


@functools.cache
def _type_names() -> dict[int, str]:
    from google.protobuf.descriptor import FieldDescriptor

    return {
        getattr(FieldDescriptor, name): name
        for name in dir(FieldDescriptor)
        if name.startswith("TYPE_")
    }


def _is_map(field: Any) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def message_columns(message: Any, *, what: str) -> list[pa.Field]:
    """The columns of ``message``'s fields (a ``Descriptor``), in its order; refuses, naming
    ``what`` and the field, a type that has no column (module docstring)."""
    return [pa.field(f.name, _field_type(f, what, (message.full_name,))) for f in message.fields]


def _field_type(field: Any, what: str, path: tuple[str, ...]) -> pa.DataType:
    if _is_map(field):
        key, value = field.message_type.fields
        return pa.map_(_single_type(key, what, path), _single_type(value, what, path))
    single = _single_type(field, what, path)
    return pa.list_(single) if field.is_repeated else single


def _single_type(field: Any, what: str, path: tuple[str, ...]) -> pa.DataType:
    kind = _type_name(field)
    if kind == "TYPE_GROUP":
        raise ConfigError(f"{what}: field {field.full_name!r} is a proto2 group, which is not read")
    if kind != "TYPE_MESSAGE":
        return _SCALARS[kind]
    name = field.message_type.full_name
    if name == TIMESTAMP:
        return pa.timestamp("us", tz="UTC")
    if name in WRAPPERS:
        return _SCALARS[_type_name(field.message_type.fields_by_name["value"])]
    if name in path:
        raise ConfigError(
            f"{what}: field {field.full_name!r} holds message {name!r}, which holds itself: "
            "a recursive message has no column type (read it in a transform of your own)"
        )
    inner = field.message_type
    return pa.struct([pa.field(f.name, _field_type(f, what, (*path, name))) for f in inner.fields])


def row_reader(message: Any) -> Callable[[Any], tuple]:
    """The function that turns a decoded message of ``message`` (a ``Descriptor``) into its
    row of :func:`message_columns`, a tuple in their order (Arrow builds a struct from tuples
    ten times as fast as from dicts); it raises :class:`NotReadable` for a value that does not
    decode as the message (module docstring)."""
    numbers = frozenset(f.number for f in message.fields)
    getters = [_value_reader(f) for f in message.fields]
    if all(_is_plain(f) for f in message.fields):
        every = operator.attrgetter(*(f.name for f in message.fields))
        single = len(message.fields) == 1

        def plain(decoded: Any) -> tuple:
            _check_wire_types(decoded, numbers)
            return (every(decoded),) if single else every(decoded)

        return plain

    def read(decoded: Any) -> tuple:
        _check_wire_types(decoded, numbers)
        return tuple([get(decoded) for get in getters])

    return read


def _is_plain(field: Any) -> bool:
    """Whether a field's value is its attribute as it is (a scalar without presence)."""
    kind = _type_name(field)
    return not (field.is_repeated or field.has_presence or kind in ("TYPE_ENUM", "TYPE_MESSAGE"))


def _check_wire_types(decoded: Any, numbers: frozenset[int]) -> None:
    unknown = UnknownFieldSet(decoded)
    if len(unknown) and any(field.field_number in numbers for field in unknown):
        raise NotReadable("a field arrived with another wire type than the message's")


def _value_reader(field: Any) -> Callable[[Any], Any]:
    name = field.name
    if _is_plain(field):
        return operator.attrgetter(name)
    single = _single_reader(field)
    if _is_map(field):
        _, value = field.message_type.fields
        read_value = _single_reader(value)
        return lambda m: [(k, read_value(v)) for k, v in getattr(m, name).items()]
    if field.is_repeated:
        return lambda m: [single(v) for v in getattr(m, name)]
    if field.has_presence:
        return lambda m: single(getattr(m, name)) if m.HasField(name) else None
    return lambda m: single(getattr(m, name))


def _single_reader(field: Any) -> Callable[[Any], Any]:
    kind = _type_name(field)
    if kind == "TYPE_ENUM":
        symbols = {v.number: v.name for v in field.enum_type.values}

        def symbol(number: int) -> str:
            if number not in symbols:
                raise NotReadable(f"enum {field.enum_type.full_name} has no symbol {number}")
            return symbols[number]

        return symbol
    if kind != "TYPE_MESSAGE":
        return _same
    name = field.message_type.full_name
    if name == TIMESTAMP:
        return lambda t: t.seconds * 1_000_000 + t.nanos // 1000
    if name in WRAPPERS:
        return lambda w: w.value
    return row_reader(field.message_type)


def _same(value: Any) -> Any:
    return value


__all__ = ["TIMESTAMP", "WRAPPERS", "NotReadable", "message_columns", "row_reader"]
