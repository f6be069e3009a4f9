"""The sink's driver side: one atomic, fenced Delta commit per batch write or micro-batch.

:func:`commit_files` commits the files the tasks wrote (:mod:`modeswitch.sinks.files`) with
``deltalake``, carrying the offsets range, epoch and mode (:mod:`modeswitch.sinks.commits`) and
the app transaction ``(pipeline, txn_version(epoch, sequence))``, after the checks of
:mod:`modeswitch.sinks.fencing`; the fencing rules are in :mod:`modeswitch.sinks.delta`'s
docstring. The quarantine table gets its own commit with the same app-transaction version,
repaired after a crash (:func:`sync_quarantine`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from modeswitch.faults import pause_point
from modeswitch.offsets import OffsetsMap
from modeswitch.sinks.commits import (
    QUARANTINE_METADATA_KEY,
    REASONS_KEPT,
    SinkCommit,
    add_reasons,
    quarantine_record,
    split_txn_version,
    user_metadata,
)
from modeswitch.sinks.features import check_table_features
from modeswitch.sinks.fencing import (
    check_fencing,
    check_replay,
    next_sink_commit,
    open_sink_table,
)
from modeswitch.sinks.files import (
    QUARANTINE_SCHEMA,
    DeltaCommitMessage,
    delete_message_files,
)
from modeswitch.sinks.options import DeltaSinkOptions
from modeswitch.sinks.parquet_files import WrittenFile
from modeswitch.sinks.schema import delta_schema, merge_schema
from modeswitch.storage import CommitRaceLost, open_delta_table, retry_commit_races
from modeswitch.transforms import QUARANTINE_REASON

log = logging.getLogger(__name__)

COMMIT_ATTEMPTS = 20
_UNSET: Any = object()


# -- driver: one atomic commit ----------------------------------------------------------------
@dataclass(frozen=True)
class CommitOutcome:
    """What the driver's commit did."""

    status: str  # "committed", "replayed", "empty"
    table_version: int | None
    commit: SinkCommit | None


def commit_files(
    options: DeltaSinkOptions,
    schema: pa.Schema,
    messages: Sequence[WriterCommitMessage | None],
    *,
    sequence: int | None,
    start: OffsetsMap | None,
    end: OffsetsMap | None,
) -> CommitOutcome:
    """Commit the tasks' files to the table in one Delta commit, exactly once.

    ``start`` / ``end`` are the source offsets the commit covers (may be None without a
    pipeline). On refusal or replay the files are deleted and nothing becomes visible.
    """
    from deltalake import CommitProperties, Transaction
    from deltalake.transaction import AddAction

    parts = [m for m in messages if isinstance(m, DeltaCommitMessage)]
    merged = merged_message(parts)
    files, quarantine_files = merged.files, merged.quarantine_files
    quarantine = quarantine_metadata(merged)
    actions = [
        AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats)
        for f in files
    ]
    data_schema = pa.schema([f for f in schema if f.name != QUARANTINE_REASON])
    if quarantine_files and (options.pipeline is None or options.quarantine_path is None):
        raise ValueError("option quarantinePath: quarantined records need a pipeline and a path")
    landed = False
    try:
        table = open_sink_table(options)
        if options.quarantine_path and options.pipeline:
            # A crash may have come between the last commit and its quarantine commit.
            sync_quarantine(options, table)
        snapshots = [table]  # the first attempt commits on the snapshot just synced

        def attempt(number: int) -> CommitOutcome:
            nonlocal landed
            table = snapshots.pop() if snapshots else open_sink_table(options)
            if table is not None:
                check_table_features(table, f"sink table {options.path}")
            commit = None
            properties: dict[str, Any] = {"max_commit_retries": 0}
            if options.pipeline is not None:
                assert options.epoch is not None and sequence is not None
                previous = check_fencing(table, options, sequence)
                if previous == "replayed":
                    check_replay(table, options, sequence, end)
                    delete_message_files(options, parts)
                    version = table.version() if table is not None else None
                    return CommitOutcome("replayed", version, None)
                commit = with_quarantine(
                    next_sink_commit(
                        options,
                        sequence,
                        start,
                        end,
                        merged.records,
                        merged.max_event_time_us,
                        previous,
                    ),
                    quarantine,
                )
                properties["app_transactions"] = [Transaction(options.pipeline, commit.txn_version)]
                properties["custom_metadata"] = commit.to_metadata()
                if quarantine is not None:
                    properties["custom_metadata"][QUARANTINE_METADATA_KEY] = json.dumps(
                        quarantine, separators=(",", ":")
                    )
            elif not actions:
                return CommitOutcome("empty", table.version() if table else None, None)
            pause_point("sink.between_check_and_commit")
            schema, change = (
                (data_schema, {}) if table is None else merge_schema(table, data_schema, options)
            )
            if change and commit is not None:
                properties["custom_metadata"].update(change)
            _create_or_append(
                table,
                options.path,
                actions,
                schema=schema,
                partition_by=list(options.partition_by) or None,
                storage_options=options.storage_options,
                properties=CommitProperties(**properties),
            )
            landed = True  # from here on, the files belong to the table: never delete them
            pause_point("sink.after_commit")
            # No automatic retry: the commit landed exactly on top of the checked snapshot.
            version = 0 if table is None else table.version() + 1
            if quarantine_files:
                pause_point("sink.before_quarantine_commit")
                sync_quarantine(options)
            log.info(
                "sink commit %s: %d records in %d files, table version %d",
                commit.txn_version if commit else "(no pipeline)",
                merged.records,
                len(files),
                version,
            )
            return CommitOutcome("committed", version, commit)

        return retry_commit_races(attempt, attempts=COMMIT_ATTEMPTS, what=f"sink {options.path}")
    except BaseException:
        if not landed:
            delete_message_files(options, parts)
        raise


def merged_message(parts: Sequence[DeltaCommitMessage]) -> DeltaCommitMessage:
    """The tasks' messages of one write as one: their files, records, quarantine files and
    reasons (:func:`~modeswitch.sinks.commits.add_reasons`), and max event time per bucket."""
    merged = DeltaCommitMessage()
    for part in parts:
        merged.files.extend(part.files)
        merged.records += part.records
        merged.quarantine_files.extend(part.quarantine_files)
        merged.quarantined += part.quarantined
        add_reasons(merged.quarantine_reasons, part.quarantine_reasons)
        for bucket, micros in part.max_event_time_us.items():
            known = merged.max_event_time_us.get(bucket, micros)
            merged.max_event_time_us[bucket] = max(micros, known)
    return merged


def quarantine_metadata(message: DeltaCommitMessage) -> dict[str, Any] | None:
    """The quarantine record a sink commit carries for a write's ``message``: ``records``,
    the :data:`~modeswitch.sinks.commits.REASONS_KEPT` most common ``reasons`` and the
    ``files`` the quarantine table's commit adds; None if nothing was quarantined."""
    if not message.quarantine_files:
        return None
    ranked = sorted(message.quarantine_reasons.items(), key=lambda r: (-r[1], r[0]))
    return {
        "records": message.quarantined,
        "reasons": dict(ranked[:REASONS_KEPT]),
        "files": [dataclasses.asdict(f) for f in message.quarantine_files],
    }


def with_quarantine(commit: SinkCommit, quarantine: dict[str, Any] | None) -> SinkCommit:
    """``commit`` with the counts of its :func:`quarantine_metadata` (none: nothing)."""
    if quarantine is None:
        return commit
    return dataclasses.replace(
        commit, quarantined=quarantine["records"], quarantine_reasons=quarantine["reasons"]
    )


def sync_quarantine(options: DeltaSinkOptions, table: Any = _UNSET) -> int:
    """Commit to the quarantine table the files that the pipeline's newest sink commit lists,
    unless the quarantine table already holds them; returns how many files it committed. If
    the newest sink commit is a rewind, delete the rewound rows from the quarantine instead,
    unless that is done (returns 1 if this call did it).

    The sink commit is the truth: its metadata lists its quarantine files, and the quarantine
    commit carries the same app-transaction version, so a crash between the two is repaired
    by the next commit (or by calling this) and never commits them twice.
    """
    from modeswitch.sinks.commits import newest_commit_entry

    assert options.pipeline is not None and options.quarantine_path is not None
    if table is _UNSET:
        table = open_sink_table(options)
    if table is None:
        return 0
    found = newest_commit_entry(table, options.pipeline)
    if found is not None and found[0].is_rewind:
        from modeswitch.sinks.rewind import rewind_quarantine

        rewound = rewind_quarantine(
            options.quarantine_path,
            options.pipeline,
            found[0],
            storage_options=options.storage_options,
        )
        return int(rewound)
    record = quarantine_record(found[1]) if found is not None else None
    if found is None or record is None:
        return 0
    commit = found[0]
    files = [WrittenFile(**f) for f in record["files"]]
    return commit_quarantine(options, files, commit.txn_version)


def commit_quarantine(options: DeltaSinkOptions, files: Sequence[WrittenFile], version: int) -> int:
    """One quarantine commit for the sink commit with app-transaction ``version``."""
    from deltalake import CommitProperties, Transaction
    from deltalake.transaction import AddAction

    assert options.pipeline is not None and options.quarantine_path is not None
    actions = [
        AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats)
        for f in files
    ]

    def attempt(number: int) -> int:
        table = open_delta_table(options.quarantine_path, options.storage_options)
        current = table.transaction_version(options.pipeline) if table is not None else None
        if current is not None and current >= version:
            return 0
        epoch, sequence = split_txn_version(version)
        properties = CommitProperties(
            max_commit_retries=0,
            app_transactions=[Transaction(options.pipeline, version)],
            custom_metadata=user_metadata(
                options.pipeline, "quarantine", epoch=epoch, sequence=sequence, files=len(files)
            ),
        )
        _create_or_append(
            table,
            options.quarantine_path,
            actions,
            schema=QUARANTINE_SCHEMA,
            partition_by=None,
            storage_options=options.storage_options,
            properties=properties,
        )
        log.info("quarantine commit %d: %d files", version, len(files))
        return len(files)

    return retry_commit_races(
        attempt, attempts=COMMIT_ATTEMPTS, what=f"quarantine {options.quarantine_path}"
    )


def _create_or_append(
    table: Any,
    uri: str,
    actions: Sequence[Any],
    *,
    schema: pa.Schema,
    partition_by: list[str] | None,
    storage_options: dict[str, str],
    properties: Any,
) -> None:
    """One commit of ``actions``: the table's first (created with ``schema``) when ``table``
    is None, else an append on top of that snapshot. A lost race raises deltalake's
    ``CommitFailedError``, or :class:`CommitRaceLost` when another writer created the table
    first; :func:`retry_commit_races` then checks again."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import create_table_with_add_actions

    try:
        if table is None:
            create_table_with_add_actions(
                uri,
                delta_schema(schema),
                actions,
                mode="error",
                partition_by=partition_by,
                storage_options=storage_options,
                commit_properties=properties,
            )
        else:
            table.create_write_transaction(
                actions, "append", schema, partition_by=partition_by, commit_properties=properties
            )
    except CommitFailedError:
        raise
    except Exception as exc:
        # mode="error" refuses a table that exists: if one does now, another writer won.
        if table is None and DeltaTable.is_deltatable(uri, storage_options=storage_options):
            raise CommitRaceLost(f"another writer created the table {uri} first") from exc
        raise
