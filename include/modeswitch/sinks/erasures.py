"""Rows another writer removed from the sink or the quarantine: an erasure, told from a loss.

Teams run their own Delta commands on the output table: a GDPR erasure (``DELETE FROM sink
WHERE user_id = ...``), an ``UPDATE``, a ``MERGE``. The exactly-once audit must not call the
rows such a command removed *missing*, nor hide a loss behind it. So it reads, from the
table's log, each commit that is not the pipeline's (no ``modeswitch`` key in its
``commitInfo``) and that removes files with ``dataChange`` set, and finds exactly the
positions ``(bucket, offset)`` that commit took away: those of the files it removed that are
not in the files it added (an ``UPDATE`` rewrites a file with the same positions, so it
erases nothing; a compaction, ``OPTIMIZE`` or ``ZORDER BY``, changes no data and is skipped).

The removed files must still be there to be read. Once ``VACUUM`` has deleted them the
positions cannot be known: the commit is reported as a problem that names its version and
operation, and the audit counts what is absent as missing. Maintenance reads the erasures of
the commits it summarises before it cleans the log or vacuums
(:class:`~modeswitch.sinks.history.LogSummary`), so an erasure older than the log retention is
still told from a loss. A table with deletion vectors cannot be read this way (and the
pipeline refuses to write to one: :mod:`modeswitch.sinks.features`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import numpy as np

from modeswitch.sinks.delta_log import log_versions
from modeswitch.storage import filesystem

OUR_KEYS = "modeswitch"
"""A ``commitInfo`` key starting with this marks a commit the pipeline (or its maintenance, a
backfill, a rewind) made."""


@dataclass(frozen=True)
class Erasure:
    """Positions one commit of another writer removed from a table."""

    table: str
    """``sink`` or ``quarantine``."""
    version: int
    operation: str
    timestamp_ms: int | None
    offsets: Mapping[int, np.ndarray] = field(default_factory=dict)
    """Per bucket, the sorted offsets it removed."""

    @property
    def records(self) -> int:
        return sum(len(o) for o in self.offsets.values())

    def describe(self) -> str:
        return f"{self.table} version {self.version} ({self.operation})"

    def to_dict(self) -> dict[str, Any]:
        """Plain values (per bucket, ``[lo, hi)`` ranges of the removed offsets)."""
        return {
            "table": self.table,
            "version": self.version,
            "operation": self.operation,
            "timestamp_ms": self.timestamp_ms,
            "ranges": {str(b): _ranges(o) for b, o in sorted(self.offsets.items())},
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Erasure:
        return cls(
            table=str(raw["table"]),
            version=int(raw["version"]),
            operation=str(raw["operation"]),
            timestamp_ms=None if raw.get("timestamp_ms") is None else int(raw["timestamp_ms"]),
            offsets={
                int(b): np.concatenate(
                    [np.arange(lo, hi, dtype=np.int64) for lo, hi in ranges]
                    or [np.empty(0, np.int64)]
                )
                for b, ranges in raw["ranges"].items()
            },
        )


def read_erasures(
    table: str, table_uri: str, *, after: int, through: int | None = None
) -> tuple[list[Erasure], list[str]]:
    """The erasures of table versions ``(after, through]`` still in the log (``through``: the
    newest if None), oldest first, and the commits whose removed rows cannot be read (their
    files vacuumed, or deletion vectors), described."""
    fs, root = filesystem(table_uri)
    erasures: list[Erasure] = []
    problems: list[str] = []
    for version, actions in _commits_after(table_uri, after):
        if through is not None and version > through:
            break
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        if any(str(key).startswith(OUR_KEYS) for key in info):
            continue
        removed = [a["remove"] for a in actions if "remove" in a]
        removed = [r for r in removed if r.get("dataChange", True)]  # not a compaction's
        if not removed:
            continue
        operation = str(info.get("operation", "unknown operation"))
        what = f"{table} version {version} ({operation})"
        added = [a["add"] for a in actions if "add" in a]
        if any(f.get("deletionVector") for f in removed + added):
            problems.append(
                f"{what} uses deletion vectors: the rows it removed cannot be told from "
                "lost ones (the pipeline supports tables without them)"
            )
            continue
        try:
            gone = _positions(fs, root, removed)
        except FileNotFoundError as exc:
            problems.append(
                f"{what} removed files that are gone ({exc}; VACUUM deletes them): the rows "
                "it removed cannot be told from lost ones. Audit, or run maintenance, before "
                "vacuuming after an erasure"
            )
            continue
        kept = _positions(fs, root, added)
        erased = {}
        for bucket, offsets in gone.items():
            left = np.setdiff1d(offsets, kept.get(bucket, np.empty(0, np.int64)))
            if len(left):
                erased[bucket] = left
        if erased:
            erasures.append(Erasure(table, version, operation, info.get("timestamp"), erased))
    return erasures, problems


def erased_positions(erasures: list[Erasure]) -> dict[int, np.ndarray]:
    """Per bucket, the sorted distinct offsets any of ``erasures`` removed."""
    merged: dict[int, list[np.ndarray]] = {}
    for erasure in erasures:
        for bucket, offsets in erasure.offsets.items():
            merged.setdefault(bucket, []).append(offsets)
    return {b: np.unique(np.concatenate(parts)) for b, parts in merged.items()}


def _commits_after(table_uri: str, after: int) -> Iterator[tuple[int, list[dict]]]:
    """``(version, actions)`` of the log's commit files above ``after``, oldest first, from
    the oldest one kept if log cleanup removed those just above it."""
    fs, root = filesystem(table_uri)
    log_dir = f"{root}/_delta_log"
    for version in log_versions(table_uri):
        if version <= after:
            continue
        try:
            with fs.open_input_stream(f"{log_dir}/{version:020d}.json") as src:
                text = src.read().decode()
        except FileNotFoundError:  # cleaned up since the listing
            continue
        if f'"{OUR_KEYS}' in text and '"remove"' not in text:
            continue  # one of ours that removes nothing: most of the log, not parsed
        yield version, [json.loads(line) for line in text.splitlines() if line.strip()]


def _positions(fs: Any, root: str, files: list[dict]) -> dict[int, np.ndarray]:
    """Per bucket, the sorted offsets the data files hold (``bucket`` from the file, or from
    its partition values when the table is partitioned by it)."""
    import pyarrow.parquet as pq

    found: dict[int, list[np.ndarray]] = {}
    for entry in files:
        path = unquote(entry["path"])
        if "://" in path:
            file_fs, file_path = filesystem(path)
        else:
            file_fs, file_path = fs, f"{root}/{path}"
        partition = entry.get("partitionValues") or {}
        columns = ["offset"] if "bucket" in partition else ["bucket", "offset"]
        with file_fs.open_input_file(file_path) as src:
            rows = pq.read_table(src, columns=columns)
        offsets = rows.column("offset").to_numpy().astype(np.int64)
        if "bucket" in partition:
            found.setdefault(int(partition["bucket"]), []).append(offsets)
            continue
        buckets = rows.column("bucket").to_numpy().astype(np.int64)
        for bucket in np.unique(buckets).tolist():
            found.setdefault(int(bucket), []).append(offsets[buckets == bucket])
    return {b: np.sort(np.concatenate(parts)) for b, parts in found.items()}


def _ranges(offsets: np.ndarray) -> list[list[int]]:
    """Sorted distinct offsets as ``[lo, hi)`` ranges."""
    if not len(offsets):
        return []
    breaks = np.flatnonzero(np.diff(offsets) != 1)
    starts = np.concatenate([[offsets[0]], offsets[breaks + 1]])
    ends = np.concatenate([offsets[breaks], [offsets[-1]]]) + 1
    return [[int(a), int(b)] for a, b in zip(starts, ends, strict=True)]
