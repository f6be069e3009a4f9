"""What a job learns of the schema ids its values name, the same for every registry-framed
payload (Avro's, :mod:`modeswitch.transforms.avro`; Protobuf's,
:mod:`modeswitch.transforms.protobuf`).

A value naming a schema id the job did not know stops the job's run before it commits anything
of its wave or micro-batch (:class:`~modeswitch.errors.UnknownSchemaIdError`, raised in the
task by either form of either decoder, its message :func:`unknown_id_template`'s). The driver
asks the registry what the id is (:func:`learn_schema_id`) and the job is resolved again
(:func:`modeswitch.runners.jobs.run`) with what it learned (:class:`SchemaIdsSeen`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from modeswitch.control.payload_settings import SchemaSource
from modeswitch.errors import SchemaChangedError


def unknown_id_template(subject: str, version: int, column: str = "value") -> str:
    """The message of a value (or a key, ``column``) naming an id the job does not know
    (``{schema_id}``, ``{bucket}`` and ``{offset}`` to fill), in every form; :func:`unknown_id`
    reads it back."""
    quoted = repr(subject).replace("{", "{{").replace("}", "}}")
    return (
        f"unknown schema id {{schema_id}} in a {column} of subject {quoted} at bucket "
        f"{{bucket}} offset {{offset}}: this job reads as version {version}"
    )


@dataclass(frozen=True)
class SchemaIdsSeen:
    """What a job's earlier runs learned of the schema ids its values name
    (:func:`learn_schema_id`): ids the registry does not list under the subject (their values
    are quarantined), and the version to go on reading as (``on_schema_change = quarantine``;
    None: the settings' version)."""

    foreign: frozenset[int] = frozenset()
    read_as: int | None = None


SeenByColumn = Mapping[str, SchemaIdsSeen]
"""What a job learned of each decoded column's ids (``value``, ``key``)."""

_UNKNOWN = re.compile(
    r"unknown schema id (\d+) in a (value|key) of subject .*reads as version (\d+)"
)


class UnknownId(NamedTuple):
    """What an :class:`UnknownSchemaIdError`'s message names (:func:`unknown_id`)."""

    schema_id: int
    read_as: int
    """The version the job reads as."""
    column: str
    """The record's column whose schema id it is: ``value`` or ``key``."""


def unknown_id(message: str) -> UnknownId | None:
    """The schema id, the job's version and the column an :class:`UnknownSchemaIdError`'s
    ``message`` (:func:`unknown_id_template`) names, or None for another text."""
    found = _UNKNOWN.search(message)
    return None if found is None else UnknownId(int(found[1]), int(found[3]), found[2])


@dataclass(frozen=True)
class SchemaIdLearned:
    """What :func:`learn_schema_id` found: what the job run again knows, and in words."""

    seen: SchemaIdsSeen
    said: str
    """A sentence for the job's log and the decision log: the id, what it is, what the job
    does with it."""
    schema_id: int
    version: int | None
    """The subject's version the id is (None: foreign to the subject)."""


def learn_schema_id(message: str, source: SchemaSource, seen: SchemaIdsSeen) -> SchemaIdLearned:
    """What the job run again knows after a value named a schema id it did not
    (``message``: an :class:`UnknownSchemaIdError`'s, from either form), asked of the registry
    on the driver: an id foreign to the subject is remembered (its values quarantined with that
    reason); a version registered since the job began is read as it is (``evolve``: the job
    resolved again reads the newest version, or the pinned one, and its commit adds the new
    columns), read as the job's version (``quarantine``), or stops the job
    (``fail``: :class:`SchemaChangedError`)."""
    from modeswitch.sources.schema_registry import find_schema_id

    found = unknown_id(message)
    if found is None:
        raise ValueError(f"not an unknown schema id's message: {message!r}")
    schema_id, read_as, column = found
    registered = find_schema_id(schema_id, source.subject)
    subject = repr(source.subject)
    if registered is None:
        return SchemaIdLearned(
            replace(seen, foreign=seen.foreign | {schema_id}),
            f"schema id {schema_id} is not a version of subject {subject}: its {column}s are "
            "quarantined",
            schema_id,
            None,
        )
    version = registered[0]
    what = (
        f"schema id {schema_id} is version {version} of {subject}, registered after the job began"
    )
    if source.on_schema_change == "fail":
        raise SchemaChangedError(
            f"{message}: {what}; on_schema_change = fail: nothing of this wave or micro-batch "
            "is committed, and the job stops until the settings say what to read as "
            f"({source.column}_schema_version, or on_schema_change = evolve or quarantine)"
        )
    if source.on_schema_change == "quarantine":
        return SchemaIdLearned(
            replace(seen, read_as=read_as),
            f"{what}: its {column}s are read as version {read_as} (on_schema_change = quarantine)",
            schema_id,
            version,
        )
    return SchemaIdLearned(
        seen,
        f"{what}: the job reads the subject again and adds the new columns "
        "(on_schema_change = evolve)",
        schema_id,
        version,
    )


def read_as_seen(
    source: SchemaSource, seen: SchemaIdsSeen | None, *, kind: str
) -> tuple[Any, dict[str, Any]]:
    """The subject of ``source`` read now, at the version the job goes on reading as (the
    settings', or what ``seen`` learned), as a ``kind`` schema; and the decoder's keywords that
    name it (subject, version, the ids found foreign, the words)."""
    from modeswitch.sources.schema_registry import read_subject

    seen = seen or SchemaIdsSeen()
    version = source.version if seen.read_as is None else seen.read_as
    subject = read_subject(source.subject, version, kind=kind, column=source.column)
    return subject, {
        "subject": subject.subject,
        "version": subject.version,
        "foreign": seen.foreign,
        "what": f"version {subject.version} of subject {subject.subject!r} at {subject.registry}",
    }


__all__ = [
    "SchemaIdLearned",
    "SchemaIdsSeen",
    "SeenByColumn",
    "UnknownId",
    "learn_schema_id",
    "read_as_seen",
    "unknown_id",
    "unknown_id_template",
]
