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
   than ``vacuum_retention`` ago. The stream keeps committing: its appends land beside the
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

from modeswitch.config import PipelineSettings
from modeswitch.errors import MaintenanceRefusedError
from modeswitch.sinks.history import LogSummary
from modeswitch.state import StateStore
from modeswitch.state.tables import SCHEMAS
from modeswitch.storage import filesystem, retry_commit_races

log = logging.getLogger(__name__)

LOG_RETENTION = "delta.logRetentionDuration"
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
    options = dict(store.storage_options)
    cfg = settings.maintenance
    command = store.claim_maintenance(run_id=run_id, issuer=issuer, lease=cfg.maintenance_lease)
    log.info(
        "pipeline %s: maintenance run %s holds the lease (command %d)",
        settings.pipeline,
        run_id,
        command,
    )

    def hold(**note: Any) -> None:
        if not store.note_run(command, **note):
            raise MaintenanceRefusedError(
                f"maintenance run {run_id!r} (command {command}) lost its lease after "
                f"{cfg.maintenance_lease}: another run superseded it; stopping"
            )

    try:
        kept = store.log_summaries()
        summary = LogSummary.read(
            settings.sink, settings.pipeline, after=kept[-1].through if kept else -1
        )
        hold(log_summary=summary.to_dict())
        tables = []
        for name, uri in (("sink", settings.sink), ("quarantine", settings.quarantine)):
            hold()
            done = maintain_table(
                name,
                uri,
                target_mb=cfg.compact_target_mb,
                retention_hours=_hours(cfg.vacuum_retention),
                log_retention=cfg.log_retention,
                storage_options=options,
            )
            if done is not None:
                tables.append(done)
        hold()
        merged = store.downsample_progress(cfg.progress_horizon, now=now)
        for name in SCHEMAS:
            hold()
            done = maintain_control_table(store, name, retention_hours=_hours(cfg.vacuum_retention))
            if done is not None:
                tables.append(done)
        from modeswitch.orchestration import clean_checkpoints

        hold()
        removed = clean_checkpoints(settings, store, keep=settings.stream_checkpoints_kept)
    except BaseException as exc:  # a task timeout or a signal too: the lease is released
        store.finish_run(command, error=f"{type(exc).__name__}: {exc}")
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
    store.finish_run(
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
    retention_hours: int,
    log_retention: timedelta | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> TableMaintenance | None:
    """Compact, checkpoint, clean the log of and vacuum one data table; None if it does not
    exist. ``log_retention``: the table's ``delta.logRetentionDuration`` to set first (None:
    leave it).

    Log cleanup removes the commit files below the newest checkpoint that are older than the
    table's ``delta.logRetentionDuration``; delta-rs writers do the same on their own after
    each checkpoint (measured), so the run's log summary, read just before, covers every file
    that can go unless the retention is shorter than the time between runs (the audit then
    reports the files no summary covers)."""
    from deltalake import CommitProperties, DeltaTable
    from deltalake.exceptions import TableNotFoundError

    began = time.monotonic()
    options = dict(storage_options or {})
    try:
        table = DeltaTable(uri, storage_options=options)
    except TableNotFoundError:
        return None
    files_before = len(table.file_uris())
    log_before = log_bytes(uri)
    if log_retention is not None:
        wanted = f"interval {int(log_retention.total_seconds())} seconds"
        if table.metadata().configuration.get(LOG_RETENTION) != wanted:
            # A metadata commit: a stream commit racing it fails Delta's check and retries.
            table.alter.set_table_properties({LOG_RETENTION: wanted})
            log.info("%s table %s: %s set to %s", name, uri, LOG_RETENTION, wanted)

    def compact(number: int) -> dict[str, Any]:
        fresh = DeltaTable(uri, storage_options=options)
        return fresh.optimize.compact(
            target_size=target_mb * 2**20,
            commit_properties=CommitProperties(custom_metadata={"modeswitch.maintain": name}),
        )

    retry_commit_races(compact, attempts=COMPACT_ATTEMPTS, what=f"compaction of {name} table {uri}")
    newest = DeltaTable(uri, storage_options=options)
    newest.create_checkpoint()  # after the compaction: readers load one file's add action
    newest.cleanup_metadata()  # log files below it older than delta.logRetentionDuration
    vacuumed = DeltaTable(uri, storage_options=options).vacuum(
        retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False
    )
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
    store: StateStore, name: str, *, retention_hours: int
) -> TableMaintenance | None:
    """Rewrite one control table into one file (the same compare-and-swap rewrite its writers
    make every ``compact_at_files`` writes), checkpoint it, clean its log and vacuum it."""
    began = time.monotonic()
    control = store.control_table(name)
    table = control.load()
    if table is None:
        return None
    files_before = len(table.file_uris())
    log_before = log_bytes(control.uri)
    control.compact(at_files=2, whole=True)
    table = control.load()
    assert table is not None
    table.create_checkpoint()
    table.cleanup_metadata()
    vacuumed = table.vacuum(
        retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False
    )
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


def _hours(duration: timedelta) -> int:
    """Whole hours, rounded up (vacuum takes hours; the setting is at least one)."""
    return max(1, math.ceil(duration.total_seconds() / 3600))
