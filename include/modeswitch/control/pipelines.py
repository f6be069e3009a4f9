"""The pipelines of a deployment, declared by files, and the Variables that tune each one.

A deployment runs one pipeline per settings file in its pipelines folder (``orders.toml`` or
``orders.json`` declares the pipeline ``orders``: the file's stem is its name, and a
``pipeline`` setting in the file must say the same), and the pipeline called ``modeswitch``,
today's single pipeline, which needs no file (one named ``modeswitch.toml`` gives it one).
Each pipeline has its own DAGs, named ``<pipeline>_<role>``: ``orders_pipeline``,
``orders_control``, ``orders_backfill``, ``orders_maintenance``, ``orders_lag_alerts``, so the
``modeswitch`` pipeline's are the names they always had.

Airflow Variables, in the names an ops person would guess (the project's prefix, then what
they tune; the same names work as ``AIRFLOW_VAR_...`` environment variables):

- ``modeswitch_<setting>``: the deployment's default, for every pipeline (what tuned the single
  pipeline before; it still does);
- ``modeswitch_<pipeline>_<setting>``: one pipeline's, above its file.

A declared pipeline's settings, later wins: code defaults < ``modeswitch_config_file`` <
``modeswitch_<setting>`` (without the settings that name one pipeline's data:
:data:`OWN_SETTINGS`) < the pipeline's file < ``modeswitch_<pipeline>_<setting>`` < the run's
``settings`` param. A key under the prefix that names no setting and no pipeline's setting is
reported (:func:`variable_report`), never silently ignored. A pipeline name for which
``modeswitch_<pipeline>_<setting>`` could also read as the default of another setting is
refused (:func:`name_problem`).

Everything here is pure (a folder listing aside): no Airflow, no Spark.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modeswitch.control.settings import PipelineSettings, pipeline_name_rule
from modeswitch.control.settings_layers import VARIABLE_PREFIX, layer_settings, read_settings_file
from modeswitch.errors import ConfigError

LEGACY = "modeswitch"
"""The pipeline a deployment runs without a file: today's single pipeline, its DAGs and its
Variables unchanged."""
ROLES = ("pipeline", "control", "backfill", "maintenance", "lag_alerts")
"""A pipeline's DAGs, each named ``<pipeline>_<role>``."""
SETTINGS_SUFFIXES = (".toml", ".json")
CONFIG_FILE_KEY = "config_file"
"""``modeswitch_config_file``: the deployment's settings file, below its Variables."""
STATE_KEY_PREFIX = "alert_state_"
"""``modeswitch_alert_state_<pipeline>``: where the lag alerts keep a pipeline's alert state
between runs (:func:`state_variable`); the project's own, not a setting."""
OWN_SETTINGS = frozenset(
    {"pipeline", "source", "sink", "quarantine", "state_root", "checkpoint_root"}
)
"""Settings that name one pipeline's data: a deployment-wide default of these would point every
pipeline at one source or one table, so the deployment layer sets them for ``modeswitch`` (the
pipeline without a file) only; a declared pipeline takes them from its file, its own Variables
or the derivation from ``warehouse``."""


@dataclass(frozen=True)
class Pipeline:
    """One pipeline of the deployment: its name and its settings file (None: ``modeswitch``
    without a file)."""

    name: str
    file: str | None = None

    def dag_id(self, role: str) -> str:
        """The DAG of ``role`` (:data:`ROLES`): ``<pipeline>_<role>``."""
        if role not in ROLES:
            raise ValueError(f"{role!r} is not one of {ROLES}")
        return f"{self.name}_{role}"

    @property
    def declared(self) -> bool:
        """Whether a file declares it (else it is the deployment's own ``modeswitch``)."""
        return self.file is not None

    def file_layer(self) -> dict[str, Any]:
        """Its file's settings (``{}`` without a file); a ConfigError naming the file when it
        cannot be read or names another pipeline."""
        if self.file is None:
            return {}
        layer = read_settings_file(self.file)
        named = layer.get("pipeline")
        if named is not None and str(named).strip() != self.name:
            raise ConfigError(
                f"{self.file}: pipeline: {named!r} is not the file's name {self.name!r}; a file "
                "declares the pipeline named after it (leave the setting out)",
                setting="pipeline",
            )
        return {**layer, "pipeline": self.name}

    def own_settings(self) -> PipelineSettings:
        """Its settings from its file alone (code defaults < the file), validated: what the DAG
        factory checks, and what ``modeswitch run`` and ``status`` run without Airflow. A bad
        value is a ConfigError naming the file and the setting."""
        return layer_settings((f"{self.file}:", self.file_layer()))


@dataclass(frozen=True)
class Fleet:
    """The deployment's pipelines: ``modeswitch`` and one per file, and the files that
    declare none (``{file: why}``)."""

    pipelines: tuple[Pipeline, ...]
    refused: Mapping[str, str] = field(default_factory=dict)

    def names(self) -> list[str]:
        return [p.name for p in self.pipelines]

    def get(self, name: str) -> Pipeline:
        for pipeline in self.pipelines:
            if pipeline.name == name:
                return pipeline
        raise ConfigError(
            f"pipeline {name!r} is not declared in this deployment (its pipelines: "
            f"{', '.join(self.names())})",
            setting="pipeline",
        )


def settings_files(folder: str | Path | None) -> list[Path]:
    """The settings files of ``folder`` (``.toml``, ``.json``; hidden ones left out), sorted;
    none when it does not exist."""
    if folder is None:
        return []
    root = Path(folder)
    if not root.is_dir():
        return []
    return sorted(
        path
        for path in root.iterdir()
        if path.suffix in SETTINGS_SUFFIXES and not path.name.startswith(".") and path.is_file()
    )


def list_fleet(folder: str | Path | None, *, names: Collection[str] | None = None) -> Fleet:
    """The pipelines ``folder`` declares, after ``modeswitch`` (replaced by ``modeswitch.toml``
    when there is one). Only the names are checked here, not the files' settings: a file whose
    name is no pipeline's, or that shares its name with another, is refused (``Fleet.refused``)."""
    settings = PipelineSettings.names() if names is None else names
    declared: dict[str, Pipeline] = {}
    refused: dict[str, str] = {}
    for path in settings_files(folder):
        name = path.stem
        problem = name_problem(name, settings)
        if problem is None and name in declared:
            problem = f"declares pipeline {name!r}, as {declared[name].file} does"
        if problem is not None:
            refused[str(path)] = problem
            continue
        declared[name] = Pipeline(name, str(path))
    for name in sorted(declared):
        problem = _shadowed(name, declared, settings)
        if problem is not None:
            refused[str(declared.pop(name).file)] = problem
    legacy = declared.pop(LEGACY, Pipeline(LEGACY))
    return Fleet((legacy, *declared.values()), refused)


def name_problem(name: str, settings: Collection[str]) -> str | None:
    """Why ``name`` cannot name a pipeline (None: it can): not a valid name, or one whose
    Variables could be read as another setting's default (``modeswitch_<name>_<setting>``
    spelling a setting's name)."""
    invalid = pipeline_name_rule(name)
    if invalid is not None:
        return f"pipeline: {name!r} {invalid}"
    known = set(settings)
    clashes = sorted(f"{name}_{t}" for t in known if f"{name}_{t}" in known)
    if clashes:
        return (
            f"pipeline name {name!r} is refused: its Variable {VARIABLE_PREFIX}{name}_<setting> "
            f"would read as the deployment's {VARIABLE_PREFIX}{clashes[0]}"
        )
    return None


def _shadowed(name: str, others: Collection[str], settings: Collection[str]) -> str | None:
    """Why ``name`` cannot sit beside ``others``: a Variable of it would also read as another
    pipeline's (``a`` and ``a_b`` with settings ``b_x`` and ``x``); None when it can."""
    for other in others:
        rest = name[len(other) + 1 :] if name.startswith(f"{other}_") else None
        if rest is None:
            continue
        clash = next((s for s in settings if f"{rest}_{s}" in settings), None)
        if clash is not None:
            return (
                f"pipeline name {name!r} is refused beside {other!r}: "
                f"{VARIABLE_PREFIX}{name}_{clash} would also read as pipeline {other!r}'s "
                f"{rest}_{clash}"
            )
    return None


# --- Variables ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class VariableTarget:
    """What one Variable under the prefix tunes: a setting of every pipeline (``pipeline``
    None), of one pipeline, or nothing (``problem`` says why)."""

    key: str
    setting: str | None = None
    pipeline: str | None = None
    problem: str = ""


def classify_variable(
    key: str, pipelines: Collection[str], settings: Collection[str]
) -> VariableTarget:
    """What the Variable ``key`` tunes, among ``pipelines`` and ``settings`` (pure)."""
    rest = key[len(VARIABLE_PREFIX) :] if key.startswith(VARIABLE_PREFIX) else None
    if rest is None:
        return VariableTarget(key, problem=f"is not under the prefix {VARIABLE_PREFIX}")
    if rest in settings or rest == CONFIG_FILE_KEY:
        return VariableTarget(key, setting=rest)
    if rest.startswith(STATE_KEY_PREFIX):
        return VariableTarget(key)  # the alerts' state: tunes nothing, and is no mistake
    readings = [
        (name, rest[len(name) + 1 :])
        for name in pipelines
        if rest.startswith(f"{name}_") and rest[len(name) + 1 :] in settings
    ]
    if len(readings) == 1:
        name, setting = readings[0]
        if setting == "pipeline":
            return VariableTarget(
                key, problem=f"would rename pipeline {name!r}, which its file names; it is ignored"
            )
        return VariableTarget(key, setting=setting, pipeline=name)
    if readings:
        both = " or ".join(f"pipeline {n!r}'s {s}" for n, s in readings)
        return VariableTarget(key, problem=f"could be {both}; it is applied to neither")
    return VariableTarget(key, problem=_no_such_variable(key, pipelines, settings))


def _no_such_variable(key: str, pipelines: Collection[str], settings: Collection[str]) -> str:
    """Why ``key`` tunes nothing, with the nearest Variable it may have meant."""
    known = [f"{VARIABLE_PREFIX}{s}" for s in settings]
    known += [f"{VARIABLE_PREFIX}{p}_{s}" for p in pipelines for s in settings]
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return f"names no setting and no pipeline's setting{hint}; it is ignored"


def state_variable(pipeline: str) -> str:
    """The Airflow Variable that keeps ``pipeline``'s lag-alert state between runs."""
    return f"{VARIABLE_PREFIX}{STATE_KEY_PREFIX}{pipeline}"


def variable_report(
    keys: Iterable[str], pipelines: Collection[str], settings: Collection[str] | None = None
) -> list[VariableTarget]:
    """The Variables under the prefix that tune nothing, each with why (sorted by key)."""
    known = PipelineSettings.names() if settings is None else settings
    targets = (classify_variable(k, pipelines, known) for k in sorted(set(keys)))
    return [t for t in targets if t.problem]
