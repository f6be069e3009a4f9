"""JSON values read and written as Spark's JSON reader (Jackson, on the JVM) does, in Python: the
record-by-record path of the Arrow parse (:mod:`modeswitch.transforms.arrow`) for the values
its typed msgspec decode refuses.

- :data:`STRICT_JSON` / :data:`LENIENT_JSON`: the first JSON value of a text, objects as
  :class:`JsonObject` (duplicate names kept), without and with raw control characters in
  strings; :func:`not_an_object_reason` the reason for a first value that is not an object.
- :func:`field_converter`: one field's value of a Spark simple type from a parsed JSON value,
  as Spark converts it (integers within their type's range, :func:`integer_range`; a decimal
  by :func:`~modeswitch.control.field_types.decimal_value`, also from the typed decode's raw
  JSON, :func:`raw_decimal_converter`; a string
  field's text from any JSON value, written as Jackson writes it, numbers as Java's
  ``Double.toString``: :func:`java_double`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import msgspec

from modeswitch.control.field_types import decimal_type, decimal_value

_INTEGER_BITS = {"long": 64, "integer": 32, "short": 16, "byte": 8}


class JsonObject(list):
    """A JSON object as its (name, value) pairs, in order, duplicates kept."""


class _Float(str):
    """A JSON number with a fraction or an exponent, as written."""


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


STRICT_JSON = json.JSONDecoder(
    parse_constant=_refuse_constant, parse_float=_Float, object_pairs_hook=JsonObject
)
"""Strict JSON (RFC 8259), objects as :class:`JsonObject`, numbers with a fraction or an
exponent kept as written (for :func:`field_converter`)."""
LENIENT_JSON = json.JSONDecoder(
    parse_constant=_refuse_constant, parse_float=_Float, object_pairs_hook=JsonObject, strict=False
)
""":data:`STRICT_JSON` that also takes raw control characters in strings, as Spark's
get_json_object does and its from_json does not: from_json then gives a row of nulls, so the
reason is the first required field's."""


def integer_range(spark_type: str) -> tuple[int, int] | None:
    """The lowest and highest value of an integer type, None for another type."""
    bits = _INTEGER_BITS.get(spark_type)
    return None if bits is None else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


MISTYPED: Any = object()
"""What :func:`field_converter` gives for a value of the wrong JSON type."""


def field_converter(spark_type: str) -> Callable[[Any], Any]:
    """Converts one field's parsed JSON value as Spark's JSON reader does: None for null,
    ``MISTYPED`` for a value of the wrong JSON type (which leaves an earlier value of a
    repeated name in place; a null replaces it)."""
    size = decimal_type(spark_type)
    if size is not None:

        def exact(value: Any) -> Any:
            if value is None:
                return None
            converted = decimal_value(value, *size)
            return MISTYPED if converted is None else converted

        return exact
    bounds = integer_range(spark_type)
    if bounds is not None:
        low, high = bounds

        def integer(value: Any) -> Any:
            if value is None:
                return None
            plain = isinstance(value, int) and not isinstance(value, bool)
            return value if plain and low <= value <= high else MISTYPED

        return integer
    if spark_type in ("double", "float"):

        def number(value: Any) -> Any:
            if value is None:
                return None
            if isinstance(value, _Float) or (
                isinstance(value, int) and not isinstance(value, bool)
            ):
                try:
                    return float(value)
                except OverflowError:  # an integer beyond a double: Jackson's infinity
                    return math.copysign(math.inf, value)
            return MISTYPED

        return number
    if spark_type == "boolean":
        return lambda value: value if value is None or isinstance(value, bool) else MISTYPED
    # A string field takes any JSON value as its text; a timestamp is read as a string, then
    # converted (parse_values), as the Spark form reads it.
    return lambda value: None if value is None else _as_text(value)


def raw_decimal_converter(spark_type: str) -> Callable[[msgspec.Raw], Any] | None:
    """For a decimal type (None for another): its field's value from the raw JSON the typed
    decode kept (a number's exact digits), as :func:`field_converter` gives it from a parsed
    value: None for null, ``MISTYPED`` for a value that is not of the type."""
    if decimal_type(spark_type) is None:
        return None
    exact = field_converter(spark_type)

    def convert(raw: msgspec.Raw) -> Any:
        text = bytes(raw)
        if text[:1] == b'"':
            try:
                return exact(msgspec.json.decode(text))
            except msgspec.DecodeError:  # a lone surrogate: not a number Java reads either
                return MISTYPED
        if text[:1] in b"-0123456789":
            return exact(text.decode())  # a number's text, as written
        return None if text == b"null" else MISTYPED

    return convert


def _as_text(value: Any) -> str:
    """A string field's value from any JSON value, as Spark writes it: a string's text (a lone
    UTF-16 surrogate becomes ``?``, as in Spark's UTF-8), or the compact JSON text of anything
    else as Jackson writes it (numbers with a fraction or an exponent as Java writes a
    double, ``1e2`` -> ``100.0``; see :func:`_jackson_string`)."""
    if isinstance(value, _Float):
        return java_double(value)
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode()
    return _compact(value)


def _compact(value: Any) -> str:
    if isinstance(value, JsonObject):
        return "{" + ",".join(f"{_jackson_string(k)}:{_compact(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_compact(v) for v in value) + "]"
    if isinstance(value, _Float):
        return java_double(value)
    if isinstance(value, str):
        return _jackson_string(value)
    return json.dumps(value)  # integers, booleans, null


_ESCAPED = re.compile(r'["\\\x00-\x1f\ud800-\udfff\U00010000-\U0010ffff]')
_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _jackson_string(text: str) -> str:
    """A JSON string as Jackson's generator writes it: quotes, backslashes and control
    characters escaped (``\\n`` or ``\\u001F``), characters beyond the Basic Multilingual
    Plane and lone surrogates as ``\\uXXXX`` escapes of their UTF-16 units, the rest as is."""

    def escape(match: re.Match[str]) -> str:
        char = match.group()
        if char in _SHORT_ESCAPES:
            return _SHORT_ESCAPES[char]
        code = ord(char)
        if code > 0xFFFF:
            code -= 0x10000
            return f"\\u{0xD800 + (code >> 10):04X}\\u{0xDC00 + (code & 0x3FF):04X}"
        return f"\\u{code:04X}"

    return '"' + _ESCAPED.sub(escape, text) + '"'


def java_double(text: str) -> str:
    """A JSON number's text as Java's ``Double.toString`` writes the double it parses to
    (shortest digits, as Java 19+ and Python both choose them); a number beyond a double's
    range as Jackson writes an infinite double, a JSON string (``1e400`` -> ``"Infinity"``)."""
    number = float(text)
    if math.isinf(number):
        return '"Infinity"' if number > 0 else '"-Infinity"'
    if number == 0:
        return "-0.0" if math.copysign(1, number) < 0 else "0.0"
    sign = "-" if number < 0 else ""
    digits_tuple, exponent = Decimal(repr(abs(number))).normalize().as_tuple()[1:]
    digits = "".join(map(str, digits_tuple))
    point = len(digits) + int(exponent)  # the decimal point's place after the first digit
    if -2 <= point <= 7:  # 1e-3 <= |x| < 1e7: plain
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        whole, fraction = digits[:point].ljust(point, "0"), digits[point:]
        return f"{sign}{whole}.{fraction or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{point - 1}"


def not_an_object_reason(first: Any) -> str:
    """The reason for a value whose first JSON value is not an object. Spark tells the two
    apart by re-encoding that value as UTF-8 text, which fails for a string holding a lone
    UTF-16 surrogate (``"\\ud800"``: Python's JSON reader keeps it, a pair becomes one
    character): Spark calls that one not valid JSON (found by the property test)."""
    if isinstance(first, str) and any("\ud800" <= c <= "\udfff" for c in first):
        return "value is not valid JSON"
    return "value is not a JSON object"


__all__ = [
    "LENIENT_JSON",
    "MISTYPED",
    "STRICT_JSON",
    "JsonObject",
    "field_converter",
    "integer_range",
    "java_double",
    "not_an_object_reason",
    "raw_decimal_converter",
]
