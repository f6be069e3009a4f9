"""The flat form every settings class reads and writes: one mapping of setting name to raw
value, as a layer holds it (a config file, the Airflow Variables, a run's params), and its
JSON (what the ``decide`` step hands a job).

A settings class (:mod:`modeswitch.control.settings`, :mod:`modeswitch.control.setting_groups`)
is a frozen dataclass of fields declared with :func:`~modeswitch.control.values.setting`;
:class:`FlatSettings` gives it :meth:`~FlatSettings.from_mapping` and its inverse
:meth:`~FlatSettings.to_mapping`, both read from those fields. A class that holds groups of
settings (``PipelineSettings``: policy, planner, maintenance) names them in
``setting_groups``: one flat layer holds the settings of the class and of its groups.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, ClassVar, Self

from modeswitch.control.values import declared_settings, parse_settings, refuse_unknown
from modeswitch.errors import ConfigError


class FlatSettings:
    """A settings class read from, and written to, one flat layer of raw values."""

    settings_kind: ClassVar[str]
    """What an unknown name is refused as: ``unknown <kind> setting(s) ...``."""
    setting_groups: ClassVar[Mapping[str, type[FlatSettings]]] = {}
    """The fields that hold a group of settings, and the group's class, in table order."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every setting name a layer may hold (the class's, then its groups'), in the
        settings table's order."""
        classes = (cls, *cls.setting_groups.values())
        return tuple(d.name for group in classes for d in declared_settings(group))

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Self:
        """Settings from one flat mapping of raw values (strings as Airflow Variables hold
        them); defaults fill the gaps; an unknown name is refused, naming it."""
        refuse_unknown(raw, cls.names(), what=cls.settings_kind)
        groups = {
            key: group(**parse_settings(group, raw)) for key, group in cls.setting_groups.items()
        }
        return cls(**parse_settings(cls, raw), **groups)

    def to_mapping(self) -> dict[str, str]:
        """A flat mapping of strings that :meth:`from_mapping` reads back to equal settings."""
        out: dict[str, str] = {}
        for group in (self, *(getattr(self, key) for key in self.setting_groups)):
            for declared in declared_settings(type(group)):
                out[declared.name] = _raw_value(getattr(group, declared.name))
        return out

    def to_json(self) -> str:
        """:meth:`to_mapping` as a JSON object, keys sorted."""
        return json.dumps(self.to_mapping(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Self:
        """Settings from :meth:`to_json`'s form (or any JSON object of raw values)."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"settings: {text[:80]!r} is not valid JSON ({exc})") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"settings: expected a JSON object, got {type(raw).__name__}")
        return cls.from_mapping(raw)


def _raw_value(value: Any) -> str:
    """``value`` as a layer holds it, which its parser reads back."""
    if value is None:
        return "none"
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
