"""Table maintenance beside the live writer: what ``modeswitch maintain`` and the
``modeswitch_maintenance`` DAG run.

A stream commits every micro-batch: up to ~860 000 sink commits a day, each a small data
file, a log entry and a progress row. Readers of the sink then open hundreds of thousands of
files, and the control tables grow with the pipeline's age. One run, holding the pipeline's
maintenance lease (a ``running`` ``maintain`` command; a second run is refused while it
holds it), does, in order:

1. **Log summary**: folds the sink's commits since the previous run into a
   :class:`~modeswitch.sinks.history.LogSummary` and records it with the run, before any log
   file is deleted: the exactly-once audit reads it in place of commits log cleanup removes.
2. **Sink and quarantine**: compaction (delta-rs ``optimize.compact``: a rewrite with no data
   change, to ``compact_target_mb`` files), a checkpoint, log cleanup (``log_retention``, set
   as the table's ``delta.logRetentionDuration``) and vacuum of the files removed more
   than ``vacuum_retention`` ago (set as the table's ``delta.deletedFileRetentionDuration``:
   every checkpoint carries a tombstone for each file removed within it, so it bounds what
   every reader of the table loads). The stream keeps committing: its appends land beside the
   compaction (they touch no file it rewrites); a rewind or backfill that removes a file the
   compaction rewrites makes one of the two fail Delta's conflict check (measured), and the
   compaction starts over on the new snapshot. Two compactions at once are what the lease
   prevents: delta-rs lets both commit and every row is then there twice (measured).
   Application transactions (the sink's fencing) live in the checkpoint, so compaction and
   cleanup never let a zombie in.
3. **Control tables**: ``progress`` rows past ``progress_horizon`` merged per epoch and hour;
   every table rewritten into one file, checkpointed, its log cleaned, vacuumed.
4. **Stream checkpoints** of ended epochs beyond ``stream_checkpoints_kept``.

Before each step the run checks that it still holds the lease; a run superseded after its
lease ran out stops there.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import MaintenanceRefusedError
from modeswitch.sinks.commits import keep_log, newest_commit_entry, user_metadata
from modeswitch.sinks.history import LogSummary
from modeswitch.state import StateStore
from modeswitch.state.tables import SCHEMAS
from modeswitch.storage import filesystem, retry_commit_races

log = logging.getLogger(__name__)

LOG_RETENTION = "delta.logRetentionDuration"
TOMBSTONE_RETENTION = "delta.deletedFileRetentionDuration"
COMPACT_ATTEMPTS = 5
"""How many times a compaction starts over after a rewind or backfill removed a file it was
rewriting."""


@dataclass(frozen=True)
class TableMaintenance:
    """What one run did to one table."""

    table: str
    uri: str
    files_before: int
    files_after: int
    log_bytes_before: int
    log_bytes_after: int
    vacuumed: int
    seconds: float


@dataclass(frozen=True)
class MaintenanceReport:
    """What a maintenance run did: per table, the progress rows merged, the stream checkpoint
    folders deleted, and the sink versions its log summary covers."""

    pipeline: str
    command: int
    tables: tuple[TableMaintenance, ...]
    progress_merged: int
    checkpoints_removed: tuple[str, ...]
    summarised_through: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def maintain(
    settings: PipelineSettings,
    *,
    store: StateStore | None = None,
    run_id: str | None = None,
    issuer: str = "cli",
    now: datetime | None = None,
) -> MaintenanceReport:
    """One maintenance run of the pipeline ``settings`` configure (see the module's doc).

    ``run_id`` names the run (a retried Airflow task passes the same one and re-attaches to
    its lease); raises :class:`~modeswitch.errors.MaintenanceRefusedError` while another run
    holds the lease. The run is recorded as a ``maintain`` command: ``applied`` with its
    report, or ``rejected`` with the error that stopped it.
    """
    began = time.monotonic()
    store = store or StateStore.from_settings(settings)
    run_id = run_id or f"maintain-{uuid.uuid4().hex[:12]}"
    options = dict(store.tables.storage_options)
    cfg = settings.maintenance
    command = store.commands.claim_maintenance(
        run_id=run_id, issuer=issuer, lease=cfg.maintenance_lease
    )
    log.info(
        "pipeline %s: maintenance run %s holds the lease (command %d)",
        settings.pipeline,
        run_id,
        command,
    )

    def hold(**note: Any) -> None:
        if not store.commands.note_run(command, **note):
            raise MaintenanceRefusedError(
                f"maintenance run {run_id!r} (command {command}) lost its lease after "
                f"{cfg.maintenance_lease}: another run superseded it; stopping"
            )

    data_tables = (("sink", settings.sink), ("quarantine", settings.quarantine))
    try:
        for name, uri in data_tables:  # before the summary: these commits are cleaned up too
            table = _open(uri, options)
            if table is not None:
                _set_retentions(table, name, cfg.vacuum_retention, cfg.log_retention)
        kept = store.commands.log_summaries()
        summary = LogSummary.read(
            settings.sink,
            settings.pipeline,
            after=kept[-1].through if kept else -1,
            quarantine=(settings.quarantine, max((k.quarantine_through for k in kept), default=-1)),
        )
        hold(log_summary=summary.to_dict())
        tables = []
        for name, uri in data_tables:
            hold()
            done = maintain_table(
                name,
                uri,
                target_mb=cfg.compact_target_mb,
                vacuum_retention=cfg.vacuum_retention,
                log_retention=cfg.log_retention,
                storage_options=options,
                pipeline=settings.pipeline if name == "sink" else None,
            )
            if done is not None:
                tables.append(done)
        hold()
        merged = store.progress.downsample(cfg.progress_horizon, now=now)
        for name in SCHEMAS:
            hold()
            done = maintain_control_table(
                store, name, vacuum_retention=cfg.vacuum_retention, log_retention=cfg.log_retention
            )
            if done is not None:
                tables.append(done)
        from modeswitch.runners.lifecycle import clean_checkpoints

        hold()
        removed = clean_checkpoints(settings, store, keep=settings.stream_checkpoints_kept)
    except BaseException as exc:  # a task timeout or a signal too: the lease is released
        store.commands.finish_run(command, error=f"{type(exc).__name__}: {exc}")
        raise
    report = MaintenanceReport(
        pipeline=settings.pipeline,
        command=command,
        tables=tuple(tables),
        progress_merged=merged,
        checkpoints_removed=tuple(removed),
        summarised_through=summary.through,
        seconds=round(time.monotonic() - began, 3),
    )
    outcome = report.to_dict()
    store.commands.finish_run(
        command, tables=outcome["tables"], progress_merged=merged, seconds=report.seconds
    )
    log.info(
        "pipeline %s: maintenance run %s done in %.1f s: %s",
        settings.pipeline,
        run_id,
        report.seconds,
        ", ".join(f"{t.table} {t.files_before}->{t.files_after} files" for t in tables),
    )
    return report


def maintain_table(
    name: str,
    uri: str,
    *,
    target_mb: int,
    vacuum_retention: timedelta,
    log_retention: timedelta | None = None,
    storage_options: Mapping[str, str] | None = None,
    pipeline: str | None = None,
) -> TableMaintenance | None:
    """Compact, vacuum, checkpoint and clean the log of one data table; None if it does not
    exist. First sets the table's tombstone retention (``delta.deletedFileRetentionDuration``,
    see :func:`_set_retentions`) and, unless None, its ``delta.logRetentionDuration`` to
    ``log_retention``.

    A removed file's tombstone stays in every checkpoint until it is older than
    ``delta.deletedFileRetentionDuration`` (Delta's default: a week), and every reader loads
    the checkpoint. Compaction removes every small file a stream wrote, so that is one
    tombstone per micro-batch: at 10 000 micro-batches a checkpoint held 10 000 tombstones
    beside 495 live files (``bench/bench_soak.py``), and a week of 100 ms micro-batches would
    be six million. The retention bounds it to what was removed within it.

    Log cleanup removes the commit files below the newest checkpoint that are older than the
    table's ``delta.logRetentionDuration``; delta-rs writers do the same on their own after
    each checkpoint (measured), so the run's log summary, read just before, covers every file
    that can go unless the retention is shorter than the time between runs (the audit then
    reports the files no summary covers).

    With ``pipeline`` (the sink) the log is cleaned only below that pipeline's newest commit:
    its committed offsets live in that commit's file, and a pipeline paused for longer than
    the retention would otherwise lose them to the checkpoint this run writes above it. The
    run's own commits (and a backfill's) clean nothing on their own
    (:func:`~modeswitch.sinks.commits.keep_log`)."""
    from deltalake import CommitProperties, DeltaTable

    began = time.monotonic()
    options = dict(storage_options or {})
    table = _open(uri, options)
    if table is None:
        return None
    files_before = len(table.file_uris())
    log_before = log_bytes(uri)
    _set_retentions(table, name, vacuum_retention, log_retention)

    def compact(number: int) -> dict[str, Any]:
        fresh = DeltaTable(uri, storage_options=options)
        return fresh.optimize.compact(
            target_size=target_mb * 2**20,
            commit_properties=CommitProperties(
                custom_metadata={
                    "modeswitch.maintain": name,
                    **user_metadata(pipeline, "compaction", table=name),
                }
            ),
            post_commithook_properties=keep_log(),
        )

    retry_commit_races(compact, attempts=COMPACT_ATTEMPTS, what=f"compaction of {name} table {uri}")
    vacuumed = _vacuum(DeltaTable(uri, storage_options=options), vacuum_retention)
    newest = DeltaTable(uri, storage_options=options)
    cleaner = newest
    if pipeline is not None:
        cleaner = _newest_commit_checkpointed(newest, pipeline, options)
    newest.create_checkpoint()  # after the compaction: readers load one file's add action
    cleaner.cleanup_metadata()  # log files below it older than delta.logRetentionDuration
    return TableMaintenance(
        table=name,
        uri=uri,
        files_before=files_before,
        files_after=len(DeltaTable(uri, storage_options=options).file_uris()),
        log_bytes_before=log_before,
        log_bytes_after=log_bytes(uri),
        vacuumed=len(vacuumed),
        seconds=round(time.monotonic() - began, 3),
    )


def maintain_control_table(
    store: StateStore,
    name: str,
    *,
    vacuum_retention: timedelta,
    log_retention: timedelta | None = None,
) -> TableMaintenance | None:
    """Rewrite one control table into one file (the same compare-and-swap rewrite its writers
    make every ``compact_at_files`` writes), checkpoint it, clean its log and vacuum it. Its
    tombstones are kept for ``vacuum_retention`` and its log for ``log_retention`` (None:
    the table's own), as the sink's: ``progress`` commits once a second while a stream runs,
    and every reader of it lists its log."""
    began = time.monotonic()
    control = store.tables.table(name)
    table = control.load()
    if table is None:
        return None
    files_before = len(table.file_uris())
    log_before = log_bytes(control.uri)
    retry_commit_races(
        lambda _: _set_retentions(control.load(), name, vacuum_retention, log_retention),
        attempts=COMPACT_ATTEMPTS,
        what=f"the retention of the {name} table",
    )
    control.compact(at_files=2, whole=True)
    table = control.load()
    assert table is not None
    vacuumed = _vacuum(table, vacuum_retention)
    table = control.load()
    assert table is not None
    table.create_checkpoint()
    table.cleanup_metadata()
    return TableMaintenance(
        table=f"state/{name}",
        uri=control.uri,
        files_before=files_before,
        files_after=len(control.load().file_uris()),  # type: ignore[union-attr]
        log_bytes_before=log_before,
        log_bytes_after=log_bytes(control.uri),
        vacuumed=len(vacuumed),
        seconds=round(time.monotonic() - began, 3),
    )


def log_bytes(uri: str) -> int:
    """The bytes in a table's ``_delta_log`` folder (0 if there is none)."""
    import pyarrow.fs as pafs

    fs, root = filesystem(uri)
    entries = fs.get_file_info(pafs.FileSelector(f"{root}/_delta_log", allow_not_found=True))
    return sum(e.size or 0 for e in entries if e.type == pafs.FileType.File)


def _open(uri: str, options: Mapping[str, str]) -> Any:
    """The Delta table at ``uri``, or None if there is none yet."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(uri, storage_options=dict(options))
    except TableNotFoundError:
        return None


def _set_retentions(
    table: Any, name: str, vacuum_retention: timedelta, log_retention: timedelta | None
) -> None:
    """Set the table's tombstone retention to twice ``vacuum_retention`` and, unless None, its
    log retention to ``log_retention``; a metadata commit, made only when one differs.

    Vacuum finds the files to delete by their tombstones, and a checkpoint (a stream's own,
    every 100 commits) drops a tombstone once it is older than the tombstone retention: kept
    twice as long as ``vacuum_retention``, each is still there for a run between the two
    ages, as long as runs come at least once per ``vacuum_retention``."""
    wanted = {TOMBSTONE_RETENTION: _interval(2 * vacuum_retention)}
    if log_retention is not None:
        wanted[LOG_RETENTION] = _interval(log_retention)
    configured = table.metadata().configuration
    changed = {key: value for key, value in wanted.items() if configured.get(key) != value}
    if changed:
        # A stream commit racing it fails Delta's conflict check and retries.
        table.alter.set_table_properties(changed, post_commithook_properties=keep_log())
        log.info("%s table %s: set %s", name, table.table_uri, changed)


def _newest_commit_checkpointed(table: Any, pipeline: str, options: Mapping[str, str]) -> Any:
    """The table loaded at ``pipeline``'s newest commit, with a checkpoint there: what the
    log is cleaned from (delta-rs cleans below the newest checkpoint at or below the version a
    table is loaded at, and keeps the files from that version up). The table itself if that
    commit is its newest version or the pipeline has none."""
    import pyarrow.fs as pafs
    from deltalake import DeltaTable

    newest = newest_commit_entry(table, pipeline)
    if newest is None or newest[0].table_version == table.version():
        return table
    version = newest[0].table_version
    at_commit = DeltaTable(table.table_uri, version=version, storage_options=dict(options))
    fs, root = filesystem(table.table_uri)
    checkpoint = fs.get_file_info(f"{root}/_delta_log/{version:020d}.checkpoint.parquet")
    if checkpoint.type != pafs.FileType.File:
        at_commit.create_checkpoint()  # once: a paused pipeline's newest commit stays put
    return at_commit


def _vacuum(table: Any, retention: timedelta) -> list[str]:
    """Delete the files removed from the table more than ``retention`` ago (by their
    tombstones; before the run's checkpoint, which would drop the expired ones).

    Not delta-rs's ``full`` vacuum, which deletes every unreferenced file older than the
    retention by its age on disk: a file a writer has written but not yet committed is one
    (a long batch wave's first files), and deleting it loses its rows (a full vacuum with no
    retention beside a committing stream did, in the spark test). Files of a job killed
    before its commit are left for now."""
    return table.vacuum(
        retention_hours=_hours(retention),
        dry_run=False,
        enforce_retention_duration=False,
        post_commithook_properties=keep_log(),
    )


def _hours(duration: timedelta) -> int:
    """Whole hours, rounded up (vacuum takes hours; the setting is at least one)."""
    return math.ceil(duration.total_seconds() / 3600)


def _interval(duration: timedelta) -> str:
    """A Delta table property's duration (``delta.logRetentionDuration`` and the like)."""
    return f"interval {int(duration.total_seconds())} seconds"
