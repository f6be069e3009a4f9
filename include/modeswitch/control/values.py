"""The value parsers of settings: durations, rates, counts, switches, thresholds, JVM memory.

Every parser takes the setting's name, so that its error names the setting and the bad value
(:class:`~modeswitch.errors.ConfigError`). :mod:`modeswitch.control.settings` builds the settings
classes and their layers on these.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

import pendulum

from modeswitch.errors import ConfigError

_SHORT_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: str | float | int | timedelta, *, setting: str) -> timedelta:
    """A duration from ``30s``, ``5m``, ``250ms``, ``1.5h``, ISO-8601 (``PT5M``) or seconds.

    Numbers are seconds. Negative durations are refused.
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ConfigError(f"{setting}: {value!r} is not a duration", setting=setting)
    elif isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        match = _SHORT_DURATION.match(value)
        if match:
            seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        else:
            try:
                parsed = pendulum.parse(value.strip())
            except (ValueError, TypeError) as exc:
                raise ConfigError(
                    f"{setting}: {value!r} is not a duration "
                    "(use e.g. '30s', '5m', '250ms' or ISO-8601 'PT5M')",
                    setting=setting,
                ) from exc
            if not isinstance(parsed, pendulum.Duration):
                raise ConfigError(
                    f"{setting}: {value!r} is a date or time, not a duration "
                    "(use e.g. '30s', '5m' or ISO-8601 'PT5M')",
                    setting=setting,
                )
            seconds = parsed.total_seconds()
    else:
        raise ConfigError(f"{setting}: {value!r} is not a duration", setting=setting)
    if seconds < 0:
        raise ConfigError(f"{setting}: {value!r} is negative", setting=setting)
    return timedelta(seconds=seconds)


def parse_rate(value: str | float | int, *, setting: str) -> float:
    """Records per second from ``5000``, ``5000/s``, ``300/m`` or ``1000/h``; must be > 0."""
    text = str(value).strip()
    match = re.match(r"^(\d+(?:\.\d+)?)\s*(?:/\s*(s|m|h))?$", text)
    if not match:
        raise ConfigError(
            f"{setting}: {value!r} is not a rate (use e.g. '5000/s' or '300/m')", setting=setting
        )
    per = {"s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2) or "s"]
    rate = float(match.group(1)) / per
    if rate <= 0:
        raise ConfigError(f"{setting}: {value!r} must be greater than 0", setting=setting)
    return rate


# --- value parsers shared by the settings classes --------------------------------------------

_OFF_WORDS = frozenset({"none", "null", "off", ""})


def parse_positive_int(value: str | int, *, setting: str) -> int:
    """A whole number > 0 from an int or a string such as ``"1000"`` or ``"1_000_000"``."""
    if isinstance(value, bool):
        raise ConfigError(f"{setting}: {value!r} is not a whole number", setting=setting)
    if isinstance(value, str):
        try:
            number = int(value.strip(), 10)
        except ValueError as exc:
            raise ConfigError(
                f"{setting}: {value!r} is not a whole number", setting=setting
            ) from exc
    elif isinstance(value, int):
        number = value
    else:
        raise ConfigError(f"{setting}: {value!r} is not a whole number", setting=setting)
    if number <= 0:
        raise ConfigError(f"{setting}: {value!r} must be greater than 0", setting=setting)
    return number


def parse_fraction(value: str | float | int, *, setting: str) -> float:
    """A fraction ``0 < f <= 1`` from a number or a string such as ``"0.5"`` or ``"50%"``."""
    if isinstance(value, bool):
        raise ConfigError(f"{setting}: {value!r} is not a fraction", setting=setting)
    number: float
    if isinstance(value, str):
        text = value.strip()
        try:
            number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError as exc:
            raise ConfigError(
                f"{setting}: {value!r} is not a fraction (e.g. 0.5)", setting=setting
            ) from exc
    elif isinstance(value, (int, float)):
        number = float(value)
    else:
        raise ConfigError(f"{setting}: {value!r} is not a fraction", setting=setting)
    if not 0 < number <= 1:
        raise ConfigError(
            f"{setting}: {value!r} must be greater than 0 and at most 1", setting=setting
        )
    return number


_TRUE_WORDS = frozenset({"true", "on", "yes", "1"})
_FALSE_WORDS = frozenset({"false", "off", "no", "0"})


def parse_bool(value: str | bool, *, setting: str) -> bool:
    """A switch from a bool or ``true``/``false``, ``on``/``off``, ``yes``/``no``, ``1``/``0``."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE_WORDS:
        return True
    if text in _FALSE_WORDS:
        return False
    raise ConfigError(
        f"{setting}: {value!r} is not on or off (use 'true' or 'false')", setting=setting
    )


def parse_threshold_duration(
    value: str | float | int | timedelta | None, *, setting: str
) -> timedelta | None:
    """A duration threshold: ``None`` (or ``"none"``, ``"null"``, ``"off"``) turns it off;
    otherwise a duration as :func:`parse_duration` reads it, which must be greater than 0.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in _OFF_WORDS):
        return None
    duration = parse_duration(value, setting=setting)
    if duration <= timedelta(0):
        raise ConfigError(
            f"{setting}: {value!r} must be greater than 0 (use 'none' to turn it off)",
            setting=setting,
        )
    return duration


def parse_threshold_count(value: str | int | None, *, setting: str) -> int | None:
    """A record-count threshold: ``None`` (or ``"none"``, ``"null"``, ``"off"``) turns it off;
    otherwise a whole number greater than 0.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in _OFF_WORDS):
        return None
    try:
        return parse_positive_int(value, setting=setting)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (use 'none' to turn it off)", setting=setting) from exc


def _refuse_unknown(raw: Mapping[str, Any], known: Iterable[str], *, what: str) -> None:
    known = frozenset(known)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(
            f"unknown {what} setting(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(known))}"
        )


_JVM_MEMORY = re.compile(r"^(\d+)([kmgt]?)$")
_JVM_UNIT_BYTES = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
MIN_DRIVER_MEMORY = 512 * 2**20
"""Spark refuses a driver heap under ~450 MB (its 300 MB reserve, times 1.5)."""


def parse_jvm_memory(value: str | None, *, setting: str) -> str:
    """A JVM memory size as Spark takes it (``1g``, ``768m``), at least 512 MB, or ``""``
    (``none``, ``off``: Spark's own default)."""
    if value is None or str(value).strip().lower() in _OFF_WORDS:
        return ""
    text = str(value).strip().lower()
    match = _JVM_MEMORY.match(text.removesuffix("b"))
    if not match:
        raise ConfigError(
            f"{setting}: {value!r} is not a memory size (use e.g. '1g' or '768m')", setting=setting
        )
    if int(match.group(1)) * _JVM_UNIT_BYTES[match.group(2)] < MIN_DRIVER_MEMORY:
        raise ConfigError(
            f"{setting}: {value!r} is less than 512m, which Spark needs at least", setting=setting
        )
    return text.removesuffix("b")
