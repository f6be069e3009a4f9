"""The pipeline's control state: six Delta tables under one root, and the operations on them.

========== =================================================================================
epochs     one row per epoch: mode, why, start / boundary / end offsets, status
splits     the split ledger of batch epochs: (epoch, wave, bucket, [start, end), status)
progress   one row per sink commit: offsets, records, event times, watermark, sink version
decisions  every policy evaluation, its outcome and its inputs (JSON): the audit trail
commands   operator commands and how each was resolved (applied where, or rejected why)
finished   per batch epoch and bucket, when the bucket reached its boundary (once each)
========== =================================================================================

The sink's own Delta log is the truth about what is committed (DESIGN.md, invariant 7);
``progress`` and the split ledger follow it, and :meth:`StateStore.reconcile` repairs them
after a crash between a sink commit and the state write that should have followed it.

Every change is an optimistic compare-and-swap on its table (see :mod:`.tables`), so any number
of processes (Spark drivers, Airflow tasks, the CLI) may use the state at once: epoch and
command ids are never handed out twice, a command is resolved once, a sink commit is recorded
once. A :class:`StateStore` holds only strings; it pickles, and every process builds its own.

:class:`StateStore` is the front: one class with every table's operations, each table's in its
own module over :class:`~modeswitch.state.tables.ControlTable` (:mod:`.epochs`, :mod:`.ledger`,
:mod:`.progress`, :mod:`.decisions`, :mod:`.commands`); :meth:`StateStore.reconcile`, which
repairs several tables from the sink's log, lives here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow.compute as pc

from modeswitch.errors import InvalidStateInputError
from modeswitch.offsets import OffsetsMap
from modeswitch.sinks.commits import SinkCommit, commits_after, find_rewind_since
from modeswitch.state.base import _PIPELINE_NAME, STATE_DIR, _normalise_uri
from modeswitch.state.codec import progress_to_row, split_from_row, split_to_row
from modeswitch.state.commands import CommandsState
from modeswitch.state.decisions import DecisionsState
from modeswitch.state.epochs import EpochsState
from modeswitch.state.ledger import _SPLIT_KEY_COLUMNS, LedgerState
from modeswitch.state.progress import ProgressState, progress_keys
from modeswitch.state.records import LedgerSplit, Reconciliation, check_text, utc_now
from modeswitch.state.tables import (
    SCHEMAS,
    Change,
    Snapshot,
    insert,
    no_rows,
    rows_table,
    upsert,
)

if TYPE_CHECKING:
    from modeswitch.control.settings import PipelineSettings

log = logging.getLogger(__name__)


class StateStore(EpochsState, LedgerState, ProgressState, DecisionsState, CommandsState):
    """The control tables of one pipeline, and the one sink table whose log they follow.

    ``state_root`` holds the tables (``<root>/epochs``, ``<root>/splits``, ...); local paths are
    made absolute so that every process means the same place. Tables are created on first
    write. ``attempts`` bounds how many commit races one change may lose before
    :class:`~modeswitch.errors.StateConflictError`; a table that reaches
    ``compact_at_files`` data files is compacted by the writer that got it there.

    The store holds only strings and numbers: it pickles, and it opens the tables afresh on
    every call, so one instance may be shared by threads or shipped to another process.
    """

    @classmethod
    def from_settings(
        cls, settings: PipelineSettings, *, storage_options: Mapping[str, str] | None = None
    ) -> StateStore:
        """The control tables of the pipeline ``settings`` configure. ``storage_options``: the
        tables' (and the sink's) storage options, e.g. an Airflow Connection's extras; None
        reads them from ``MODESWITCH_STORAGE_OPTIONS`` (a job's environment, set by whoever
        started it; :mod:`modeswitch.storage`)."""
        from modeswitch.storage import storage_options as from_environment

        return cls(
            settings.state_root,
            settings.sink,
            settings.pipeline,
            storage_options=from_environment() if storage_options is None else storage_options,
        )

    @classmethod
    def for_warehouse(
        cls,
        warehouse: str,
        pipeline: str,
        sink_table_uri: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        attempts: int = 40,
        compact_at_files: int = 64,
    ) -> StateStore:
        """The store at the default root, ``<warehouse>/_modeswitch/<pipeline>``."""
        if not isinstance(pipeline, str) or not _PIPELINE_NAME.fullmatch(pipeline):
            raise InvalidStateInputError(
                f"pipeline: {pipeline!r} is not a valid name (letters, digits, '_', '.', '-')"
            )
        warehouse = check_text(warehouse, what="warehouse", allow_empty=False)
        root = f"{_normalise_uri(warehouse)}/{STATE_DIR}/{pipeline}"
        return cls(
            root,
            sink_table_uri,
            pipeline,
            storage_options=storage_options,
            attempts=attempts,
            compact_at_files=compact_at_files,
        )

    def reconcile(self, *, full: bool = False) -> Reconciliation:
        """Bring ``progress``, the split ledger and the commands up to the sink's Delta log.

        Inserts a progress row (``recorded_by="reconcile"``) for every sink commit of the
        pipeline that ``progress`` lacks, wherever it lies in the log, and marks committed
        every pending split ``[bucket, start, end)`` of an epoch whose newest sink commit has
        reached ``end`` in that bucket. A rewind commit whose command is still pending marks
        it applied (a crash came between the two). Rewinds get no progress row. Returns what
        it repaired; a second call right after repairs nothing.

        Incremental: ``progress`` carries a mark, the sink version up to which every commit of
        the pipeline is recorded and followed up (:meth:`reconciled_through`), so a call reads
        only the log's commit files above it and the progress rows of the commits found there:
        its cost is what changed since the last call, not the pipeline's age. The mark moves
        last, in the commit that records the missing rows, after the splits and rewinds are
        repaired: a crash part-way leaves it where the next call starts over. ``full`` reads
        the whole log instead (what the log still holds after cleanup).
        """
        mark = -1 if full else self.reconciled_through()
        found, newest = commits_after(self.sink_table_uri, self.pipeline, mark)
        every = found[::-1]  # newest first
        commits = [c for c in every if not c.is_rewind]
        now = utc_now()

        newest_end: dict[int, OffsetsMap] = {}
        for commit in commits:  # newest first: the first one seen of an epoch is its newest
            newest_end.setdefault(commit.epoch, commit.end)

        def plan_splits(snapshot: Snapshot) -> Change[tuple[LedgerSplit, ...]]:
            if not newest_end:
                return Change(())
            pending = [
                split_from_row(row)
                for row in snapshot.read(
                    pc.field("epoch") >= min(newest_end), match=pc.field("status") == "pending"
                ).to_pylist()
            ]
            covered = tuple(
                replace(split, status="committed", updated_at=now)
                for split in pending
                if split.end <= newest_end.get(split.epoch, {}).get(split.bucket, -1)
            )
            if not covered:
                return Change(())
            rows = rows_table(SCHEMAS["splits"], [split_to_row(s) for s in covered])
            return Change(covered, upsert(rows, _SPLIT_KEY_COLUMNS))

        committed = self._table("splits").transact("reconcile splits", plan_splits)
        rewinds = self._acknowledge_rewinds(every)

        def plan_progress(snapshot: Snapshot) -> Change[tuple[tuple[int, int], ...]]:
            recorded = set()
            if commits:
                have = snapshot.read(progress_keys(commits), columns=["epoch", "sequence"])
                recorded = {(row["epoch"], row["sequence"]) for row in have.to_pylist()}
            missing = [c for c in reversed(commits) if (c.epoch, c.sequence) not in recorded]
            held = snapshot.transaction_version(self._reconciled_app)
            advance = newest > (-1 if held is None else held)
            if not missing and not advance:
                return Change(())
            rows = [
                progress_to_row(self._progress_of(c, recorded_by="reconcile", now=now))
                for c in missing
            ]
            keys = tuple((c.epoch, c.sequence) for c in missing)
            write = insert(rows_table(SCHEMAS["progress"], rows)) if rows else no_rows()
            return Change(keys, write, mark=(self._reconciled_app, newest) if advance else None)

        inserted = self._table("progress").transact("reconcile progress", plan_progress)
        result = Reconciliation(progress=inserted, splits=committed, rewinds=rewinds)
        if result.repaired:
            log.warning(
                "pipeline %s: reconciled the control state with sink %s: %d progress rows "
                "inserted %s, %d splits marked committed, rewind commands %s marked applied",
                self.pipeline,
                self.sink_table_uri,
                len(inserted),
                list(inserted),
                len(committed),
                list(rewinds),
            )
        return result

    def _acknowledge_rewinds(self, commits: list[SinkCommit]) -> tuple[int, ...]:
        """Mark applied the pending rewind commands whose commit is among ``commits`` (newest
        first) or, for one not there, in the log since the command was issued."""
        pending = [c for c in self.pending_commands() if c.kind == "rewind"]
        if not pending:
            return ()
        found = {c.command: c for c in commits if c.is_rewind}
        acknowledged = []
        for command in pending:
            commit = found.get(command.id)
            if commit is None:
                commit = find_rewind_since(
                    self.sink_table_uri, self.pipeline, command.id, command.created_at
                )
            if commit is not None and self.acknowledge_rewind(commit):
                acknowledged.append(command.id)
        return tuple(acknowledged)

    def acknowledge_rewind(self, commit: SinkCommit) -> bool:
        """Mark the rewind command of sink commit ``commit`` applied, with the commit's epoch
        and end offsets: the one outcome both ``decide`` and :meth:`reconcile` record. True if
        this call applied it."""
        if not commit.is_rewind or commit.command is None:
            raise InvalidStateInputError(f"sink commit {commit!r} is not a rewind")
        return self.apply_command(commit.command, max(commit.epoch, 1), commit.end)
