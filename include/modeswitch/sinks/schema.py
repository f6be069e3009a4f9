"""The sink table's schema: additive changes only, checked before anything is written."""

from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow as pa

from modeswitch.errors import SchemaMismatchError
from modeswitch.sinks.options import DeltaSinkOptions

log = logging.getLogger(__name__)


def delta_schema(schema: pa.Schema) -> Any:
    """``schema`` as a ``deltalake`` schema, to create a table with."""
    from deltalake import Schema

    return Schema.from_arrow(schema)


SCHEMA_CHANGE_METADATA_KEY = "modeswitch_schema_change"
"""The ``commitInfo`` key of a schema change: on the commit that adds the columns and on the
pipeline's commit that first holds them, the pipeline, the epoch and each added column with
its type (:func:`schema_change_metadata`)."""


def merge_schema(
    table: Any, incoming: pa.Schema, options: DeltaSinkOptions
) -> tuple[pa.Schema, dict[str, str]]:
    """The schema to commit with: the table's, plus new columns when mergeSchema is set, which
    are added now, in a commit of their own; and the commit metadata that records the change
    (empty for none)."""
    from deltalake import CommitProperties, Field

    current = pa.schema(table.schema().to_arrow())
    added = check_additive(current, incoming, options)
    if not added:
        return current, {}
    fields = [incoming.field(n) for n in added]
    change = schema_change_metadata(options, fields)
    table.alter.add_columns(
        [Field.from_arrow(f) for f in fields],
        commit_properties=CommitProperties(custom_metadata=change, max_commit_retries=0),
    )
    log.info("sink %s: added columns %s", options.path, ", ".join(added))
    return pa.schema(list(current) + fields), change


def schema_change_metadata(options: DeltaSinkOptions, added: list[pa.Field]) -> dict[str, str]:
    """The commit metadata of columns ``added`` to the sink (:data:`SCHEMA_CHANGE_METADATA_KEY`)."""
    body = {
        "pipeline": options.pipeline,
        "epoch": options.epoch,
        "added": {field.name: str(field.type) for field in added},
    }
    return {SCHEMA_CHANGE_METADATA_KEY: json.dumps(body, separators=(",", ":"))}


def check_additive(current: pa.Schema, incoming: pa.Schema, options: DeltaSinkOptions) -> list[str]:
    """Refuse type changes, and new columns unless mergeSchema; return the new columns."""
    added, changed = schema_changes(current, incoming)
    if changed:
        source = f" as {options.columns_from} has them" if options.columns_from else ""
        raise SchemaMismatchError(
            f"sink {options.path}: columns would change type{source}: "
            + ", ".join(f"{n} ({old} in the table, {new} now)" for n, old, new in changed)
            + "; a Delta table's columns are only added to, never retyped, so nothing was "
            "written: keep the type in the payload's schema, read it as the table's version "
            "(value_schema_version), or write to a new sink"
        )
    if added and not options.merge_schema:
        raise SchemaMismatchError(
            f"sink {options.path}: new columns {', '.join(added)} are not in the table, and "
            "on_schema_change is not 'evolve' (the sink's option mergeSchema=true); set it to "
            "evolve to add them, or read the payload as the table's columns (value_schema, "
            "value_schema_version)"
        )
    return added


def schema_changes(
    current: pa.Schema, incoming: pa.Schema
) -> tuple[list[str], list[tuple[str, str, str]]]:
    """New column names, and ``(name, old type, new type)`` for columns whose type changed."""
    existing = {f.name: f.type for f in current}
    added = [f.name for f in incoming if f.name not in existing]
    changed = [
        (f.name, str(existing[f.name]), str(f.type))
        for f in incoming
        if f.name in existing and not _same_type(existing[f.name], f.type)
    ]
    return added, changed


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    def norm(t: pa.DataType) -> pa.DataType:
        if pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return pa.string()
        if pa.types.is_timestamp(t):
            return pa.timestamp("us", "UTC" if t.tz else None)
        return t

    return norm(a).equals(norm(b))


def check_schema_before_write(options: DeltaSinkOptions, schema: pa.Schema) -> None:
    """Refuse a write whose columns the table cannot take, before any file is written."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    missing = [c for c in options.partition_by if c not in schema.names]
    if missing:
        raise ValueError(
            f"option partitionBy={','.join(options.partition_by)!r}: no column "
            f"{', '.join(missing)} in the data"
        )
    try:
        table = DeltaTable(options.path, storage_options=options.storage_options)
    except TableNotFoundError:
        return
    check_additive(pa.schema(table.schema().to_arrow()), schema, options)
    existing = table.metadata().partition_columns
    if existing and list(options.partition_by) != list(existing):
        raise ValueError(
            f"option partitionBy={','.join(options.partition_by)!r}: the table is "
            f"partitioned by {','.join(existing)!r}"
        )
