"""The Delta table features the pipeline writes with, and a refusal of the others.

The pipeline creates its tables at the plainest protocol, reader version 1 and writer version
2, with no table feature, so delta-spark, delta-rs and ClickHouse all open them. A team may
change a table's properties later (``ALTER TABLE ... SET TBLPROPERTIES``), which can add
features to its protocol. Its own writes are Parquet files it writes itself, added to the log
by one commit, and it reads the tables with delta-rs; so it keeps writing only beside the
features that change neither what a reader must do nor what a writer must check:

- ``appendOnly``, ``invariants``: the legacy features a protocol upgrade to writer version 7
  lists (``delta.appendOnly`` itself, when true, refuses a rewind's or a backfill's delete:
  Delta fails that commit, and nothing is written);
- ``changeDataFeed`` (``delta.enableChangeDataFeed``): appends need no change files, Delta
  reads inserts from the added files (tried: delta-spark's ``table_changes`` after our
  appends);
- ``timestampNtz``: a column type, read and written by all three readers.

Every other feature is refused before a commit, with the property that enables it named:
deletion vectors (delta-rs cannot read such a table), column mapping (our files carry the
logical column names), CHECK constraints and generated columns (our files would bypass them),
row tracking, in-commit timestamps, type widening, v2 checkpoints, clustering and the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from modeswitch.errors import ModeswitchError
from modeswitch.storage import open_delta_table

SUPPORTED_WRITER_FEATURES = frozenset(
    {"appendOnly", "invariants", "changeDataFeed", "timestampNtz"}
)
SUPPORTED_READER_FEATURES = frozenset({"timestampNtz"})

ENABLED_BY = {
    "deletionVectors": "delta.enableDeletionVectors",
    "columnMapping": "delta.columnMapping.mode",
    "checkConstraints": "a CHECK constraint (ALTER TABLE ... ADD CONSTRAINT, delta.constraints.*)",
    "generatedColumns": "a generated column (GENERATED ALWAYS AS)",
    "identityColumns": "an identity column (GENERATED ... AS IDENTITY)",
    "rowTracking": "delta.enableRowTracking",
    "inCommitTimestamp": "delta.enableInCommitTimestamps",
    "typeWidening": "delta.enableTypeWidening",
    "v2Checkpoint": "delta.checkpointPolicy = v2",
    "clustering": "CLUSTER BY (liquid clustering)",
    "domainMetadata": "CLUSTER BY or row tracking (domain metadata)",
    "vacuumProtocolCheck": "delta.feature.vacuumProtocolCheck",
    "variantType": "a VARIANT column",
    "icebergCompatV1": "delta.enableIcebergCompatV1",
    "icebergCompatV2": "delta.enableIcebergCompatV2",
}


class UnsupportedTableFeatureError(ModeswitchError):
    """A table's protocol has a feature the pipeline cannot write beside."""


def unsupported_features(
    protocol: Any,
    configuration: Mapping[str, str] | None = None,
    field_metadata: Sequence[Mapping[str, Any]] | None = None,
) -> list[str]:
    """The features of a delta-rs ``ProtocolVersions`` the pipeline cannot write beside.

    Four of them matter only when in use: CHECK constraints, generated and identity columns,
    column mapping. Their presence in a protocol says a writer must honour them, and a table
    gets them with no use at all (delta-rs moves a table to writer version 4, which implies
    generated columns, when it enables the change data feed). With the table's
    ``configuration`` and its columns' ``field_metadata`` they are refused only when used; with
    neither, whenever present."""
    found = set(protocol.reader_features or ()) - SUPPORTED_READER_FEATURES
    found |= set(protocol.writer_features or ()) - SUPPORTED_WRITER_FEATURES
    if protocol.reader_features is None and protocol.min_reader_version >= 2:
        found.add("columnMapping")  # reader version 2 exists for column mapping alone
    if protocol.writer_features is None:
        # Legacy writer versions bring features by number: 3 CHECK constraints, 4 generated
        # columns (and the change data feed), 5 column mapping, 6 identity columns.
        legacy = {3: "checkConstraints", 4: "generatedColumns", 5: "columnMapping"}
        legacy[6] = "identityColumns"
        found |= {f for v, f in legacy.items() if protocol.min_writer_version >= v}
    if configuration is not None and field_metadata is not None:
        found -= {f for f, used in IN_USE.items() if not used(configuration, field_metadata)}
    return sorted(found)


IN_USE: dict[str, Callable[[Mapping[str, str], Sequence[Mapping[str, Any]]], bool]] = {
    "checkConstraints": lambda conf, _: any(k.startswith("delta.constraints.") for k in conf),
    "generatedColumns": lambda _, fields: any("delta.generationExpression" in m for m in fields),
    "identityColumns": lambda _, fields: any("delta.identity.start" in m for m in fields),
    "columnMapping": lambda conf, _: conf.get("delta.columnMapping.mode", "none") != "none",
}


REFUSED_PROPERTIES = {
    "delta.setTransactionRetentionDuration": (
        "the pipeline's fencing and replay checks read its Delta application transaction, "
        "which Delta drops from the table's state once it is older than this retention: a "
        "pipeline paused for longer would then let a zombie's commit through"
    ),
}
"""Table properties the pipeline refuses to write beside, with why."""


def check_table_features(table: Any, what: str) -> None:
    """Refuse to write to an open delta-rs table (``what`` names it, e.g. ``sink table
    /data/events``) whose protocol has a feature the pipeline cannot write beside, or that
    sets a property of :data:`REFUSED_PROPERTIES`."""
    configuration = table.metadata().configuration
    for name, why in REFUSED_PROPERTIES.items():
        if configuration.get(name) is not None:
            raise UnsupportedTableFeatureError(
                f"{what} sets {name} = {configuration[name]!r}: {why}. Nothing was written. "
                f"Unset it (ALTER TABLE ... UNSET TBLPROPERTIES ('{name}'))"
            )
    fields = [dict(f.metadata or {}) for f in table.schema().fields]
    found = unsupported_features(table.protocol(), configuration, fields)
    if not found:
        return
    named = "; ".join(f"{f} (enabled by {ENABLED_BY.get(f, 'delta.feature.' + f)})" for f in found)
    raise UnsupportedTableFeatureError(
        f"{what} has Delta table features the pipeline cannot write beside: {named}. Nothing "
        f"was written. The pipeline writes reader version 1, writer version 2 and supports "
        f"only {', '.join(sorted(SUPPORTED_WRITER_FEATURES))} beside them (docs/SINK.md): "
        "drop the feature (ALTER TABLE ... DROP FEATURE) or point the pipeline at a new table"
    )


def check_tables(tables: dict[str, str], storage_options: dict[str, str] | None = None) -> None:
    """:func:`check_table_features` for each ``{what: location}`` table that exists."""
    for what, uri in tables.items():
        table = open_delta_table(uri, storage_options or {})
        if table is not None:
            check_table_features(table, f"{what} {uri}")
