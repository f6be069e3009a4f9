"""Settings, validated in one place.

Layering (code defaults < config file < Airflow Variables < run params) builds on the value
parsers here. Every parser takes the setting's name so that its error names the setting and
the bad value.
"""

from __future__ import annotations

import re
from datetime import timedelta

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
        raise ConfigError(f"{setting}: {value!r} is not a duration")
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
                    "(use e.g. '30s', '5m', '250ms' or ISO-8601 'PT5M')"
                ) from exc
            if not isinstance(parsed, pendulum.Duration):
                raise ConfigError(
                    f"{setting}: {value!r} is a date or time, not a duration "
                    "(use e.g. '30s', '5m' or ISO-8601 'PT5M')"
                )
            seconds = parsed.total_seconds()
    else:
        raise ConfigError(f"{setting}: {value!r} is not a duration")
    if seconds < 0:
        raise ConfigError(f"{setting}: {value!r} is negative")
    return timedelta(seconds=seconds)


def parse_rate(value: str | float | int, *, setting: str) -> float:
    """Records per second from ``5000``, ``5000/s``, ``300/m`` or ``1000/h``; must be > 0."""
    text = str(value).strip()
    match = re.match(r"^(\d+(?:\.\d+)?)\s*(?:/\s*(s|m|h))?$", text)
    if not match:
        raise ConfigError(f"{setting}: {value!r} is not a rate (use e.g. '5000/s' or '300/m')")
    per = {"s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2) or "s"]
    rate = float(match.group(1)) / per
    if rate <= 0:
        raise ConfigError(f"{setting}: {value!r} must be greater than 0")
    return rate
