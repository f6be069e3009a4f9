"""The value parsers of settings (durations, rates, counts, switches, thresholds, JVM memory,
text, choices) and :func:`setting`, which declares a settings class's field as one setting.

Every parser takes the setting's name, so that its error names the setting and the bad value
(:class:`~modeswitch.errors.ConfigError`). :mod:`modeswitch.control.settings` builds the settings
classes and their layers on these: each field declared with :func:`setting` carries its parser,
its rule and its doc, and :func:`parse_settings`, :func:`check_settings` and
:func:`declared_settings` read every setting of a class from its fields, so that no setting is
listed anywhere else.
"""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

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


def parse_instant(value: str | datetime | None, *, setting: str) -> datetime | None:
    """A moment, in UTC: ISO 8601 with its offset (``2026-11-29T12:00:00Z``); ``None`` (or
    ``"none"``, ``"null"``, ``"off"``) for none. A time without an offset is refused: the
    driver, the engine and Airflow's workers may each read it in another zone."""
    if value is None or (isinstance(value, str) and value.strip().lower() in _OFF_WORDS):
        return None
    try:
        moment = value if isinstance(value, datetime) else datetime.fromisoformat(value.strip())
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise ConfigError(
            f"{setting}: {value!r} is not a time with its offset (e.g. '2026-11-29T12:00:00Z')",
            setting=setting,
        )
    return moment.astimezone(UTC)


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


def refuse_unknown(raw: Mapping[str, Any], known: Iterable[str], *, what: str) -> None:
    """Refuse ``raw`` when it holds a name that is not ``known``: a :class:`ConfigError`
    naming the unknown ``what`` settings and the known ones."""
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


def parse_text(value: str, *, setting: str) -> str:
    """Text, trimmed; anything but a string is refused."""
    if not isinstance(value, str):
        raise ConfigError(f"{setting}: {value!r} is not text", setting=setting)
    return value.strip()


def parse_choice(value: str, *, setting: str) -> str:
    """One word of a choice, as written in any case: trimmed and lower-cased. Which words are
    allowed is the setting's ``Literal`` type, which :func:`check_settings` checks."""
    return str(value).strip().lower()


_DURATION_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1))


def format_duration(value: timedelta) -> str:
    """``value`` in the largest unit :func:`parse_duration` reads that holds it whole:
    ``100ms``, ``30s``, ``5m``, ``2h``, ``7d`` (``0s`` for none at all)."""
    millis = round(value.total_seconds() * 1000)
    for unit, size in _DURATION_UNITS:
        if millis and millis % size == 0:
            return f"{millis // size}{unit}"
    return f"{value.total_seconds():g}s"


# --- rules: what a typed value must be, beyond its type ----------------------------------------
# A rule says what is wrong with a value (``"must be greater than 0"``), or None when nothing is;
# :func:`check_settings` reports it as ``<setting>: <value> <what is wrong>``.

Rule = Callable[[Any], str | None]


def _zero(value: Any) -> Any:
    return timedelta(0) if isinstance(value, timedelta) else 0


def greater_than_zero(value: Any) -> str | None:
    """A count or a duration > 0."""
    return None if value > _zero(value) else "must be greater than 0"


def threshold_above_zero(value: Any) -> str | None:
    """A threshold > 0; its setting's ``None`` turns it off (and never reaches the rule)."""
    return None if value > _zero(value) else "must be greater than 0 (use None to turn it off)"


def not_negative(value: Any) -> str | None:
    """A duration >= 0."""
    return None if value >= _zero(value) else "is negative"


def within_fraction(value: float) -> str | None:
    """A fraction ``0 < f <= 1``."""
    return None if 0 < value <= 1 else "must be greater than 0 and at most 1"


def at_least(minimum: Any, what: str) -> Rule:
    """A rule refusing values under ``minimum``; ``what`` says what a smaller one would do."""

    def rule(value: Any) -> str | None:
        return None if value >= minimum else what

    return rule


# --- settings declared as dataclass fields ---------------------------------------------------

Parser = Callable[..., Any]
"""``parse(raw, *, setting=name)``: a raw value (a string as an Airflow Variable holds it, or a
value of the setting's type) to the setting's value; a ConfigError naming the setting."""


@dataclass(frozen=True)
class Setting:
    """One setting, kept in its dataclass field's metadata by :func:`setting`. With the field's
    name, type and default, it is the setting's row of the settings table."""

    parse: Parser
    doc: str
    rule: Rule | None = None
    shown: str | None = None


_SETTING = "modeswitch.setting"


def setting(
    default: Any, *, parse: Parser, doc: str, rule: Rule | None = None, shown: str | None = None
) -> Any:
    """Declare a settings class's field as one setting (``dataclasses.field`` with the setting
    in its metadata): ``default`` is its code default, ``parse`` reads its raw values
    (:data:`Parser`), ``rule`` says what a value of its type must be beyond that type
    (:data:`Rule`; a ``Literal`` type's words need none), ``doc`` what it does (the settings
    table's text, markdown), and ``shown`` its default as the table shows it where the code
    default stands for one derived from other settings (``<warehouse>/<pipeline>``)."""
    return field(default=default, metadata={_SETTING: Setting(parse, doc, rule, shown)})


@dataclass(frozen=True)
class DeclaredSetting:
    """A setting as its class declares it: the field's name, type and default, and its
    :class:`Setting`."""

    name: str
    type: Any
    default: Any
    setting: Setting

    @property
    def choices(self) -> tuple[str, ...]:
        """The words a ``Literal`` type allows; ``()`` for any other type."""
        base, _ = _optional(self.type)
        return get_args(base) if get_origin(base) is Literal else ()

    def describe_type(self) -> str:
        """The type as the settings table shows it (markdown): a duration threshold is
        "duration or `none`", a ``Literal`` its words."""
        base, optional = _optional(self.type)
        if self.choices:
            text = ", ".join(f"`{choice}`" for choice in self.choices)
        else:
            text = _TYPE_NAMES[base]
        return f"{text} or `none`" if optional else text

    def describe_default(self) -> str:
        """The default as the settings table shows it, written as a layer would set it."""
        value = self.default
        if self.setting.shown is not None:
            return f"`{self.setting.shown}`"
        if value == "":
            return "(none)"
        if value is None:
            return "`none`"
        if isinstance(value, bool):
            return "`true`" if value else "`false`"
        if isinstance(value, timedelta):
            return f"`{format_duration(value)}`"
        return f"`{value}`"


_TYPE_NAMES = {
    timedelta: "duration",
    datetime: "time (ISO 8601, with its offset)",
    bool: "`true` or `false`",
    int: "whole number",
    float: "number",
    str: "text",
}
_TYPE_WORDS = {
    timedelta: "a duration (timedelta)",
    datetime: "a time with its offset (datetime)",
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    str: "text",
}


def _optional(hint: Any) -> tuple[Any, bool]:
    """``(T, True)`` for ``T | None``, else ``(hint, False)``."""
    args = get_args(hint)
    if get_origin(hint) in (Union, types.UnionType) and type(None) in args:
        (base,) = (arg for arg in args if arg is not type(None))
        return base, True
    return hint, False


@functools.cache
def declared_settings(cls: type) -> tuple[DeclaredSetting, ...]:
    """The settings ``cls`` declares with :func:`setting`, in field order; its other fields
    (the groups of :class:`~modeswitch.control.settings.PipelineSettings`) are not settings."""
    hints = get_type_hints(cls)
    return tuple(
        DeclaredSetting(f.name, hints[f.name], f.default, f.metadata[_SETTING])
        for f in fields(cls)
        if _SETTING in f.metadata
    )


def parse_settings(cls: type, raw: Mapping[str, Any]) -> dict[str, Any]:
    """The values of ``cls``'s settings that ``raw`` holds, each read by its own parser; names
    that are not ``cls``'s settings are left out (:func:`refuse_unknown` refuses them)."""
    return {
        declared.name: declared.setting.parse(raw[declared.name], setting=declared.name)
        for declared in declared_settings(cls)
        if declared.name in raw
    }


def check_settings(instance: Any) -> None:
    """Every setting of ``instance`` holds a value of its type (one of a ``Literal``'s words;
    None only where the type allows it) that its rule accepts; else a ConfigError naming the
    setting and the value."""
    for declared in declared_settings(type(instance)):
        name, value = declared.name, getattr(instance, declared.name)
        base, optional = _optional(declared.type)
        if value is None and optional:
            continue
        wrong = _type_mismatch(base, declared.choices, value)
        if wrong:
            raise ConfigError(
                f"{name}: {value!r} {wrong}" + (" or None" if optional else ""), setting=name
            )
        wrong = declared.setting.rule(value) if declared.setting.rule else None
        if wrong:
            shown = value if isinstance(value, timedelta) else repr(value)
            raise ConfigError(f"{name}: {shown} {wrong}", setting=name)


def _type_mismatch(base: Any, choices: tuple[str, ...], value: Any) -> str | None:
    if choices:
        return None if value in choices else f"is not one of {', '.join(choices)}"
    if base is bool:
        fits = isinstance(value, bool)
    elif base is int:
        fits = isinstance(value, int) and not isinstance(value, bool)
    elif base is float:
        fits = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        fits = isinstance(value, base)
    return None if fits else f"is not {_TYPE_WORDS[base]}"
