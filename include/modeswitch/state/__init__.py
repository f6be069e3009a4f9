"""The pipeline's control state in Delta tables: epochs, splits, progress, decisions, commands.

Build a :class:`StateStore` from plain strings in each process that needs one (a Spark driver,
an Airflow task, the CLI); it pickles, and concurrent writers lose no update. Its parts are one
per table: ``store.epochs``, ``store.ledger``, ``store.progress``, ``store.decisions``,
``store.commands``; :func:`reconcile` brings them up to the sink's Delta log.
"""

from __future__ import annotations

from modeswitch.state.records import (
    Command,
    CommandKind,
    CommandStatus,
    Epoch,
    EpochStatus,
    LedgerSplit,
    Mode,
    Progress,
    Reconciliation,
    RecordedDecision,
    SplitStatus,
)
from modeswitch.state.store import StateStore, reconcile

__all__ = [
    "Command",
    "CommandKind",
    "CommandStatus",
    "Epoch",
    "EpochStatus",
    "LedgerSplit",
    "Mode",
    "Progress",
    "Reconciliation",
    "RecordedDecision",
    "SplitStatus",
    "StateStore",
    "reconcile",
]
