"""A schema registry's subject, read once per job: the schemas a registry-framed payload's values
name, through Confluent's client (``confluent_kafka.schema_registry``) on the Confluent Schema
Registry API (which Apicurio Registry's ``/apis/ccompat/v7`` serves too).

The client's configuration (``url``, ``basic.auth.user.info``, ``bearer.auth.*``, ...: the
client's own settings) comes from ``MODESWITCH_SCHEMA_REGISTRY_CONFIG`` (a JSON object: under
Airflow the tasks set it in spark-submit's environment from the ``schema_registry_connection``
Connection, :func:`modeswitch.airflow.settings.connection_registry_environment`). Like a Kafka
source's, it is never a setting, an option, a command line or a log line; a message names the
registry by its URL alone.

:func:`read_subject` asks the registry, when a job starts, for every version of the subject
(each one's schema id and schema) and picks the one the job reads as: the settings' version, or
the newest. :func:`find_schema_id` asks it, on the driver, about a schema id a value names that
the job did not know (:func:`modeswitch.transforms.schema_ids.learn_schema_id`): a version of the
subject registered since the job began, or a schema that is not one of the subject's. No Spark
task asks the registry.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from modeswitch.environment import SCHEMA_REGISTRY_CONFIG, env_value
from modeswitch.errors import ConfigError, ModeswitchError


def registry_config(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The registry client's settings in force: ``MODESWITCH_SCHEMA_REGISTRY_CONFIG``'s (no
    in-process task reads the registry, so no scope of the Kafka configuration's kind)."""
    return env_value(SCHEMA_REGISTRY_CONFIG, environ)


def registry_environment(config: Mapping[str, str]) -> dict[str, str]:
    """The environment that hands ``config`` to a child process (empty for none)."""
    return {SCHEMA_REGISTRY_CONFIG.name: json.dumps(dict(config))} if config else {}


def registry_name(config: Mapping[str, str]) -> str:
    """How a message names the registry: its URL without credentials or query."""
    parts = urlsplit(str(config.get("url", "")).split(",")[0])
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}" if host else "(no url)"


@functools.lru_cache(maxsize=4)
def _client(frozen: tuple[tuple[str, str], ...]) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient(dict(frozen))


def registry_client(config: Mapping[str, str] | None = None) -> Any:
    """A Confluent registry client of ``config`` (by default :func:`registry_config`), one per
    configuration in a process. Refuses, naming the variable and the Connection, a configuration
    without a ``url``."""
    config = registry_config() if config is None else dict(config)
    if not config.get("url"):
        raise ConfigError(
            f"schema registry: no url in {SCHEMA_REGISTRY_CONFIG.name} (outside Airflow) or in "
            "the schema_registry_connection Connection (under it); an Avro payload framed by a "
            "registry needs its address, e.g. "
            f'{SCHEMA_REGISTRY_CONFIG.name}=\'{{"url": "http://registry:8081"}}\'',
            setting="schema_registry_connection",
        )
    return _client(tuple(sorted((str(k), str(v)) for k, v in config.items())))


@dataclass(frozen=True)
class SubjectSchemas:
    """A subject as a job reads it: the version it reads every value as, and the schema of each
    of the subject's versions by schema id, as registered when the job started."""

    subject: str
    registry: str
    """The registry's URL (:func:`registry_name`)."""
    version: int
    """The version the job reads as."""
    writers: Mapping[int, tuple[int, str]]
    """Schema id -> (version, the schema's text), for every version of the subject."""
    imports: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    """Schema id -> the schemas it refers to (a Protobuf schema's imports), by import name,
    with theirs (empty for Avro, whose references are refused)."""

    @property
    def reader_id(self) -> int:
        return next(i for i, (v, _) in self.writers.items() if v == self.version)

    @property
    def reader(self) -> str:
        return self.writers[self.reader_id][1]


def read_subject(
    subject: str,
    version: int | None,
    config: Mapping[str, str] | None = None,
    *,
    kind: str = "AVRO",
    column: str = "value",
) -> SubjectSchemas:
    """Every version of ``subject`` and the one to read as (``version``, or the newest when
    None), each a ``kind`` schema (``AVRO`` or ``PROTOBUF``, whose references are read too).
    Raises :class:`ConfigError` naming the subject, the registry and the ``column``'s setting
    (``<column>_subject``, ``<column>_schema_version``) when the subject or the version is not
    there, or a version is of another kind or (Avro) refers to others; a
    :class:`ModeswitchError` when the registry cannot be asked."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    config = registry_config() if config is None else dict(config)
    client = registry_client(config)
    where = registry_name(config)
    try:
        versions = client.get_versions(subject)
        registered = [client.get_version(subject, number) for number in versions]
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:
            raise ConfigError(
                f"{column}_subject: subject {subject!r} is not in the schema registry at "
                f"{where}; register its schema, or name another subject",
                setting=f"{column}_subject",
            ) from exc
        raise ModeswitchError(f"schema registry at {where}: subject {subject!r}: {exc}") from exc
    except Exception as exc:  # connection refused, timeouts: the client's own errors
        raise ModeswitchError(f"schema registry at {where}: subject {subject!r}: {exc}") from exc
    writers: dict[int, tuple[int, str]] = {}
    imports: dict[int, dict[str, str]] = {}
    for entry in registered:
        schema = entry.schema
        found = (schema.schema_type or "AVRO").upper()
        if found != kind or (kind == "AVRO" and schema.references):
            what = f"a {found} schema" if found != kind else "an Avro schema with references"
            raise ConfigError(
                f"{column}_subject: version {entry.version} of subject {subject!r} (schema id "
                f"{entry.schema_id}) at {where} is {what}; {column}_format {kind.lower()!r} "
                f"reads {kind} schemas" + (" without references" if kind == "AVRO" else ""),
                setting=f"{column}_subject",
            )
        writers[int(entry.schema_id)] = (int(entry.version), schema.schema_str)
        imports[int(entry.schema_id)] = _referenced(client, schema.references or [], where)
    chosen = max(v for v, _ in writers.values()) if version is None else version
    if chosen not in {v for v, _ in writers.values()}:
        raise ConfigError(
            f"{column}_schema_version: {version} is not a version of subject {subject!r} at "
            f"{where} (its versions: {', '.join(str(v) for v in sorted(versions))})",
            setting=f"{column}_schema_version",
        )
    return SubjectSchemas(subject, where, chosen, writers, imports)


def _referenced(client: Any, references: list[Any], where: str) -> dict[str, str]:
    """The schemas ``references`` name, by import name, with those they refer to in turn."""
    files: dict[str, str] = {}
    pending = list(references)
    while pending:
        reference = pending.pop()
        if reference.name in files:
            continue
        try:
            entry = client.get_version(reference.subject, reference.version)
        except Exception as exc:
            raise ModeswitchError(
                f"schema registry at {where}: reference {reference.name!r} (version "
                f"{reference.version} of subject {reference.subject!r}): {exc}"
            ) from exc
        files[reference.name] = entry.schema.schema_str
        pending.extend(entry.schema.references or [])
    return files


def find_schema_id(schema_id: int, subject: str) -> tuple[int, str] | None:
    """The version of ``subject`` registered with ``schema_id`` and its schema, asked of the
    registry now (a value naming an id the job did not know), or None when the id is not one of
    the subject's versions."""
    client = registry_client()
    for number in client.get_versions(subject):
        entry = client.get_version(subject, number)
        if int(entry.schema_id) == schema_id:
            return int(entry.version), entry.schema.schema_str
    return None


__all__ = [
    "SubjectSchemas",
    "find_schema_id",
    "read_subject",
    "registry_client",
    "registry_config",
    "registry_environment",
    "registry_name",
]
