"""The control tables' Arrow schemas, and optimistic concurrency on a Delta table.

Every change to a control table is a compare-and-swap on the table version: read a snapshot,
compute the change from it, and commit with ``max_commit_retries=0``. If any other commit
landed after the snapshot, delta-rs refuses ours with ``CommitFailedError``; we reload and redo,
a bounded number of times with jittered backoff. Measured with deltalake 1.6 and real
processes: delta-rs's own conflict checker (its default retries) treats appends as blind, so
two writers that each read "the highest id is 7" and append id 8 would *both* succeed; with zero
retries exactly one does. Even a blind append under delta-rs's retries fails with
``CommitFailedError`` when a rewrite (our compaction) lands first, so every write here goes
through the same loop.

Tables are created on first write, with explicit schemas; reads of a table that does not
exist yet return no rows and create nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import (
    CommitProperties,
    DeltaTable,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError

from modeswitch.errors import ModeswitchError, StateConflictError
from modeswitch.storage import delta_dataset, open_delta_table, retry_commit_races

log = logging.getLogger(__name__)

T = TypeVar("T")
Write = Callable[[DeltaTable, CommitProperties], object]

TIMESTAMP = pa.timestamp("us", tz="UTC")
METADATA_KEY = "modeswitch.state"


def _required(name: str, type_: pa.DataType) -> pa.Field:
    return pa.field(name, type_, nullable=False)


def _optional(name: str, type_: pa.DataType) -> pa.Field:
    return pa.field(name, type_, nullable=True)


EPOCHS_SCHEMA = pa.schema(
    [
        _required("id", pa.int64()),
        _required("mode", pa.string()),
        _required("reason", pa.string()),
        _required("status", pa.string()),
        _required("started_at", TIMESTAMP),
        _required("start_offsets", pa.string()),
        _optional("boundary_offsets", pa.string()),
        _optional("ended_at", TIMESTAMP),
        _optional("end_offsets", pa.string()),
        _optional("end_reason", pa.string()),
        # Per bucket, the max event time of the epoch's sink commits, set when it closes.
        # Added after the table's first release: older tables gain it on their next write.
        _optional("max_event_times", pa.string()),
    ]
)

SPLITS_SCHEMA = pa.schema(
    [
        _required("epoch", pa.int64()),
        _required("wave", pa.int64()),
        _required("bucket", pa.int64()),
        _required("start_offset", pa.int64()),
        _required("end_offset", pa.int64()),
        _required("status", pa.string()),
        _required("recorded_at", TIMESTAMP),
        _required("updated_at", TIMESTAMP),
    ]
)

PROGRESS_SCHEMA = pa.schema(
    [
        _required("epoch", pa.int64()),
        _required("sequence", pa.int64()),
        _required("mode", pa.string()),
        _required("start_offsets", pa.string()),
        _required("end_offsets", pa.string()),
        _required("records", pa.int64()),
        _required("max_event_time_us", pa.string()),
        _optional("watermark", TIMESTAMP),
        _optional("committed_at", TIMESTAMP),
        _optional("sink_version", pa.int64()),
        _required("recorded_at", TIMESTAMP),
        _required("recorded_by", pa.string()),
        # How many sink commits the row stands for (null: one; more after downsampling). Added
        # after the table's first release: older tables gain it on their next write.
        _optional("commits", pa.int64()),
        # Records of the commit's range that went to quarantine (null: none, or recorded before
        # the column was added; older tables gain it on their next write).
        _optional("quarantined", pa.int64()),
    ]
)

DECISIONS_SCHEMA = pa.schema(
    [
        _required("at", TIMESTAMP),
        _required("mode", pa.string()),
        _required("reason", pa.string()),
        _required("switched", pa.bool_()),
        _required("inputs", pa.string()),
        _optional("epoch", pa.int64()),
        _required("decided_by", pa.string()),
    ]
)

COMMANDS_SCHEMA = pa.schema(
    [
        _required("id", pa.int64()),
        _required("kind", pa.string()),
        _required("args", pa.string()),
        _required("issuer", pa.string()),
        _required("status", pa.string()),
        _required("created_at", TIMESTAMP),
        _optional("applied_at", TIMESTAMP),
        _optional("applied_epoch", pa.int64()),
        _optional("applied_offsets", pa.string()),
        _optional("rejected_at", TIMESTAMP),
        _optional("reason", pa.string()),
    ]
)

FINISHED_SCHEMA = pa.schema(
    [
        _required("epoch", pa.int64()),
        _required("bucket", pa.int64()),
        _required("boundary_offset", pa.int64()),
        _required("finished_at", TIMESTAMP),
    ]
)

SCHEMAS: dict[str, pa.Schema] = {
    "epochs": EPOCHS_SCHEMA,
    "splits": SPLITS_SCHEMA,
    "progress": PROGRESS_SCHEMA,
    "decisions": DECISIONS_SCHEMA,
    "commands": COMMANDS_SCHEMA,
    "finished": FINISHED_SCHEMA,
}

ORDER: dict[str, tuple[str, ...]] = {
    "epochs": ("id",),
    "splits": ("epoch", "wave", "bucket", "start_offset"),
    "progress": ("epoch", "sequence"),
    "decisions": ("at",),
    "commands": ("id",),
    "finished": ("epoch", "bucket"),
}
"""The order a compaction writes each table's rows in: the order they were appended in, so
that a row group's statistics cover a narrow range and a read of the newest rows (decisions
since a time, progress since an epoch) skips the older row groups."""

TAIL_KEYS: dict[str, tuple[str, ...]] = {"progress": ("epoch", "sequence"), "decisions": ("at",)}
"""The append-only tables whose writers compact only their tail (:meth:`ControlTable.compact`),
and the key their rows are appended in."""

SMALL_FILE_BYTES = 4 * 2**20
"""A file under this size is the tail's: appended since the table's bigger files were
written."""

COMPACT_ROW_GROUP_ROWS = 1024
"""Rows per row group in a compacted file: small enough that a read of the newest rows decodes
little more than they hold."""


def sql_timestamp(moment: datetime) -> str:
    """A moment as a UTC timestamp literal of a delta-rs predicate (microseconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _tail(table: DeltaTable, name: str) -> tuple[pc.Expression, str] | None:
    """The rows from the smallest key of the table's small files on, as a scan filter and a
    replace-where predicate; None to rewrite the whole table (a table without a tail key, or
    without big files)."""
    keys = TAIL_KEYS.get(name)
    if keys is None:
        return None
    files = pa.table(table.get_add_actions(flatten=True))
    small = files.filter(pc.less(files.column("size_bytes"), SMALL_FILE_BYTES))
    if small.num_rows == files.num_rows or small.num_rows == 0:
        return None
    if keys == ("at",):
        # Statistics hold milliseconds: a millisecond of slack.
        low = pc.min(small.column("min.at")).as_py() - timedelta(milliseconds=1)
        return pc.field("at") >= pa.scalar(low, TIMESTAMP), f"at >= '{sql_timestamp(low)}'"
    # progress: the smallest (epoch, sequence) of the small files; a file spanning epochs
    # counts from its first epoch's start.
    low_epoch, low_sequence = min(
        (e, s if e == e_max else 0)
        for e, e_max, s in zip(
            small.column("min.epoch").to_pylist(),
            small.column("max.epoch").to_pylist(),
            small.column("min.sequence").to_pylist(),
            strict=True,
        )
    )
    where = (pc.field("epoch") > low_epoch) | (
        (pc.field("epoch") == low_epoch) & (pc.field("sequence") >= low_sequence)
    )
    predicate = f"epoch > {low_epoch} OR (epoch = {low_epoch} AND sequence >= {low_sequence})"
    return where, predicate


@dataclass(frozen=True)
class Change(Generic[T]):
    """What a planned change returns: its result, and the write to commit (None: nothing to
    write, the result stands as read). ``mark``: a Delta application transaction
    ``(app_id, version)`` committed with the write, read back with
    :meth:`Snapshot.transaction_version` (how ``progress`` records how far it follows the
    sink's log)."""

    result: T
    write: Write | None = None
    mark: tuple[str, int] | None = None


@dataclass(frozen=True)
class Snapshot:
    """One version of a control table, pinned: every read sees that version."""

    table: DeltaTable

    @property
    def version(self) -> int:
        """The Delta version the change is computed from."""
        return self.table.version()

    def transaction_version(self, app_id: str) -> int | None:
        """The version of application transaction ``app_id`` at this version, None if no
        commit has set it."""
        return self.table.transaction_version(app_id)

    def read(
        self,
        where: pc.Expression | None = None,
        *,
        match: pc.Expression | None = None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Rows of this version (only ``columns``, if given). ``where`` is pushed down to the
        scan, where the files' and row groups' column statistics prune it: give it conditions
        on integer or timestamp columns only. ``match`` filters the rows read, in memory: use
        it for strings (measured with deltalake 1.6 and pyarrow 26: delta-rs's string
        statistics are ``string_view`` literals, and pyarrow refuses to compare them with the
        ``string`` column, so pushing a string condition down fails)."""
        present = set(self.table.schema().to_arrow().names)
        wanted = None if columns is None else [c for c in columns if c in present]
        rows = delta_dataset(self.table).to_table(filter=where, columns=wanted)
        for name in [c for c in columns or () if c not in present]:
            # A column added to the schema after the table was made: null until written.
            rows = rows.append_column(name, pa.nulls(rows.num_rows, pa.int64()))
        return rows if match is None else rows.filter(match)


def insert(rows: pa.Table) -> Write:
    """A write appending ``rows``."""

    def write(table: DeltaTable, properties: CommitProperties) -> None:
        # "merge": a table made before a column was added to its schema gains it.
        write_deltalake(
            table, rows, mode="append", schema_mode="merge", commit_properties=properties
        )

    return write


def no_rows() -> Write:
    """A write of no rows: a commit that carries only its :attr:`Change.mark`."""

    def write(table: DeltaTable, properties: CommitProperties) -> None:
        table.create_write_transaction(
            [], mode="append", schema=table.schema(), commit_properties=properties
        )

    return write


def upsert(rows: pa.Table, keys: Sequence[str], *, insert_missing: bool = False) -> Write:
    """A write replacing the rows that match ``rows`` on ``keys`` (all columns), in one commit;
    with ``insert_missing`` the unmatched rows of ``rows`` are appended in that same commit."""
    predicate = " AND ".join(f"t.{key} = s.{key}" for key in keys)

    def write(table: DeltaTable, properties: CommitProperties) -> None:
        merger = table.merge(
            rows,
            predicate,
            source_alias="s",
            target_alias="t",
            merge_schema=True,  # a table made before a column was added gains it
            commit_properties=properties,
        ).when_matched_update_all()
        if insert_missing:
            merger = merger.when_not_matched_insert_all()
        merger.execute()

    return write


def rows_table(schema: pa.Schema, rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """An Arrow table of ``rows`` with exactly ``schema``."""
    return pa.Table.from_pylist([dict(row) for row in rows], schema=schema)


@dataclass(frozen=True)
class ControlTable:
    """One control table: its location, schema, and a compare-and-swap loop to change it.

    Holds only strings and numbers, so it pickles; every call reads the table's latest
    version.
    ``attempts`` bounds how many commit races one change may lose before
    :class:`StateConflictError`; the wait after the n-th lost race is uniform in
    ``[0, min(max_backoff_s, backoff_s * 2**n)]``.

    Every write adds a small file, and reading a Delta table through pyarrow costs about half
    a millisecond per file (measured: 1000 files, 0.7 s to build the dataset), so the writer
    that takes the table to ``compact_at_files`` files compacts it into one.
    """

    name: str
    uri: str
    schema: pa.Schema
    storage_options: Mapping[str, str] = field(default_factory=dict)
    attempts: int = 40
    backoff_s: float = 0.005
    max_backoff_s: float = 0.2
    compact_at_files: int = 64

    def load(self) -> DeltaTable | None:
        """The latest version, or None if the table does not exist yet (kept open by this
        thread and brought up to date: :func:`~modeswitch.storage.open_delta_table`)."""
        return open_delta_table(self.uri, self.storage_options)

    def read(
        self,
        where: pc.Expression | None = None,
        *,
        match: pc.Expression | None = None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Rows of the latest version, none if the table does not exist; ``where``, ``match``
        and ``columns`` as for :meth:`Snapshot.read`."""
        table = self.load()
        if table is None:
            empty = self.schema.empty_table()
            return empty if columns is None else empty.select(list(columns))
        return Snapshot(table).read(where, match=match, columns=columns)

    def transact(self, operation: str, plan: Callable[[Snapshot], Change[T]]) -> T:
        """Run ``plan`` on a fresh snapshot and commit its write only if the table has not moved
        since; on a lost race, reload and run ``plan`` again. Returns the committed plan's
        result. Errors ``plan`` raises (a refused transition) propagate unchanged.
        """

        def attempt(number: int) -> T:
            snapshot = Snapshot(self._load_or_create())
            change = plan(snapshot)
            if change.write is None:
                return change.result
            properties = CommitProperties(
                max_commit_retries=0,
                custom_metadata={METADATA_KEY: operation},
                app_transactions=None if change.mark is None else [Transaction(*change.mark)],
            )
            change.write(snapshot.table, properties)  # CommitFailedError: the race was lost
            self.compact(at_files=self.compact_at_files)
            return change.result

        return retry_commit_races(
            attempt,
            attempts=self.attempts,
            what=f"{operation} on control table {self.name!r} ({self.uri})",
            error=StateConflictError,
            backoff=self.backoff_s,
            max_backoff=self.max_backoff_s,
        )

    def compact(self, *, at_files: int, whole: bool = False) -> bool:
        """Rewrite the table's small files into one if it has ``at_files`` files or more; True
        if this call did. A rewrite that loses the race to another writer is left to a later
        call.

        Append-only tables that grow with the pipeline's age (``progress``, ``decisions``:
        :data:`TAIL_KEYS`) have only their tail rewritten, the rows from the smallest key of
        their small files on: a writer's compaction then costs what was appended since, not
        the table. ``whole`` (maintenance) rewrites every row into one file."""
        table = self.load()
        if table is None or len(table.file_uris()) < max(at_files, 2):
            return False
        # Not optimize.compact(): measured with deltalake 1.6, two concurrent compactions both
        # commit, even with max_commit_retries=0, and every row is then there twice. A
        # rewrite of the snapshot committed with zero retries is a compare-and-swap like
        # every other write: it lands only if nothing else did since the snapshot.
        tail = None if whole else _tail(table, self.name)
        rows = Snapshot(table).read(None if tail is None else tail[0])
        order = ORDER.get(self.name, ())
        if order:
            rows = rows.sort_by([(column, "ascending") for column in order])
        try:
            write_deltalake(
                table,
                rows,
                mode="overwrite",
                predicate=None if tail is None else tail[1],
                writer_properties=WriterProperties(max_row_group_size=COMPACT_ROW_GROUP_ROWS),
                commit_properties=CommitProperties(
                    max_commit_retries=0, custom_metadata={METADATA_KEY: "compact"}
                ),
            )
        except CommitFailedError:
            log.info(
                "compaction of %s lost to a concurrent writer; a later write retries it", self.uri
            )
            return False
        log.debug("compacted %s: %d rows into one file", self.uri, rows.num_rows)
        return True

    def _load_or_create(self) -> DeltaTable:
        table = self.load()
        if table is not None:
            return table
        try:
            # Zero retries: two creators racing must not both write a CREATE TABLE (measured:
            # with retries the loser commits a second one at version 1, with a new table id).
            DeltaTable.create(
                self.uri,
                self.schema,
                mode="ignore",
                name=self.name,
                description=f"modeswitch control table: {self.name}",
                storage_options=dict(self.storage_options),
                commit_properties=CommitProperties(max_commit_retries=0),
            )
            log.info("created control table %s at %s", self.name, self.uri)
        except CommitFailedError:
            log.debug("control table %s at %s was created concurrently", self.name, self.uri)
        table = self.load()
        if table is None:
            raise ModeswitchError(
                f"control table {self.name!r} at {self.uri} vanished after creation"
            )
        return table
