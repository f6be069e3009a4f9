"""How a payload field's JSON value becomes a value of its type, by rules both forms of the
transform follow (the Spark form in Spark SQL, :mod:`modeswitch.transforms.spark_json`; the
Arrow form in Python, :mod:`modeswitch.transforms.arrow`), none of them depending on a
session's time zone or locale:

- **TIMESTAMP** (``TIMESTAMP_LTZ``): a JSON string in RFC 3339's form, with its offset:
  ``YYYY-MM-DDThh:mm:ss[.fraction]Z`` or ``...±hh:mm`` (``T`` may be ``t`` or a space, ``Z``
  may be ``z``; the fraction has 1 to 9 digits, kept to the microsecond, the rest dropped),
  between the years 0001 and 9999 in UTC (:func:`timestamp_text_micros`). Anything else (a
  number, a text without an offset, a 30 February) is a value not of its type. Not Spark's
  own timestamp parsing, whose result depends on the session's time zone and its fallbacks.
- **TIMESTAMP_NTZ**: a wall-clock time, the same text without an offset:
  ``YYYY-MM-DDThh:mm:ss[.fraction]`` (:func:`wall_clock_text_micros`), kept as written, in no
  time zone (Delta's ``timestamp_ntz``). A text with an offset is not of its type: it names an
  instant, whose wall-clock reading depends on where it is read (a TIMESTAMP field keeps it).
- **DATE**: a JSON string ``YYYY-MM-DD``, a day that exists, years 0001 to 9999
  (:func:`date_text_days`); anything else (a number, ``2026-1-5``, a time after the day) is
  not a date.
- **DECIMAL(p,s)** (``DEC``, ``NUMERIC``; ``DECIMAL`` alone is ``DECIMAL(10,0)``, as in Spark):
  a JSON number, exactly as written (not through a double), or a JSON string holding a number
  as Java's ``BigDecimal`` reads one (``+.5``, ``1e2``; digits of any script; commas are
  dropped first, ``"1,000.5"`` is 1000.5: Spark's JSON reader in its default locale), rounded
  half up to ``s`` places; one that then has more than ``p`` digits, a boolean, an array, an
  object or any other text is not of its type (:func:`decimal_value`). Spark's own JSON reader
  does exactly this (checked on generated records, ``tests/spark/test_arrow_parse.py``).
- **A BIGINT event time**: epoch milliseconds of the years 0001 to 9999 (:data:`MIN_MILLIS`
  to :data:`MAX_MILLIS`).
"""

from __future__ import annotations

import decimal
import re
from datetime import date
from typing import Any

MIN_MICROS = -62_135_596_800_000_000
"""0001-01-01T00:00:00Z in microseconds since the Unix epoch: the earliest time a TIMESTAMP
field or an event time takes."""
MAX_MICROS = 253_402_300_799_999_999
"""9999-12-31T23:59:59.999999Z in microseconds since the Unix epoch: the latest."""
MIN_MILLIS = MIN_MICROS // 1000
MAX_MILLIS = MAX_MICROS // 1000
"""The epoch milliseconds a BIGINT event-time field takes (the same years)."""

WALL_CLOCK_PATTERN = (
    r"(?!0000)([0-9]{4})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt ]"
    r"([01][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9])(?:\.([0-9]{1,9}))?"
)
"""The text of a TIMESTAMP_NTZ field (module docstring), as a regular expression both Java's
and Python's engines read alike: ASCII digits only (the Spark form checks that the match is
the whole value, the Arrow form uses ``fullmatch``). The date is checked for existence apart
(no 30 February)."""

TIMESTAMP_PATTERN = WALL_CLOCK_PATTERN + r"(?:[Zz]|([+-])([01][0-9]|2[0-3]):([0-5][0-9]))"
"""The text of a TIMESTAMP field: a wall-clock time and its offset, no text after it."""

_TIMESTAMP = re.compile(TIMESTAMP_PATTERN)
_WALL_CLOCK = re.compile(WALL_CLOCK_PATTERN)
_UNIX_EPOCH_DAY = date(1970, 1, 1).toordinal()


def timestamp_text_micros(text: str) -> int | None:
    """A TIMESTAMP field's time (microseconds since the Unix epoch, UTC) from its JSON text, or
    None when the text is not of its type (module docstring). The fraction is cut to the
    microsecond (not rounded); the offset is subtracted; a result outside years 0001-9999 UTC is
    None. The Spark form (:func:`modeswitch.transforms.timestamp_from_text`) computes the
    same."""
    match = _TIMESTAMP.fullmatch(text)
    if match is None:
        return None
    *clock, sign, off_hour, off_minute = match.groups()
    micros = _clock_micros(tuple(clock))
    if micros is None:
        return None
    if sign is not None:
        offset = (int(off_hour) * 3600 + int(off_minute) * 60) * 1_000_000
        micros += -offset if sign == "+" else offset
    return micros if MIN_MICROS <= micros <= MAX_MICROS else None


def wall_clock_text_micros(text: str) -> int | None:
    """A TIMESTAMP_NTZ field's wall-clock time from its JSON text, as microseconds since
    1970-01-01T00:00:00 in no time zone (how Arrow and Parquet hold a timestamp without one),
    or None when the text is not of its type (module docstring: one with an offset is not).
    The fraction is cut to the microsecond. The Spark form
    (:func:`modeswitch.transforms.spark_json.wall_clock_from_text`) computes the same."""
    match = _WALL_CLOCK.fullmatch(text)
    return None if match is None else _clock_micros(match.groups())


def _clock_micros(parts: tuple[str | None, ...]) -> int | None:
    """Microseconds since 1970-01-01T00:00:00 of a wall-clock time's matched parts (year,
    month, day, hour, minute, second, fraction), or None for a day its month does not have."""
    year, month, day, hour, minute, second, fraction = parts
    try:
        days = date(int(year), int(month), int(day)).toordinal() - _UNIX_EPOCH_DAY
    except ValueError:
        return None
    return (
        days * 86_400_000_000
        + (int(hour) * 3600 + int(minute) * 60 + int(second)) * 1_000_000
        + int((fraction or "")[:6].ljust(6, "0"))
    )


DATE_PATTERN = r"(?!0000)[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
"""The text of a DATE field (module docstring), read alike by Java's and Python's engines; the
day is checked for existence apart."""
_DATE = re.compile(DATE_PATTERN)


def date_text_days(text: str) -> int | None:
    """A DATE field's day (days since 1970-01-01) from its JSON text, or None when the text is
    not of its type (module docstring). The Spark form
    (:func:`modeswitch.transforms.spark_json.date_from_text`) computes the same."""
    if _DATE.fullmatch(text) is None:
        return None
    try:
        return date.fromisoformat(text).toordinal() - _UNIX_EPOCH_DAY
    except ValueError:  # a day its month does not have
        return None


_DECIMAL_TYPE = re.compile(r"decimal\((\d+),(\d+)\)")
MAX_DECIMAL_PRECISION = 38
"""Spark's (and Delta's) widest decimal."""


def decimal_type(type_name: str) -> tuple[int, int] | None:
    """The precision and scale of a Spark decimal type name (``decimal(7,2)``), None for
    another type."""
    match = _DECIMAL_TYPE.fullmatch(type_name)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


# Java's BigDecimal(String): a sign, digits with at most one point (one digit at least), an
# exponent that fits an int. \d is any script's decimal digit in both (Character.isDigit).
_DECIMAL_TEXT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE]([+-]?\d+))?")
_WIDE = decimal.Context(prec=2 * MAX_DECIMAL_PRECISION + 2, Emax=10**9, Emin=-(10**9))


def decimal_value(value: Any, precision: int, scale: int) -> decimal.Decimal | None:
    """A DECIMAL(precision, scale) field's value from its JSON value (module docstring): an
    ``int``, or text: a JSON number's as written (a number with a fraction or an exponent,
    whose grammar a string's takes too) or a JSON string's; None when it is not of its type.
    Rounded half up to ``scale`` places."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    if isinstance(value, int):
        exact = decimal.Decimal(value)
    else:
        text = value.replace(",", "")
        match = _DECIMAL_TEXT.fullmatch(text)
        if match is None or (match.group(1) and abs(int(match.group(1))) >= 2**31):
            return None
        exact = decimal.Decimal(text)
    try:
        rounded = exact.quantize(
            decimal.Decimal(1).scaleb(-scale), rounding=decimal.ROUND_HALF_UP, context=_WIDE
        )
    except decimal.InvalidOperation:  # more digits than even the widest decimal has
        return None
    return rounded if len(rounded.as_tuple().digits) <= precision else None


__all__ = [
    "DATE_PATTERN",
    "MAX_DECIMAL_PRECISION",
    "MAX_MICROS",
    "MAX_MILLIS",
    "MIN_MICROS",
    "MIN_MILLIS",
    "TIMESTAMP_PATTERN",
    "WALL_CLOCK_PATTERN",
    "date_text_days",
    "decimal_type",
    "decimal_value",
    "timestamp_text_micros",
    "wall_clock_text_micros",
]
