"""The settings' layers: code defaults < config file < Airflow Variables < run params.

Every layer is a flat mapping of setting name to raw value (:class:`PipelineSettings`'s
``from_mapping`` reads one); :func:`layer_settings` applies them in order and names the layer
of a bad value, :func:`setting_origins` tells which layer set each setting,
:func:`read_settings_file` reads a config file's layer, :func:`variable_name` names a
setting's Airflow Variable, and :func:`load_job_settings` reads what a Spark job was handed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError

VARIABLE_PREFIX = "modeswitch_"


def variable_name(setting: str) -> str:
    """The Airflow Variable that holds ``setting``: ``modeswitch_<setting>``."""
    return f"{VARIABLE_PREFIX}{setting}"


def read_settings_file(path: str) -> dict[str, Any]:
    """A config file's flat mapping: TOML (``.toml``) or JSON (anything else)."""
    import json
    import tomllib

    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle) if path.endswith(".toml") else json.load(handle)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path!r} does not exist") from exc
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"config file {path!r} is not valid: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r}: expected a table/object of settings")
    return data


def layer_settings(*layers: tuple[str, Mapping[str, Any] | None]) -> PipelineSettings:
    """Apply named layers in order (later wins) over the code defaults, then validate.

    Each layer is ``(where, mapping)``, e.g. ``("Airflow Variable", {...})``; a bad value is
    reported as ``<where> <setting>: ...`` so the operator knows what to fix.
    """
    merged: dict[str, Any] = {}
    for _, mapping in layers:
        merged.update(mapping or {})
    origin = setting_origins(*layers)
    try:
        return PipelineSettings.from_mapping(merged)
    except ConfigError as exc:
        where = origin.get(exc.setting) if exc.setting else None
        raise ConfigError(f"{where} {exc}" if where else str(exc), setting=exc.setting) from exc


def setting_origins(*layers: tuple[str, Mapping[str, Any] | None]) -> dict[str, str]:
    """Where each setting that a layer sets got its value: the last layer that sets it, as
    :func:`layer_settings` names it (``config file pipeline.toml:``); settings no layer sets
    have their code default."""
    origin: dict[str, str] = {}
    for where, mapping in layers:
        origin.update(dict.fromkeys(mapping or {}, where))
    return origin


def load_job_settings(config: str, *, pipeline: str) -> PipelineSettings:
    """The settings a Spark job was given with ``--config``: inline JSON or a JSON/TOML file.

    The ``decide`` step resolves and validates every layer, then hands the result to the job,
    so both see the same values. ``pipeline`` must match the settings' pipeline.
    """
    raw = config.strip()
    if raw.startswith("{"):
        settings = PipelineSettings.from_json(raw)
    else:
        settings = PipelineSettings.from_mapping(read_settings_file(raw))
    if settings.pipeline != pipeline:
        raise ConfigError(
            f"--pipeline {pipeline!r} does not match the settings' pipeline {settings.pipeline!r}"
        )
    return settings
