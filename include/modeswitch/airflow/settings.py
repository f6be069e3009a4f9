"""Pipeline settings from Airflow Variables, read at run time.

One Variable per setting, named ``modeswitch_<setting>`` (e.g. ``modeswitch_enter_threshold``
= ``45s``; :func:`~modeswitch.control.settings_layers.variable_name`, which the settings table
shows too), holding the same raw strings :meth:`PipelineSettings.from_mapping` reads: the
deployment's default for every pipeline. A pipeline declared by a file in the pipelines folder
(:mod:`modeswitch.control.pipelines`) has its own over it, ``modeswitch_<pipeline>_<setting>``.
An optional ``modeswitch_config_file`` Variable names a JSON/TOML file of settings. Layers,
later wins: code defaults < that file < the deployment's Variables < the pipeline's file < its
own Variables < the run's ``settings`` param. A bad value raises :class:`ConfigError` naming
the Variable (or the file, or the param) and the value. Variables under the prefix that tune
nothing are listed by :func:`unknown_variables`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from modeswitch.control.pipelines import (
    LEGACY,
    OWN_SETTINGS,
    Fleet,
    Pipeline,
    VariableTarget,
    list_fleet,
    variable_report,
)
from modeswitch.control.settings import PipelineSettings
from modeswitch.control.settings_layers import (
    VARIABLE_PREFIX,
    layer_settings,
    read_settings_file,
    variable_name,
)
from modeswitch.environment import PIPELINES_DIR, env_value
from modeswitch.errors import ConfigError
from modeswitch.sources import log_type
from modeswitch.storage import storage_environment

CONFIG_FILE_VARIABLE = f"{VARIABLE_PREFIX}config_file"
ENVIRONMENT_VARIABLE_PREFIX = "AIRFLOW_VAR_"
"""Airflow reads a Variable ``key`` from ``AIRFLOW_VAR_<KEY>`` too."""

VariableGetter = Callable[[str], Any]
Layers = list[tuple[str, Mapping[str, Any] | None]]


def airflow_variable(key: str) -> Any:
    """``Variable.get(key)``, or None when the Variable is not set (run time only)."""
    from airflow.sdk import Variable

    return Variable.get(key, default=None)


def read_variables(
    get_variable: VariableGetter | None = None, *, prefix: str = VARIABLE_PREFIX
) -> dict[str, Any]:
    """The settings that are set as Variables named ``<prefix><setting>``: ``{setting: raw
    value}``."""
    get = get_variable or airflow_variable
    values = {}
    for name in PipelineSettings.names():
        value = get(f"{prefix}{name}")
        if value is not None:
            values[name] = value
    return values


def settings_from_airflow(
    overrides: Mapping[str, Any] | None = None,
    *,
    get_variable: VariableGetter | None = None,
    pipeline: Pipeline | None = None,
) -> PipelineSettings:
    """Resolve and validate ``pipeline``'s settings (``modeswitch`` without a file by default):
    defaults < ``modeswitch_config_file`` < ``modeswitch_<setting>`` Variables < the pipeline's
    file < ``modeswitch_<pipeline>_<setting>`` < ``overrides`` (the run's ``settings``)."""
    return layer_settings(
        *airflow_setting_layers(overrides, get_variable=get_variable, pipeline=pipeline)
    )


def airflow_setting_layers(
    overrides: Mapping[str, Any] | None = None,
    *,
    get_variable: VariableGetter | None = None,
    pipeline: Pipeline | None = None,
) -> Layers:
    """The layers :func:`settings_from_airflow` resolves, in order, each named for errors and
    for :func:`~modeswitch.control.settings_layers.setting_origins`. A declared pipeline takes
    no :data:`~modeswitch.control.pipelines.OWN_SETTINGS` from the deployment's layers, and its
    run's ``settings`` cannot name another pipeline."""
    get = get_variable or airflow_variable
    pipeline = pipeline or Pipeline(LEGACY)
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError(f"run param settings: {overrides!r} is not an object of settings")
    overrides = dict(overrides or {})
    named = overrides.get("pipeline")
    if pipeline.declared and named not in (None, "", pipeline.name):
        raise ConfigError(
            f"run param settings: pipeline: {named!r}; these DAGs run pipeline "
            f"{pipeline.name!r} (declared by {pipeline.file})",
            setting="pipeline",
        )
    config_file = get(CONFIG_FILE_VARIABLE)
    file_layer = read_settings_file(str(config_file)) if config_file else None
    variables = read_variables(get)
    if pipeline.declared:
        file_layer = _without(file_layer, OWN_SETTINGS)
        variables = _without(variables, OWN_SETTINGS)
    layers: Layers = [(f"config file {config_file}:", file_layer)]
    # One layer per Variable, so that an error names the Variable itself.
    layers += [(f"Airflow Variable {variable_name(k)!r}:", {k: v}) for k, v in variables.items()]
    if pipeline.declared:
        layers.append((f"pipeline file {pipeline.file}:", pipeline.file_layer()))
        prefix = f"{VARIABLE_PREFIX}{pipeline.name}_"
        own = _without(read_variables(get, prefix=prefix), {"pipeline"})
        layers += [(f"Airflow Variable {prefix + k!r}:", {k: v}) for k, v in own.items()]
    layers.append(("run param settings:", overrides))
    return layers


def _without(layer: Mapping[str, Any] | None, names: Iterable[str]) -> dict[str, Any] | None:
    if layer is None:
        return None
    dropped = set(names)
    return {key: value for key, value in layer.items() if key not in dropped}


# --- the deployment's pipelines and its Variables' names ------------------------------------


def pipelines_folder(dags_folder: str | Path | None = None) -> Path:
    """The deployment's pipelines folder: ``MODESWITCH_PIPELINES_DIR``, else ``pipelines``
    beside the DAG files (``dags_folder``; Airflow's ``[core] dags_folder`` when not given)."""
    configured = env_value(PIPELINES_DIR)
    if configured is not None:
        return configured
    if dags_folder is None:
        from airflow.configuration import conf

        dags_folder = conf.get("core", "dags_folder")
    return Path(dags_folder).resolve() / "pipelines"


def deployment_fleet(dags_folder: str | Path | None = None) -> Fleet:
    """The deployment's pipelines (:func:`~modeswitch.control.pipelines.list_fleet` of
    :func:`pipelines_folder`)."""
    return list_fleet(pipelines_folder(dags_folder))


def variable_keys(environ: Mapping[str, str] | None = None) -> list[str]:
    """The keys of the Variables under the prefix: the metadata database's (through the Task
    SDK in a task, the database itself in Airflow's servers and the command line) and the
    environment's ``AIRFLOW_VAR_MODESWITCH_*`` (lower case, as Airflow matches them). A secrets
    backend's Variables are read by name only: they are not listed."""
    environ = os.environ if environ is None else environ
    marker = f"{ENVIRONMENT_VARIABLE_PREFIX}{VARIABLE_PREFIX.upper()}"
    keys = {
        name[len(ENVIRONMENT_VARIABLE_PREFIX) :].lower()
        for name in environ
        if name.startswith(marker)
    }
    return sorted(keys | set(_stored_variable_keys()))


def _stored_variable_keys() -> list[str]:
    from airflow.sdk.execution_time import task_runner

    if getattr(task_runner, "SUPERVISOR_COMMS", None) is not None:  # in a task
        from airflow.sdk import Variable

        return list(Variable.keys(prefix=VARIABLE_PREFIX))
    from airflow.models.variable import Variable as StoredVariable
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        query = select(StoredVariable.key).where(StoredVariable.key.startswith(VARIABLE_PREFIX))
        return list(session.scalars(query))


def unknown_variables(fleet: Fleet, keys: Iterable[str] | None = None) -> list[VariableTarget]:
    """The Variables under the prefix that tune no setting of any of ``fleet``'s pipelines, each
    with why (``keys``: :func:`variable_keys` by default)."""
    return variable_report(variable_keys() if keys is None else keys, fleet.names())


def connection_storage_options(settings: PipelineSettings) -> dict[str, str]:
    """The tables' storage options: the extras of the Airflow Connection named by the
    ``storage_connection`` setting (``{}`` when the setting is empty). Read at run time;
    never logged; passed to what needs them, never put in this process's environment."""
    if not settings.storage_connection:
        return {}
    return _storage_extras(_connection(settings.storage_connection, _STORAGE))


async def aconnection_storage_options(settings: PipelineSettings) -> dict[str, str]:
    """:func:`connection_storage_options` for a trigger, in the triggerer's event loop."""
    if not settings.storage_connection:
        return {}
    return _storage_extras(await _aconnection(settings.storage_connection, _STORAGE))


_STORAGE = ("storage_connection", "with the storage options (credentials) as its extras")
_KAFKA = (
    "kafka_connection",
    '(type kafka) with the librdkafka settings as its extras, e.g. {"bootstrap.servers": '
    '"broker:9092"}',
)
_REGISTRY = (
    "schema_registry_connection",
    "with the registry API's URL as its host (its login and password: basic credentials; its "
    'extras: more client settings), e.g. {"conn_type": "http", "host": "http://registry:8081"}',
)


def _connection(conn_id: str, what: tuple[str, str]) -> Any:
    """The Connection ``conn_id``; a ConfigError naming the setting when it is undefined."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException as exc:
        raise _undefined(conn_id, what) from exc


async def _aconnection(conn_id: str, what: tuple[str, str]) -> Any:
    """:func:`_connection` in the triggerer's event loop."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return await BaseHook.aget_connection(conn_id)
    except AirflowNotFoundException as exc:
        raise _undefined(conn_id, what) from exc


def _undefined(conn_id: str, what: tuple[str, str]) -> ConfigError:
    setting, how = what
    return ConfigError(f"{setting}: Airflow connection {conn_id!r} is not defined; define it {how}")


def _storage_extras(connection: Any) -> dict[str, str]:
    extras = connection.extra_dejson
    if not isinstance(extras, dict) or not extras:
        raise ConfigError(
            f"storage_connection: Airflow connection {connection.conn_id!r} has no extras; its "
            'extras are the storage options, e.g. {"AWS_REGION": "eu-west-1"}'
        )
    return {str(key): str(value) for key, value in extras.items()}


def connection_storage_environment(settings: PipelineSettings) -> dict[str, str]:
    """The environment of a child process (spark-submit) that hands it the tables' storage
    options (:func:`connection_storage_options`) as ``MODESWITCH_STORAGE_OPTIONS``."""
    return storage_environment(connection_storage_options(settings))


def connection_kafka_config(settings: PipelineSettings) -> dict[str, str] | None:
    """A Kafka source's client configuration: the extras of the Airflow Connection named by
    the ``kafka_connection`` setting (the Kafka provider's connection type keeps librdkafka
    settings there). None for any other source. Never logged."""
    if not log_type(settings.source).client_config:
        return None
    return _kafka_extras(_connection(settings.kafka_connection, _KAFKA))


async def aconnection_kafka_config(settings: PipelineSettings) -> dict[str, str] | None:
    """:func:`connection_kafka_config` for a trigger, in the triggerer's event loop."""
    if not log_type(settings.source).client_config:
        return None
    return _kafka_extras(await _aconnection(settings.kafka_connection, _KAFKA))


def _kafka_extras(connection: Any) -> dict[str, str]:
    extras = connection.extra_dejson
    if not isinstance(extras, dict) or not extras.get("bootstrap.servers"):
        raise ConfigError(
            f"kafka_connection: Airflow connection {connection.conn_id!r} has no "
            "bootstrap.servers in its extras; its extras are librdkafka settings, e.g. "
            '{"bootstrap.servers": "broker:9092"}'
        )
    return {str(key): str(value) for key, value in extras.items()}


def source_credentials(settings: PipelineSettings) -> contextlib.AbstractContextManager:
    """The block in which this process opens ``settings.source`` with the credentials of its
    Connection (a Kafka source); nothing for other sources."""
    from modeswitch.sources.kafka import kafka_config_scope

    return kafka_config_scope(connection_kafka_config(settings))


def connection_kafka_environment(settings: PipelineSettings) -> dict[str, str]:
    """The environment of a child process (spark-submit) that hands it a Kafka source's client
    configuration as ``MODESWITCH_KAFKA_CONFIG`` (``{}`` for other sources)."""
    from modeswitch.sources.kafka import kafka_environment

    return kafka_environment(connection_kafka_config(settings) or {})


def connection_registry_config(settings: PipelineSettings) -> dict[str, str] | None:
    """The schema registry's client settings for a payload whose values or keys are framed by
    a registry (:func:`registry_config_from_connection` of the Connection named by the
    ``schema_registry_connection`` setting). None for any other payload, whose jobs never ask a
    registry: no Connection is looked up then. Never logged."""
    sources = settings.describe_payload().schema_sources.values()
    if not any(source.framed for source in sources):
        return None
    connection = _connection(settings.payload.schema_registry_connection, _REGISTRY)
    return registry_config_from_connection(connection)


_WEB_SCHEMES = ("http", "https")


def registry_config_from_connection(connection: Any) -> dict[str, str]:
    """Confluent's registry client settings from an Airflow Connection: its host (with its
    schema and port) the ``url``, its login and password basic credentials (``USER_INFO``), its
    extras further client settings, which win (a ``url`` there too). A ConfigError names the
    setting and the Connection, never a credential, when it gives no URL."""
    extras = connection.extra_dejson
    if not isinstance(extras, dict):
        raise ConfigError(
            f"schema_registry_connection: Airflow connection {connection.conn_id!r}: its extras "
            "are not a JSON object of client settings",
            setting="schema_registry_connection",
        )
    config: dict[str, str] = {}
    if (connection.host or "").strip():
        config["url"] = _registry_url(connection)
    if connection.login or connection.password:
        config["basic.auth.credentials.source"] = "USER_INFO"
        config["basic.auth.user.info"] = f"{connection.login or ''}:{connection.password or ''}"
    config.update({str(key): str(value) for key, value in extras.items()})
    if not config.get("url"):
        raise ConfigError(
            f"schema_registry_connection: Airflow connection {connection.conn_id!r} has no host "
            "and no url in its extras; its host is the registry API's URL, e.g. "
            "http://registry:8081",
            setting="schema_registry_connection",
        )
    return config


def _registry_url(connection: Any) -> str:
    """The registry's URL from the Connection's host: as it is when it holds a scheme (``://``),
    else ``<scheme>://<host>`` with the schema as the scheme when it is http or https (the HTTP
    provider's way), else the schema as the URL's path (what Airflow makes of a URI's path) and
    the scheme the connection type's (a URI's own scheme) or http; the port added unless the
    host names one. Errors never repeat the host, which may hold credentials."""
    host = connection.host.strip()
    schema = (connection.schema or "").strip().strip("/")
    if "://" in host:
        url = host
    elif schema.lower() in _WEB_SCHEMES:
        url = f"{schema.lower()}://{host}"
    else:
        kind = (connection.conn_type or "").lower()
        scheme = kind if kind in _WEB_SCHEMES else "http"
        url = f"{scheme}://{host}" + (f"/{schema}" if schema else "")
    if not connection.port:
        return url
    parts = urlsplit(url)
    try:
        named = parts.port
    except ValueError as exc:
        raise ConfigError(
            f"schema_registry_connection: Airflow connection {connection.conn_id!r}: its host "
            "names a port that is not a number",
            setting="schema_registry_connection",
        ) from exc
    if named is None:
        return urlunsplit(parts._replace(netloc=f"{parts.netloc}:{connection.port}"))
    if named != int(connection.port):
        raise ConfigError(
            f"schema_registry_connection: Airflow connection {connection.conn_id!r}: its host "
            f"names port {named} and its port is {connection.port}; keep one",
            setting="schema_registry_connection",
        )
    return url


def connection_registry_environment(settings: PipelineSettings) -> dict[str, str]:
    """The environment of a child process (spark-submit) that hands it the registry's client
    settings (:func:`connection_registry_config`) as ``MODESWITCH_SCHEMA_REGISTRY_CONFIG``
    (``{}`` for a payload not framed by a registry)."""
    from modeswitch.sources.schema_registry import registry_environment

    return registry_environment(connection_registry_config(settings) or {})
