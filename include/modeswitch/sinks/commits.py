"""What every sink commit records in the sink's Delta log, and how to read it back.

The sink's Delta log is the pipeline's checkpoint (DESIGN.md, invariant 7). Each commit the
sink makes carries, in its ``commitInfo``:

- a Delta application transaction ``(app_id = pipeline, version = txn_version(epoch, seq))``,
  so that replays are recognised and zombies of older epochs refused;
- custom metadata under the key ``"modeswitch"``: a JSON object with the pipeline, epoch,
  mode, sequence (wave index or micro-batch id), the offsets range ``[start, end)`` it covers
  per bucket, the number of records, and the max event time per bucket.

A **rewind** (an operator's ``rewind`` command, :mod:`modeswitch.sinks.rewind`) is a commit
too, of mode ``"rewind"``: it deletes the rows at or above the rewind offsets, and its ``end``
is the committed offsets it moves back to, ``start`` the rewind offsets, ``rewound_from`` the
rewound buckets' ends before it, and ``command`` the command's id. It is the only kind of
commit whose ``end`` may be below the previous commit's (invariant 3, checked by
:func:`offset_regressions`). Its app-transaction version lies in the upper half of the
sequence range of its epoch (:func:`rewind_txn_version`), above every data commit of that
epoch and below every commit of the next.

Readers here use only ``deltalake`` and the log's commit files (read by
:mod:`modeswitch.sinks.delta_log`): no Spark.
"""

from __future__ import annotations

import calendar
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from modeswitch.errors import ModeswitchError, SinkLogCleanedError
from modeswitch.offsets import OffsetsMap, offsets_from_dict, offsets_to_dict
from modeswitch.sinks.delta_log import commit_infos_after, delta_log_dir, read_commit_info
from modeswitch.storage import open_delta_table

QUARANTINE_METADATA_KEY = "modeswitch_quarantine"
"""The sink commit's ``commitInfo`` key that describes its quarantined records: their count
(``records``), the most common reasons with their counts (``reasons``, at most
:data:`REASONS_KEPT`) and the quarantine files (``files``) the quarantine table's own commit
adds (:func:`modeswitch.sinks.committer.sync_quarantine`)."""
REASONS_KEPT = 5
"""Quarantine reasons a sink commit records, the most common first."""
OTHER_REASONS = "(other reasons)"
"""Where a task counts its quarantined records past its first :data:`REASONS_PER_TASK`
distinct reasons (a transform's reason may name each record's value)."""
REASONS_PER_TASK = 20


def add_reasons(counts: dict[str, int], more: Mapping[str, int]) -> None:
    """Add ``more`` quarantine reason counts into ``counts``, keeping at most
    :data:`REASONS_PER_TASK` distinct reasons (the rest under :data:`OTHER_REASONS`)."""
    for reason, n in more.items():
        key = reason
        if key not in counts and len(counts) >= REASONS_PER_TASK:
            key = OTHER_REASONS
        counts[key] = counts.get(key, 0) + n


log = logging.getLogger(__name__)

METADATA_KEY = "modeswitch"
USER_METADATA_KEY = "userMetadata"
"""The ``commitInfo`` field Delta's readers show as a commit's user metadata (the
``userMetadata`` column of delta-spark's ``DESCRIBE HISTORY``, ``DeltaTable.history()`` in
delta-rs). Each commit of ours puts a short JSON summary there (:func:`user_metadata`): who
wrote it, the pipeline, what kind of commit, and where it got to; the full record stays under
:data:`METADATA_KEY`."""
SEQUENCE_BITS = 32
REWIND_SEQUENCE_BASE = 2 ** (SEQUENCE_BITS - 1)
"""Sequences at and above this are rewinds (``base + command id``); data commits stay below."""


def user_metadata(pipeline: str | None, kind: str, **fields: Any) -> dict[str, str]:
    """The ``custom_metadata`` entry that becomes the commit's ``userMetadata``: a compact JSON
    object ``{"writer": "modeswitch", "pipeline": ..., "kind": ..., **fields}`` (no
    ``pipeline`` when None: a maintenance run on a table of no one pipeline)."""
    body = {"writer": "modeswitch", **({"pipeline": pipeline} if pipeline else {}), "kind": kind}
    body.update(fields)
    return {USER_METADATA_KEY: json.dumps(body, separators=(",", ":"))}


Mode = Literal["batch", "stream", "rewind"]


UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def event_time_from_micros(micros: int) -> datetime:
    """An event time recorded in microseconds since the Unix epoch (``max_event_time_us``),
    as an aware UTC datetime, exactly."""
    return UNIX_EPOCH + timedelta(microseconds=int(micros))


def event_time_to_micros(moment: datetime) -> int:
    """Microseconds since the Unix epoch of ``moment`` (naive: taken as UTC), exactly."""
    # Plain arithmetic on the UTC fields: a pendulum DateTime's difference is not a timedelta.
    return calendar.timegm(moment.utctimetuple()) * 1_000_000 + moment.microsecond


def txn_version(epoch: int, sequence: int) -> int:
    """The Delta app-transaction version of a commit: strictly increasing across epochs and,
    within an epoch, across waves or micro-batches."""
    if epoch < 0 or not 0 <= sequence < 2**SEQUENCE_BITS:
        raise ValueError(f"epoch {epoch} / sequence {sequence} out of range")
    return (epoch << SEQUENCE_BITS) | sequence


def rewind_txn_version(epoch: int, command: int) -> int:
    """The app-transaction version of the rewind applied for ``command`` after epoch ``epoch``:
    above every data commit of that epoch (so its zombies are fenced out), below the next
    epoch's, and increasing with the command id (commands are applied in id order)."""
    if not 0 < command < REWIND_SEQUENCE_BASE:
        raise ValueError(f"command id {command} out of range")
    return txn_version(epoch, REWIND_SEQUENCE_BASE + command)


def split_txn_version(version: int) -> tuple[int, int]:
    """``(epoch, sequence)`` of an app-transaction version."""
    return version >> SEQUENCE_BITS, version & (2**SEQUENCE_BITS - 1)


@dataclass(frozen=True)
class SinkCommit:
    """One sink commit as recorded in the Delta log."""

    pipeline: str
    epoch: int
    mode: Mode
    sequence: int
    start: OffsetsMap
    end: OffsetsMap
    records: int
    max_event_time_us: dict[int, int] = field(default_factory=dict)
    table_version: int | None = None
    committed_at_ms: int | None = None
    command: int | None = None
    """Rewinds only: the id of the ``rewind`` command this commit applied."""
    rewound_from: OffsetsMap | None = None
    """Rewinds only: the rewound buckets' committed offsets before the rewind."""
    quarantined: int = 0
    """Records of the commit's offset range that went to the quarantine table (not counted in
    ``records``)."""
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    """The most common of their reasons, with counts (at most :data:`REASONS_KEPT`)."""

    @property
    def txn_version(self) -> int:
        return txn_version(self.epoch, self.sequence)

    @property
    def is_rewind(self) -> bool:
        return self.mode == "rewind"

    def to_metadata(self) -> dict[str, str]:
        """The ``custom_metadata`` for deltalake's CommitProperties."""
        body = {
            "pipeline": self.pipeline,
            "epoch": self.epoch,
            "mode": self.mode,
            "sequence": self.sequence,
            "txn_version": self.txn_version,
            "start": offsets_to_dict(self.start),
            "end": offsets_to_dict(self.end),
            "records": self.records,
            "max_event_time_us": {str(b): t for b, t in sorted(self.max_event_time_us.items())},
        }
        summary: dict[str, Any] = {"epoch": self.epoch, "sequence": self.sequence}
        if self.is_rewind:
            body["command"] = self.command
            body["rewound_from"] = offsets_to_dict(self.rewound_from or {})
            summary["command"] = self.command
        else:
            summary["records"] = self.records
        summary["end"] = body["end"]
        return {
            METADATA_KEY: json.dumps(body, separators=(",", ":")),
            **user_metadata(self.pipeline, self.mode, **summary),
        }

    @classmethod
    def from_commit_info(cls, info: Mapping[str, Any]) -> SinkCommit | None:
        """Parse a ``DeltaTable.history()`` entry; None if it is not a modeswitch commit."""
        raw = info.get(METADATA_KEY)
        quarantine = info.get(QUARANTINE_METADATA_KEY)
        if raw is None:
            # Delta's own writers (the ``delta_spark`` stream writer) can set nothing in a
            # commit's ``commitInfo`` but ``userMetadata``: the full record is nested there.
            raw, quarantine = _record_in_user_metadata(info.get(USER_METADATA_KEY))
            if raw is None:
                return None
        try:
            body = json.loads(raw) if isinstance(raw, str) else dict(raw)
            return cls(
                pipeline=str(body["pipeline"]),
                epoch=int(body["epoch"]),
                mode=body["mode"],
                sequence=int(body["sequence"]),
                start=offsets_from_dict(body["start"], source="sink commit start"),
                end=offsets_from_dict(body["end"], source="sink commit end"),
                records=int(body["records"]),
                max_event_time_us={
                    int(b): int(t) for b, t in body.get("max_event_time_us", {}).items()
                },
                table_version=info.get("version"),
                committed_at_ms=info.get("timestamp"),
                command=None if body.get("command") is None else int(body["command"]),
                rewound_from=None
                if body.get("rewound_from") is None
                else offsets_from_dict(body["rewound_from"], source="sink commit rewound_from"),
                **_quarantine_of(quarantine),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModeswitchError(
                f"sink commit at version {info.get('version')} has malformed "
                f"{METADATA_KEY!r} metadata: {raw!r}"
            ) from exc


def _record_in_user_metadata(raw: Any) -> tuple[Any, Any]:
    """``(record, quarantine)`` nested in a commit's ``userMetadata`` by a writer that has no
    other field of ``commitInfo`` to put them in (:func:`user_metadata_record`); ``(None,
    None)`` for any other user metadata (a user's own, or the summary of our other commits)."""
    if not isinstance(raw, str) or METADATA_KEY not in raw:
        return None, None
    try:
        body = json.loads(raw)
    except ValueError:
        return None, None
    if not isinstance(body, dict) or body.get("writer") != "modeswitch":
        return None, None
    return body.get(METADATA_KEY), body.get(QUARANTINE_METADATA_KEY)


def user_metadata_record(commit: SinkCommit, quarantine: Mapping[str, Any] | None = None) -> str:
    """The ``userMetadata`` of a sink commit made by Delta's own writer: the summary every
    commit of ours shows (:func:`user_metadata`), with the full record (and the quarantine's,
    if any) nested under :data:`METADATA_KEY` / :data:`QUARANTINE_METADATA_KEY`, which
    :meth:`SinkCommit.from_commit_info` reads back."""
    metadata = commit.to_metadata()
    body = json.loads(metadata[USER_METADATA_KEY])
    body[METADATA_KEY] = json.loads(metadata[METADATA_KEY])
    if quarantine is not None:
        body[QUARANTINE_METADATA_KEY] = dict(quarantine)
    return json.dumps(body, separators=(",", ":"))


def quarantine_record(info: Mapping[str, Any]) -> dict[str, Any] | None:
    """A sink commit's quarantine record (``records``, ``reasons``, ``files``) from its
    ``commitInfo``, wherever its writer put it; None if it quarantined nothing."""
    raw = info.get(QUARANTINE_METADATA_KEY)
    if raw is None:
        raw = _record_in_user_metadata(info.get(USER_METADATA_KEY))[1]
    if raw is None:
        return None
    return json.loads(raw) if isinstance(raw, str) else dict(raw)


def _quarantine_of(raw: Any) -> dict[str, Any]:
    """``quarantined`` and ``quarantine_reasons`` from a commit's quarantine metadata (none:
    nothing quarantined; commits from before the reasons were recorded have none)."""
    if raw is None:
        return {}
    body = json.loads(raw) if isinstance(raw, str) else dict(raw)
    return {
        "quarantined": int(body.get("records", 0)),
        "quarantine_reasons": {str(r): int(n) for r, n in (body.get("reasons") or {}).items()},
    }


def sink_commits(
    table_uri: str,
    pipeline: str,
    *,
    after_version: int | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> Iterator[SinkCommit]:
    """The pipeline's sink commits, newest first (optionally only those after a version).

    Yields nothing if the table does not exist yet.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(table_uri, storage_options=dict(storage_options or {}))
    except TableNotFoundError:
        return
    for info in table.history():
        version = info.get("version")
        if after_version is not None and version is not None and version <= after_version:
            return
        commit = SinkCommit.from_commit_info(info)
        if commit is not None and commit.pipeline == pipeline:
            yield commit


def keep_log() -> Any:
    """The post-commit hooks of a commit to the sink that is not the pipeline's own
    (maintenance, a backfill): checkpoint as usual, but leave log cleanup to maintenance.

    A writer cleans the log below its checkpoint after committing, and a checkpoint at such
    a commit lies above the pipeline's newest commit: once that commit's file is older than
    the log retention (a pipeline paused for a few hours) it would be deleted, and with it the
    committed offsets. The pipeline's own commits may clean: their checkpoint is at the newest
    commit itself."""
    from deltalake import PostCommitHookProperties

    return PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


def newest_commit_in(table: Any, pipeline: str) -> SinkCommit | None:
    """The pipeline's newest commit at or below an open ``DeltaTable``'s snapshot version."""
    found = newest_commit_entry(table, pipeline)
    return found[0] if found else None


def newest_commit_entry(table: Any, pipeline: str) -> tuple[SinkCommit, dict] | None:
    """Like :func:`newest_commit_in`, with the raw ``commitInfo`` entry beside it.

    Reads the log's commit files from the table's snapshot version downwards. Not
    ``history()``: that reads the log as it is now, and while another writer commits, its
    entries can carry the snapshot's version numbers (measured under concurrent commits), so
    a newer commit would pass for the snapshot's.

    None only before the pipeline's first commit: if the table's app transaction says it has
    committed but log cleanup removed every commit file of it,
    :class:`~modeswitch.errors.SinkLogCleanedError` (never "nothing committed", which would
    start the pipeline over from the earliest offsets).
    """
    found = next(commit_entries(table, pipeline), None)
    if found is None and table.transaction_version(pipeline) is not None:
        held = table.transaction_version(pipeline)
        epoch, sequence = split_txn_version(held)
        raise SinkLogCleanedError(
            f"sink {table.table_uri}: pipeline {pipeline!r} has committed (its newest commit is "
            f"epoch {epoch} sequence {sequence}), but the log files up to version "
            f"{table.version()} hold none of its commits: log cleanup removed the newest one, "
            "so its committed offsets are unknown and nothing is planned until the file is "
            "restored from a backup. Only modeswitch's maintenance may clean this table's log "
            "(it keeps the newest commit): turn log cleanup off in other writers "
            "(delta.enableExpiredLogCleanup=false)"
        )
    return found


def commits_after(table_uri: str, pipeline: str, version: int) -> tuple[list[SinkCommit], int]:
    """The pipeline's commits at table versions above ``version``, oldest first, and the
    newest table version seen. Reads only the new commit files of the log (no snapshot is
    loaded): what a stream's supervisor calls after every micro-batch, and what
    :func:`~modeswitch.state.reconcile` reads since its mark. If log cleanup has
    removed the files just above ``version``, reading starts at the oldest file kept."""
    found: list[SinkCommit] = []
    newest = version
    for at, info in commit_infos_after(table_uri, version):
        newest = at
        commit = SinkCommit.from_commit_info(info)
        if commit is not None and commit.pipeline == pipeline:
            found.append(commit)
    return found, newest


def sink_version(table_uri: str) -> int:
    """The sink table's current version, -1 before it exists: where :func:`commits_after`
    starts following it."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(table_uri).version()
    except TableNotFoundError:
        return -1


_MISSING: Any = object()


def _read_commit_file(log_dir: tuple[Any, str], version: int, pipeline: str) -> Any:
    """The pipeline's commit in log file ``version`` (None: another writer's commit;
    ``_MISSING``: no such file)."""
    info = read_commit_info(log_dir, version)
    if info is None:
        return _MISSING
    commit = SinkCommit.from_commit_info(info)
    if commit is not None and commit.pipeline == pipeline:
        return commit, info
    return None


def latest_sink_commit(
    table_uri: str, pipeline: str, *, storage_options: Mapping[str, str] | None = None
) -> SinkCommit | None:
    """The pipeline's newest sink commit, or None before the first one."""
    table = open_delta_table(table_uri, storage_options or {})
    return None if table is None else newest_commit_in(table, pipeline)


def committed_offsets(
    table_uri: str, pipeline: str, *, storage_options: Mapping[str, str] | None = None
) -> OffsetsMap:
    """Per bucket, the end of what is in the sink: the truth the control tables follow.

    Every commit carries the full end map, so the newest commit's ``end`` is the answer
    (offsets never decrease, except by a recorded rewind, which is itself a commit).
    """
    latest = latest_sink_commit(table_uri, pipeline, storage_options=storage_options)
    return dict(latest.end) if latest else {}


REWIND_CLOCK_SKEW = timedelta(hours=1)
"""How far the clock of the process that wrote a commit may be behind the one that issued a
command: a rewind's commit is looked for among commits written up to this long before its
command was issued."""


def find_rewind(
    table: Any, pipeline: str, command: int, *, issued_at: datetime | None = None
) -> SinkCommit | None:
    """The rewind commit that applied ``command``, at or below an open ``DeltaTable``'s
    snapshot, or None: how a rewind is never applied twice. With ``issued_at`` (when the
    command was issued) the search stops at commits older than that (less
    :data:`REWIND_CLOCK_SKEW`): its cost is the command's age, not the log's."""
    stop_ms = None if issued_at is None else event_time_to_micros(issued_at - REWIND_CLOCK_SKEW)
    for commit, _ in commit_entries(table, pipeline):
        if commit.is_rewind and commit.command == command:
            return commit
        at_ms = commit.committed_at_ms
        if stop_ms is not None and at_ms is not None and at_ms * 1000 < stop_ms:
            return None
    return None


def find_rewind_since(
    table_uri: str,
    pipeline: str,
    command: int,
    issued_at: datetime,
    *,
    storage_options: Mapping[str, str] | None = None,
) -> SinkCommit | None:
    """:func:`find_rewind` in the sink's newest snapshot; None if the sink does not exist."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(table_uri, storage_options=dict(storage_options or {}))
    except TableNotFoundError:
        return None
    return find_rewind(table, pipeline, command, issued_at=issued_at)


def commit_entries(table: Any, pipeline: str) -> Iterator[tuple[SinkCommit, dict]]:
    """The pipeline's commits at or below an open ``DeltaTable``'s snapshot, newest first,
    each with its raw ``commitInfo``; read from the log's commit files (see
    :func:`newest_commit_entry`), stopping where log cleanup removed older ones."""
    log_dir = delta_log_dir(table.table_uri)
    for version in range(table.version(), -1, -1):
        found = _read_commit_file(log_dir, version, pipeline)
        if found is _MISSING:
            return  # older commits were cleaned up after a checkpoint
        if found is not None:
            yield found


def offset_regressions(commits: list[SinkCommit]) -> list[str]:
    """Invariant 3 over a pipeline's commits (newest first, as :func:`sink_commits` yields
    them): committed offsets never decrease from one commit to the next, except by a rewind,
    and a rewind never moves a bucket forward. Returns each violation, described."""
    problems = []
    before: dict[int, int] = {}
    for commit in reversed(commits):
        where = f"sink version {commit.table_version} (epoch {commit.epoch} {commit.mode})"
        for bucket, offset in sorted(commit.end.items()):
            previous = before.get(bucket)
            if previous is None:
                continue
            if offset < previous and not commit.is_rewind:
                problems.append(
                    f"bucket {bucket}: {where} moves the committed offset back from {previous} "
                    f"to {offset} without a recorded rewind"
                )
            elif offset > previous and commit.is_rewind:
                problems.append(
                    f"bucket {bucket}: {where}, a rewind, moves the committed offset forward "
                    f"from {previous} to {offset}"
                )
        before.update(commit.end)
    return problems
