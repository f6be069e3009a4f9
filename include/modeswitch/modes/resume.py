"""Where a stream epoch's job starts: its first run, or a rerun after a crash.

A stream epoch's first run starts at the epoch's start offsets (the handoff) with a fresh
Spark checkpoint, and its micro-batch ids are the sink commits' sequences. A rerun (an Airflow
retry, the local runner's retry, a standby that was handed the epoch and then killed) finds
the sink already holding some of the epoch's micro-batches. Spark's checkpoint may then be:

- **in step** with the sink: its commit log ends at the micro-batch the sink committed last
  (it may have planned the next one). The query resumes from it: Spark runs the planned
  micro-batch, or plans the next one, from where the sink ends.
- **behind** the sink: the job was killed after the sink's commit of a micro-batch but before
  Spark wrote that micro-batch to its commit log. Resuming would make Spark run that
  micro-batch again (the sink would recognise the replay and drop it, but its records would
  be read, transformed and written once more), so the checkpoint is left alone.
- **missing** or holding entries the sink does not match (deleted, or from another run).

In the last two cases the query starts with a fresh checkpoint at the sink's committed offsets,
its micro-batch ids counted on from the sink's last sequence: nothing committed is read again,
nothing is skipped, and the epoch's sequences stay contiguous. Each such start gets its own
checkpoint folder, ``<checkpoint(epoch)>-from-<first sequence>``, so a later rerun knows which
sequence a checkpoint's micro-batch 0 stands for.

:func:`plan_resume` makes the choice from plain values (no Spark, no I/O);
:func:`read_checkpoints` and :func:`epoch_commits` gather them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from modeswitch.errors import ModeswitchError, OffsetsContinuityError
from modeswitch.offsets import OffsetsMap, offsets_to_json
from modeswitch.sinks.commits import SinkCommit, commit_entries
from modeswitch.sinks.stream_offsets import offsets_log_entry
from modeswitch.storage import filesystem

FRESH_CHECKPOINT_SUFFIX = "-from-"


@dataclass(frozen=True)
class CheckpointLogs:
    """What one stream checkpoint's logs hold: Spark's offsets log (micro-batches planned,
    each with its end offsets) and commit log (micro-batches completed)."""

    path: str
    sequence_base: int
    """The sink sequence of this checkpoint's micro-batch 0."""
    planned: int | None = None
    """The newest micro-batch id in the offsets log (None: empty or missing)."""
    completed: int | None = None
    """The newest micro-batch id in the commit log (None: empty or missing)."""
    ends: Mapping[int, OffsetsMap] = field(default_factory=dict)
    """End offsets of micro-batches in the offsets log (at least the newest completed one)."""


@dataclass(frozen=True)
class ResumePoint:
    """Where a stream epoch's query starts (see :func:`plan_resume`)."""

    checkpoint: str
    sequence_base: int
    """The sink sequence of the checkpoint's micro-batch 0 (the sink option ``sequence``)."""
    start: OffsetsMap
    """The offsets the checkpoint's micro-batch 0 starts from (``startingOffsets``)."""
    resumed: bool
    """True: an existing checkpoint is resumed; False: a fresh one is started."""
    committed: OffsetsMap
    """The sink's committed offsets for this epoch now (the epoch's start if none yet)."""
    last_sequence: int | None
    """The sequence of the epoch's newest sink commit, None before its first."""
    why: str

    def describe(self) -> str:
        how = "resumes checkpoint" if self.resumed else "starts a fresh checkpoint"
        return f"{how} {self.checkpoint} ({self.why})"


def checkpoint_path(root: str, sequence_base: int) -> str:
    """The checkpoint folder whose micro-batch 0 is the epoch's sequence ``sequence_base``:
    ``root`` (the epoch's checkpoint) for 0, ``<root>-from-<base>`` after a restart."""
    return root if sequence_base == 0 else f"{root}{FRESH_CHECKPOINT_SUFFIX}{sequence_base}"


def check_epoch_commits(
    epoch_id: int, epoch_start: OffsetsMap, commits: Sequence[SinkCommit]
) -> None:
    """The handoff, on a first run or a rerun: ``commits`` (the epoch's sink commits, oldest
    first) continue the epoch's start with no gap and no overlap, one after another, with
    contiguous sequences from 0. Raises :class:`OffsetsContinuityError` naming the first
    commit that does not."""
    expected = dict(epoch_start)
    for number, commit in enumerate(commits):
        where = f"stream epoch {epoch_id}: sink commit of sequence {commit.sequence}"
        if commit.epoch != epoch_id or commit.is_rewind:
            raise OffsetsContinuityError(
                f"{where} belongs to epoch {commit.epoch} ({commit.mode}), not this epoch"
            )
        if commit.sequence != number:
            raise OffsetsContinuityError(
                f"{where} follows sequence {number - 1}: the epoch's sequences must be "
                "contiguous from 0"
            )
        different = {
            b: (expected.get(b), offset)
            for b, offset in commit.start.items()
            if expected.get(b, offset) != offset
        }
        if different:
            raise OffsetsContinuityError(
                f"{where} starts at {offsets_to_json(commit.start)} but the epoch had reached "
                f"{offsets_to_json(expected)}; buckets differ (expected, found): {different}"
            )
        expected.update(commit.end)


def plan_resume(
    epoch_id: int,
    epoch_start: OffsetsMap,
    commits: Sequence[SinkCommit],
    checkpoints: Sequence[CheckpointLogs],
    root: str,
) -> ResumePoint:
    """Choose the checkpoint a stream epoch's query starts from.

    ``commits`` are the epoch's sink commits, oldest first (checked with
    :func:`check_epoch_commits`); ``checkpoints`` the epoch's existing checkpoints; ``root``
    the epoch's checkpoint location. A checkpoint is resumed if its commit log ends exactly at
    the sink's newest commit of the epoch (same sequence, same end offsets) and it has planned
    at most one micro-batch beyond it; one that has completed nothing is resumed only if it
    starts right after the sink's newest commit. Otherwise a fresh checkpoint starts at the
    sink's committed offsets, with sequences counted on from the newest commit.
    """
    check_epoch_commits(epoch_id, epoch_start, commits)
    last = commits[-1] if commits else None
    newest = last.sequence if last is not None else -1
    committed = {**epoch_start, **(last.end if last is not None else {})}
    starts = {0: dict(epoch_start)}
    for commit in commits:
        starts[commit.sequence + 1] = {**epoch_start, **commit.end}
    refused: list[str] = []
    for logs in sorted(checkpoints, key=lambda c: c.sequence_base, reverse=True):
        problem = _unusable(logs, newest, last)
        if problem is None and logs.sequence_base in starts:
            return ResumePoint(
                checkpoint=logs.path,
                sequence_base=logs.sequence_base,
                start=starts[logs.sequence_base],
                resumed=True,
                committed=committed,
                last_sequence=None if last is None else last.sequence,
                why="its commit log ends where the sink does",
            )
        refused.append(f"{logs.path}: {problem or 'its start is not in the sink'}")
    why = "no checkpoint yet" if not checkpoints else "; ".join(refused)
    if last is not None:
        why = f"sink holds the epoch up to sequence {newest}; {why}"
    return ResumePoint(
        checkpoint=checkpoint_path(root, newest + 1),
        sequence_base=newest + 1,
        start=committed,
        resumed=False,
        committed=committed,
        last_sequence=None if last is None else last.sequence,
        why=why,
    )


def _unusable(logs: CheckpointLogs, newest: int, last: SinkCommit | None) -> str | None:
    """Why ``logs`` cannot be resumed when the sink's newest sequence is ``newest`` (None: it
    can)."""
    mine = newest - logs.sequence_base  # the checkpoint's id for the sink's newest commit
    if mine < -1:
        return f"it starts at sequence {logs.sequence_base}, after the sink's next"
    if logs.planned is None:
        # A run stopped before it planned its first micro-batch (killed while writing offsets
        # entry 0 leaves a temporary file there): nothing to resume, and Spark refuses to start
        # batch 0 in an offsets folder that is not empty (STATE_STORE_CHECKPOINT_LOCATION_NOT_
        # EMPTY). A fresh checkpoint at the same place starts at the same offsets.
        return "it planned no micro-batch"
    completed = -1 if logs.completed is None else logs.completed
    planned = logs.planned
    if completed < mine:
        return (
            f"its commit log ends at micro-batch {completed} but the sink holds micro-batch "
            f"{mine} (sequence {newest}): behind the sink"
        )
    if completed > mine:
        return (
            f"its commit log holds micro-batch {completed}, which the sink does not "
            f"(sequence {logs.sequence_base + completed})"
        )
    if planned > mine + 1 or planned < completed:
        return f"its offsets log ends at micro-batch {planned}, out of step with its commits"
    if mine >= 0:
        assert last is not None
        end = logs.ends.get(mine)
        if end is None:
            return f"its offsets log has no entry for micro-batch {mine}"
        differ = {b: o for b, o in end.items() if last.end.get(b) != o}
        if differ:
            return (
                f"micro-batch {mine} ends at {offsets_to_json(end)}, the sink's sequence "
                f"{newest} at {offsets_to_json(last.end)}"
            )
    return None


# -- reading the inputs ------------------------------------------------------------------------
def epoch_commits(
    table_uri: str,
    pipeline: str,
    epoch_id: int,
    *,
    storage_options: Mapping[str, str] | None = None,
) -> list[SinkCommit]:
    """The epoch's sink commits, oldest first: the newest commits of the sink's log back to
    the first that is not the epoch's (app-transaction versions only grow along the log, so
    none of the epoch's lies below it). Reads only those commit files. A commit of a later
    epoch, or a rewind, above the epoch's own is refused."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(table_uri, storage_options=dict(storage_options or {}))
    except TableNotFoundError:
        return []
    found: list[SinkCommit] = []
    for commit, _ in commit_entries(table, pipeline):
        if commit.epoch == epoch_id and not commit.is_rewind:
            found.append(commit)
            continue
        if commit.epoch > epoch_id or (commit.epoch == epoch_id and commit.is_rewind):
            raise OffsetsContinuityError(
                f"stream epoch {epoch_id}: the sink's newest commits belong to epoch "
                f"{commit.epoch} ({commit.mode}, sink version {commit.table_version}): the "
                "epoch has ended"
            )
        break
    return found[::-1]


def read_checkpoints(root: str) -> list[CheckpointLogs]:
    """The stream checkpoints of one epoch (``root`` and ``root-from-N``) that exist, with
    what their logs hold."""
    import pyarrow.fs as pafs

    fs, path = filesystem(root)
    parent, name = path.rsplit("/", 1)
    pattern = re.compile(re.escape(name) + rf"(?:{re.escape(FRESH_CHECKPOINT_SUFFIX)}(\d+))?")
    try:
        entries = fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True))
    except OSError as exc:
        raise ModeswitchError(f"stream checkpoints under {parent}: cannot list: {exc}") from exc
    found = []
    for entry in entries:
        matched = pattern.fullmatch(entry.base_name)
        if entry.type != pafs.FileType.Directory or not matched:
            continue
        base = int(matched.group(1) or 0)
        found.append(_read_logs(fs, entry.path, checkpoint_path(root, base), base))
    return sorted(found, key=lambda c: c.sequence_base)


def _read_logs(fs: Any, local: str, path: str, base: int) -> CheckpointLogs:
    planned_ids = _batch_ids(fs, f"{local}/offsets")
    completed_ids = _batch_ids(fs, f"{local}/commits")
    planned = max(planned_ids, default=None)
    completed = max(completed_ids, default=None)
    ends = {}
    for batch in {completed, planned} - {None}:
        end = offsets_log_entry(path, batch)
        if end is not None:
            ends[batch] = end
    return CheckpointLogs(path, base, planned, completed, ends)


def _batch_ids(fs: Any, folder: str) -> list[int]:
    import pyarrow.fs as pafs

    entries = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    return [int(e.base_name) for e in entries if e.base_name.isdigit()]
