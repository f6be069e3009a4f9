"""What format a pipeline's record values are in, and where their schema comes from: the
``payload`` settings group (:class:`PayloadSettings`) and :func:`describe_format`, which reads it
with the other payload settings into what the transform is built from.

- ``value_format = json`` (the default with ``value_schema`` set): each value is JSON text,
  parsed into ``value_schema``'s columns (:mod:`modeswitch.control.value_schema`).
- ``raw`` (the default without one): the records land as they are.
- ``avro``: each value is Avro binary; its columns are the top-level fields of the Avro
  *reader* schema (:mod:`modeswitch.transforms.avro`).
- ``protobuf``: each value is a Protobuf message, ``value_message`` (by default the schema's
  first); its columns are the message's fields (:mod:`modeswitch.transforms.protobuf`).

A binary format's schema is either a schema file (``value_schema_file``: an ``.avsc``, or a
``.proto`` or a descriptor set; every value is the bare body, written with that schema), or a
schema registry's: every value is framed as registry clients write it (a zero magic byte, then
the 4-byte big-endian id of the schema it was written with, for Protobuf the message indexes,
then the body), each value is decoded with the schema it names (its *writer* schema) and read
as the reader schema: version ``value_schema_version`` (``latest`` by default: the newest when
the job starts) of the subject ``value_subject`` (by default ``<topic>-value``, the topic-name
strategy of a ``kafka://<topic>`` source). So values written before and after a compatible
change of the subject land in one table. The registry's address and credentials are never a
  setting: ``MODESWITCH_SCHEMA_REGISTRY_CONFIG`` outside Airflow, the
  ``schema_registry_connection`` Connection under it.

``on_schema_change`` says what a job does with a value written with a schema newer than the one
it reads as (a version registered after it started): ``evolve`` (the default) and ``fail`` stop
the job before it commits that value (the next epoch reads the new version, and with ``evolve``
the sink adds its new columns to the table in that epoch's commit, Delta's schema evolution);
``quarantine`` quarantines such values and goes on.

The key is read alike with ``key_format = avro`` or ``protobuf`` (:func:`describe_key`): from
``key_schema_file``, or from the registry's subject ``key_subject`` (``<topic>-key`` by
default) at ``key_schema_version`` (its newest when the job starts by default), under the same
``on_schema_change``. Its
fields become columns named ``key_<field>``; the ``key`` column stays as the source gave it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, get_args

from modeswitch.control.flat_settings import FlatSettings
from modeswitch.control.locations import KafkaLocation, is_kafka_source, record_columns
from modeswitch.control.values import check_settings, parse_choice, parse_text, setting
from modeswitch.errors import ConfigError

ValueFormat = Literal["auto", "json", "avro", "protobuf", "raw"]
KeyFormat = Literal["text", "avro", "protobuf"]
KEY_PREFIX = "key_"
"""What a decoded key's columns are named with before its fields' names (``key_id``)."""
OnSchemaChange = Literal["evolve", "quarantine", "fail"]
VALUE_FORMATS: tuple[str, ...] = get_args(ValueFormat)
ON_SCHEMA_CHANGE: tuple[str, ...] = get_args(OnSchemaChange)
BINARY_FORMATS = ("avro", "protobuf")
"""The formats whose values are decoded with a schema (a file's or a registry's)."""
LATEST = "latest"
"""``value_schema_version``'s word for the subject's newest version when the job starts."""


def _version_rule(value: str) -> str | None:
    if value == LATEST or (value.isdigit() and int(value) > 0):
        return None
    return f"is neither {LATEST!r} nor a version number (1, 2, ...)"


@dataclass(frozen=True, kw_only=True)
class PayloadSettings(FlatSettings):
    """The record values' format and schema source (module docstring)."""

    settings_kind: ClassVar[str] = "payload"

    value_format: ValueFormat = setting(
        "auto",
        parse=parse_choice,
        doc="what each record's `value` is: `json` (text, parsed into `value_schema`'s columns), "
        "`avro` or `protobuf` (binary, parsed into its schema's top-level fields: "
        "`value_schema_file`'s, or a schema registry's, each value framed with its schema id), "
        "`raw` (landed as it is); `auto`: `json` with `value_schema` set, else `raw` "
        "([KAFKA.md](KAFKA.md#your-topic))",
    )
    value_schema_file: str = setting(
        "",
        parse=parse_text,
        doc="with `value_format = avro` or `protobuf`: the schema file the values were written "
        "with (an `.avsc`; a `.proto`, or a descriptor set from `protoc --include_imports "
        "--descriptor_set_out`), each value the bare body (no registry framing); empty: the "
        "schema registry's",
    )
    value_message: str = setting(
        "",
        parse=parse_text,
        shown="the schema's first",
        doc="with `value_format = protobuf`: the message every value is, by its full name "
        "(`package.Message`); empty: the first message of the schema file, or of the "
        "registry's version read as (values framed as another message are quarantined)",
    )
    value_subject: str = setting(
        "",
        parse=parse_text,
        shown="<topic>-value",
        doc="with a binary `value_format` and a registry: the subject whose versions the values "
        "are written with (the topic-name strategy by default; a source that is not a Kafka "
        "topic needs it)",
    )
    value_schema_version: str = setting(
        LATEST,
        parse=parse_text,
        rule=_version_rule,
        doc="with a registry: the subject's version every value is read as (values written with "
        "another version are resolved to it: Avro's rules, Protobuf's field numbers); "
        "`latest`: its newest when the job starts",
    )
    on_schema_change: OnSchemaChange = setting(
        "evolve",
        parse=parse_choice,
        doc="a value written with a newer version of the subject than the job reads as: "
        "`evolve` stops the job before committing it and the next epoch reads the new "
        "version, adding its new columns to the sink table (Delta schema evolution); `fail` "
        "stops it too, and the sink refuses new columns; `quarantine` quarantines such values",
    )
    schema_registry_connection: str = setting(
        "schema_registry_default",
        parse=parse_text,
        doc="Connection of the schema registry (its host is the API's URL, its login and "
        "password basic credentials, its extras more client settings); outside Airflow "
        "`MODESWITCH_SCHEMA_REGISTRY_CONFIG`",
    )

    key_format: KeyFormat = setting(
        "text",
        parse=parse_choice,
        doc="what each record's `key` is: `text` lands it as the `key` column (its UTF-8 text); "
        "`avro` or `protobuf` decodes it too, into a column per field of its schema named "
        "`key_<field>` (`key_schema_file`'s, or the registry's subject `key_subject`, each key "
        "framed with its schema id, read as the subject's newest version when the job starts); "
        "a key that does not decode is quarantined, a null key gives nulls "
        "([KAFKA.md](KAFKA.md#keys))",
    )
    key_schema_file: str = setting(
        "",
        parse=parse_text,
        doc="with `key_format = avro` or `protobuf`: the schema file the keys were written with, "
        "each key the bare body; empty: the schema registry's",
    )
    key_message: str = setting(
        "",
        parse=parse_text,
        shown="the schema's first",
        doc="with `key_format = protobuf`: the message every key is, by its full name",
    )
    key_subject: str = setting(
        "",
        parse=parse_text,
        shown="<topic>-key",
        doc="with a binary `key_format` and a registry: the subject the keys are written with",
    )
    key_schema_version: str = setting(
        LATEST,
        parse=parse_text,
        rule=_version_rule,
        doc="with a binary `key_format` and a registry: the subject's version every key is read "
        "as; `latest`: its newest when the job starts",
    )

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True)
class SchemaSource:
    """Where a binary payload's schemas come from (module docstring): a file, or a registry's
    subject at a version (None: the latest when the job starts); for Protobuf, the message
    (empty: the schema's first)."""

    format: str = "avro"
    schema_file: str = ""
    subject: str = ""
    version: int | None = None
    message: str = ""
    on_schema_change: str = "evolve"
    record_columns: tuple[str, ...] = ()
    """The columns the source's records have beyond every log's
    (:func:`~modeswitch.control.locations.record_columns`), which no field may be named as."""
    column: str = "value"
    """The record's column it decodes: ``value``, or ``key`` (its columns then named
    :data:`KEY_PREFIX` and the field's name)."""

    @property
    def prefix(self) -> str:
        """What its columns' names start with (:func:`column_prefix`)."""
        return column_prefix(self.column)

    @property
    def framed(self) -> bool:
        """Whether every value carries the registry's framing (magic byte and schema id)."""
        return not self.schema_file


def column_prefix(column: str) -> str:
    """What the columns decoded from a record's ``column`` are named with before their fields'
    names: nothing for the value's, :data:`KEY_PREFIX` for the key's."""
    return {"value": "", "key": KEY_PREFIX}[column]


def describe_format(
    payload: PayloadSettings, *, value_schema: str, source: str
) -> tuple[str, SchemaSource | None]:
    """The values' format (``json``, ``avro``, ``protobuf`` or ``raw``) and, for a binary
    format, where its schema comes from, from the ``payload`` group, ``value_schema`` and
    ``source``. Raises :class:`ConfigError` naming the setting for settings that cannot go
    together: ``json`` without ``value_schema``; another format with one; ``value_schema_file``,
    ``value_subject`` or a pinned version without a binary format, ``value_message`` without
    ``protobuf``; a schema file beside a subject or a version; a registry without a subject to
    read (a source that is not a Kafka topic)."""
    fmt = payload.value_format
    has_ddl = isinstance(value_schema, str) and bool(value_schema.strip())
    if fmt == "auto":
        fmt = "json" if has_ddl else "raw"
    if fmt == "json" and not has_ddl:
        raise ConfigError(
            "value_format: 'json' parses each value into value_schema's columns, and "
            "value_schema is empty; state the payload there, or set value_format to 'raw' to "
            "land the records as they are",
            setting="value_format",
        )
    if fmt != "json" and has_ddl:
        raise ConfigError(
            f"value_schema: {value_schema!r} is set, and value_format is {fmt!r}"
            + (", whose columns are its schema's" if fmt in BINARY_FORMATS else "")
            + "; leave value_schema empty, or set value_format to 'json'",
            setting="value_schema",
        )
    _check_read_with(payload, "value", fmt)
    if fmt not in BINARY_FORMATS:
        return fmt, None
    version = None if payload.value_schema_version == LATEST else payload.value_schema_version
    return fmt, _schema_source(payload, "value", fmt, source, version)


def describe_key(payload: PayloadSettings, *, source: str) -> SchemaSource | None:
    """Where the keys' schemas come from with a binary ``key_format`` (None for ``text``: the
    key lands as text only). Raises :class:`ConfigError` naming the setting, as
    :func:`describe_format` does for the values: ``key_schema_file``, ``key_subject`` or
    ``key_message`` or a pinned ``key_schema_version`` set for a format that does not read them,
    a schema file beside a subject or a version, a registry without a subject to read."""
    fmt = payload.key_format
    _check_read_with(payload, "key", fmt)
    if fmt not in BINARY_FORMATS:
        return None
    version = None if payload.key_schema_version == LATEST else payload.key_schema_version
    return _schema_source(payload, "key", fmt, source, version)


def _check_read_with(payload: PayloadSettings, column: str, fmt: str) -> None:
    """Refuses, naming it, a ``<column>_schema_file``, ``_subject``, ``_message`` or pinned
    ``_schema_version`` set for a ``<column>_format`` (``fmt``) that does not read it."""
    for part, formats, unset in (
        ("schema_file", BINARY_FORMATS, ""),
        ("subject", BINARY_FORMATS, ""),
        ("message", ("protobuf",), ""),
        ("schema_version", BINARY_FORMATS, LATEST),
    ):
        name = f"{column}_{part}"
        value = getattr(payload, name)
        if value != unset and fmt not in formats:
            leave = f"leave {name} at {unset!r}" if unset else f"leave {name} empty"
            raise ConfigError(
                f"{name}: {value!r} is set, and {column}_format is {fmt!r}; it is read with "
                f"{column}_format {' or '.join(map(repr, formats))} only: set the format, or "
                f"{leave}",
                setting=name,
            )


def _schema_source(
    payload: PayloadSettings, column: str, fmt: str, source: str, version: str | None
) -> SchemaSource:
    """The :class:`SchemaSource` of ``column``'s ``<column>_*`` settings (``version``: the
    pinned one, None for the newest)."""
    schema_file = getattr(payload, f"{column}_schema_file")
    subject = getattr(payload, f"{column}_subject")
    common = {
        "format": fmt,
        "message": getattr(payload, f"{column}_message"),
        "on_schema_change": payload.on_schema_change,
        "record_columns": record_columns(source),
        "column": column,
    }
    if schema_file:
        for name, value in ((f"{column}_subject", subject), (f"{column}_schema_version", version)):
            if value:
                raise ConfigError(
                    f"{name}: {value!r} names a registry's schema, and {column}_schema_file "
                    f"{schema_file!r} is the schema: keep one",
                    setting=name,
                )
        return SchemaSource(schema_file=schema_file, **common)
    if not subject:
        if not is_kafka_source(source):
            raise ConfigError(
                f"{column}_subject: empty, and source {source!r} is not a Kafka topic whose "
                f"name gives one (<topic>-{column}); name the registry's subject, or the schema "
                f"file in {column}_schema_file",
                setting=f"{column}_subject",
            )
        subject = f"{KafkaLocation.parse(source).topic}-{column}"
    return SchemaSource(
        subject=subject, version=None if version is None else int(version), **common
    )


__all__ = [
    "BINARY_FORMATS",
    "KEY_PREFIX",
    "LATEST",
    "ON_SCHEMA_CHANGE",
    "VALUE_FORMATS",
    "PayloadSettings",
    "SchemaSource",
    "column_prefix",
    "describe_format",
    "describe_key",
]
