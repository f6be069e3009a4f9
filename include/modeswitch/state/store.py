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
``progress`` and the split ledger follow it, and :func:`reconcile` repairs them after a crash
between a sink commit and the state write that should have followed it.

Every change is an optimistic compare-and-swap on its table (see :mod:`.tables`), so any number
of processes (Spark drivers, Airflow tasks, the CLI) may use the state at once: epoch and
command ids are never handed out twice, a command is resolved once, a sink commit is recorded
once. A :class:`StateStore` holds only strings; it pickles, and every process builds its own.

:class:`StateStore` is one object per table, each in its own module, over one
:class:`~modeswitch.state.base.StateTables` (``store.tables``): ``store.epochs``
(:mod:`.epochs`), ``store.ledger`` (:mod:`.ledger`: splits and finished buckets),
``store.progress`` (:mod:`.progress`), ``store.decisions`` (:mod:`.decisions`) and
``store.commands`` (:mod:`.commands`). :func:`reconcile`, which repairs several tables from the
sink's log, lives here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from modeswitch.offsets import OffsetsMap
from modeswitch.sinks.commits import SinkCommit, commits_after, find_rewind_since
from modeswitch.state.base import StateTables
from modeswitch.state.commands import CommandTable
from modeswitch.state.decisions import DecisionTable
from modeswitch.state.epochs import EpochTable
from modeswitch.state.ledger import SplitLedger
from modeswitch.state.progress import ProgressTable
from modeswitch.state.records import Reconciliation, utc_now

if TYPE_CHECKING:
    from modeswitch.control.settings import PipelineSettings

log = logging.getLogger(__name__)


class StateStore:
    """The control tables of one pipeline, and the one sink table whose log they follow: one
    object per table (``epochs``, ``ledger``, ``progress``, ``decisions``, ``commands``) over
    the one :class:`~modeswitch.state.base.StateTables` they share (``tables``: where the
    tables are, the sink's URI, the pipeline, the storage options).

    The arguments are :class:`~modeswitch.state.base.StateTables`'. The store holds only
    strings and numbers: it pickles, and it opens the tables afresh on every call, so one
    instance may be shared by threads or shipped to another process.
    """

    def __init__(
        self,
        state_root: str,
        sink_table_uri: str,
        pipeline: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        attempts: int = 40,
        compact_at_files: int = 64,
    ) -> None:
        self.tables = StateTables(
            state_root,
            sink_table_uri,
            pipeline,
            storage_options=storage_options,
            attempts=attempts,
            compact_at_files=compact_at_files,
        )
        self.commands = CommandTable(self.tables)
        self.progress = ProgressTable(self.tables)
        self.decisions = DecisionTable(self.tables)
        self.epochs = EpochTable(self.tables, progress=self.progress, commands=self.commands)
        self.ledger = SplitLedger(self.tables, epochs=self.epochs)

    def __repr__(self) -> str:
        return (
            f"StateStore(state_root={self.tables.state_root!r}, "
            f"sink_table_uri={self.tables.sink_table_uri!r}, pipeline={self.tables.pipeline!r})"
        )

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


def reconcile(store: StateStore, *, full: bool = False) -> Reconciliation:
    """Bring ``progress``, the split ledger and the commands of ``store`` up to the sink's
    Delta log.

    Inserts a progress row (``recorded_by="reconcile"``) for every sink commit of the
    pipeline that ``progress`` lacks, wherever it lies in the log, and marks committed
    every pending split ``[bucket, start, end)`` of an epoch whose newest sink commit has
    reached ``end`` in that bucket. A rewind commit whose command is still pending marks
    it applied (a crash came between the two). Rewinds get no progress row. Returns what
    it repaired; a second call right after repairs nothing.

    Incremental: ``progress`` carries a mark, the sink version up to which every commit of
    the pipeline is recorded and followed up
    (:meth:`~modeswitch.state.progress.ProgressTable.reconciled_through`), so a call reads
    only the log's commit files above it and the progress rows of the commits found there:
    its cost is what changed since the last call, not the pipeline's age. The mark moves
    last, in the commit that records the missing rows, after the splits and rewinds are
    repaired: a crash part-way leaves it where the next call starts over. ``full`` reads
    the whole log instead (what the log still holds after cleanup).
    """
    tables = store.tables
    mark = -1 if full else store.progress.reconciled_through()
    found, newest = commits_after(tables.sink_table_uri, tables.pipeline, mark)
    every = found[::-1]  # newest first
    commits = [c for c in every if not c.is_rewind]
    now = utc_now()

    newest_end: dict[int, OffsetsMap] = {}
    for commit in commits:  # newest first: the first one seen of an epoch is its newest
        newest_end.setdefault(commit.epoch, commit.end)

    committed = store.ledger.commit_reached(newest_end, now=now)
    rewinds = _acknowledge_rewinds(store, every)
    inserted = store.progress.record_missing(commits, through=newest, now=now)
    result = Reconciliation(progress=inserted, splits=committed, rewinds=rewinds)
    if result.repaired:
        log.warning(
            "pipeline %s: reconciled the control state with sink %s: %d progress rows "
            "inserted %s, %d splits marked committed, rewind commands %s marked applied",
            tables.pipeline,
            tables.sink_table_uri,
            len(inserted),
            list(inserted),
            len(committed),
            list(rewinds),
        )
    return result


def _acknowledge_rewinds(store: StateStore, commits: list[SinkCommit]) -> tuple[int, ...]:
    """Mark applied the pending rewind commands whose commit is among ``commits`` (newest
    first) or, for one not there, in the log since the command was issued."""
    pending = [c for c in store.commands.pending() if c.kind == "rewind"]
    if not pending:
        return ()
    found = {c.command: c for c in commits if c.is_rewind}
    acknowledged = []
    for command in pending:
        commit = found.get(command.id)
        if commit is None:
            commit = find_rewind_since(
                store.tables.sink_table_uri, store.tables.pipeline, command.id, command.created_at
            )
        if commit is not None and store.commands.acknowledge_rewind(commit):
            acknowledged.append(command.id)
    return tuple(acknowledged)
