"""The backfill job: run one recorded backfill (:mod:`modeswitch.modes.backfill`: the window rule,
the ranges, the guards), read by Spark, committed by deltalake.

**The write.** The batch engine reads those records, filters them to the window, runs the
pipeline's transform and writes Parquet to a staging folder (good and quarantined rows apart,
one read of the source). The window is on the event time the tables hold: the log's, filtered
before the transform (Spark skips Parquet row groups by it), or with ``event_time_field`` set
the payload's, filtered after it. Before committing, :func:`check_replace_is_exact` compares
what the commits would delete with what they write (no record deleted without being written
again, none written twice). Then, per table, ONE Delta commit (deltalake ``write_deltalake`` with
``mode="overwrite"`` and a ``predicate``: Delta's replace-where) deletes what the table holds at
those positions (:func:`~modeswitch.modes.backfill.window_predicate`: the window's event times
within each bucket's ``[lo, hi)``) and adds the new rows; delta-rs checks that every new row matches
the predicate. The commit carries ``txn(appId = <pipeline>/backfill/<start>/<end>, version =
command id)`` (a run of a window whose later run already committed is refused) and, under
:data:`~modeswitch.modes.backfill.BACKFILL_KEY`, the window, mode, run, ranges and counts
(:class:`~modeswitch.modes.backfill.BackfillCommit`). Re-running a run leaves the same rows (one
more commit). The sink's commit and the quarantine's are two commits of two tables, as for live
writes: between them a record that moved from one table to the other (a transform fix) is in
both or neither, and a run killed there is repaired by its retry, which replaces the window in
both again.

**Beside the live pipeline.** Live commits are appends; delta-rs's conflict check lets a
backfill commit land after a live one when the appended files cannot hold a row of the predicate
(file statistics: the event-time bounds keep a past window clear of live files), and otherwise
fails it; the run then commits again on the new snapshot (:data:`COMMIT_ATTEMPTS`). A live
commit that loses its race to a backfill is re-checked and committed by the sink's own retry
(``modeswitch.sinks.committer``): the pipeline never pauses and loses nothing. The backfill
metadata lives under its own key, so nothing of the live pipeline (committed offsets, fencing,
the watermark) sees a backfill commit.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import BackfillRefusedError, FencedError
from modeswitch.modes.backfill import BackfillPlan, PayloadEventTime, backfill_app_id
from modeswitch.modes.backfill_commits import BackfillCommit
from modeswitch.modes.job import JobPlan
from modeswitch.modes.waves import WaveRead, keep_all, transformed_rows
from modeswitch.sinks.commits import keep_log
from modeswitch.state import StateStore
from modeswitch.storage import delta_dataset, remove_tree, retry_commit_races

log = logging.getLogger(__name__)

COMMIT_ATTEMPTS = 10


@dataclass(frozen=True)
class BackfillReport:
    """What one backfill run committed."""

    command: int
    records: int
    quarantined: int
    sink_version: int
    quarantine_version: int | None
    seconds: dict[str, float] = field(default_factory=dict)


def run_backfill(spark: Any, job: JobPlan, command_id: int) -> BackfillReport:
    """Run the backfill recorded as command ``command_id`` with the resolved ``job``
    (:func:`~modeswitch.modes.job.resolve_job`): read, filter, transform, stage, then one
    replace-where commit per table (see the module docstring), and record its end.

    Raises :class:`FencedError` if the command is not a running backfill (its run ended, or a
    later run of its window superseded it)."""
    settings = job.settings
    store = StateStore.from_settings(settings)
    plan = _running_plan(store, settings.pipeline, command_id)
    rule = PayloadEventTime.of(settings)
    if rule != plan.event_time:
        raise BackfillRefusedError(
            f"backfill command {command_id} of window {plan.window} refused: it was planned "
            f"with the event time {plan.event_time or 'of the log'}, and the settings now give "
            f"{rule or 'the log'} (event_time_field changed between the plan and the job); "
            "plan the run again"
        )
    began = time.perf_counter()
    staging = f"{settings.state_root}/backfill/command-{command_id}-{uuid.uuid4().hex[:12]}"
    try:
        df = _read_window(spark, job, plan, scratch=f"{staging}-scratch")
        _stage(df, staging)
        staged = time.perf_counter()
        _running_plan(store, settings.pipeline, command_id)  # not superseded meanwhile
        check_replace_is_exact(
            settings, plan, staging, storage_options=store.tables.storage_options
        )
        sink_commit, quarantine_version = commit_backfill(
            settings, plan, staging, storage_options=store.tables.storage_options
        )
    finally:
        remove_tree(staging)
        remove_tree(f"{staging}-scratch")
    committed = time.perf_counter()
    store.commands.finish_backfill(
        command_id,
        records=sink_commit.records,
        quarantined=sink_commit.quarantined,
        sink_version=sink_commit.table_version,
    )
    report = BackfillReport(
        command=command_id,
        records=sink_commit.records,
        quarantined=sink_commit.quarantined,
        sink_version=int(sink_commit.table_version or 0),
        quarantine_version=quarantine_version,
        seconds={"spark": staged - began, "commit": committed - staged},
    )
    log.info(
        "backfill %s %s (command %d): %d records, %d quarantined; sink version %d; Spark "
        "%.1f s, commits %.1f s",
        plan.mode,
        plan.window,
        command_id,
        report.records,
        report.quarantined,
        report.sink_version,
        report.seconds["spark"],
        report.seconds["commit"],
    )
    return report


def _running_plan(store: StateStore, pipeline: str, command_id: int) -> BackfillPlan:
    command = store.commands.get(command_id)
    if command.kind != "backfill" or command.status != "running":
        raise FencedError(
            f"command {command_id} is a {command.status} {command.kind} command; a backfill "
            "job only runs a running backfill"
        )
    return BackfillPlan.of(pipeline, command)


def _read_window(spark: Any, job: JobPlan, plan: BackfillPlan, *, scratch: str) -> Any:
    """The window's records, transformed: the planned ranges, filtered on event time, read
    and transformed as ``job.waves`` says (:mod:`modeswitch.modes.waves`). The filter comes
    before a Spark form on the log's event time, after the transform on a payload's (the
    transform sets it)."""
    from pyspark.sql import functions as F

    from modeswitch.control.planning import plan_batch

    path = job.waves
    assert path is not None and job.kind == "backfill"
    settings = job.settings
    log.info("backfill command %d: read by %s (%s)", plan.command, path.reader, path.reason)
    in_window = (F.col("event_time") >= F.lit(plan.window.start)) & (
        F.col("event_time") < F.lit(plan.window.end)
    )

    def window(rows: Any) -> Any:
        return rows.where(in_window)

    waves = plan_batch(
        {b: lo for b, (lo, _) in plan.ranges.items()},
        {b: hi for b, (_, hi) in plan.ranges.items()},
        max_split_records=settings.planner.max_split_records,
        wave_records=max(plan.records_bound, 1),
        parallelism=settings.planner.parallelism,
    ).waves
    read = (
        WaveRead.of(waves[0], scratch=scratch, tasks=settings.planner.parallelism)
        if waves
        else WaveRead((), scratch, settings.planner.parallelism)
    )
    on_log_time = plan.event_time is None
    return transformed_rows(
        spark,
        job,
        read,
        before=window if on_log_time else keep_all,
        after=keep_all if on_log_time else window,
    )


def _stage(df: Any, staging: str) -> None:
    """Spark writes the rows as Parquet under ``staging``: ``route=table`` and
    ``route=quarantine`` (the source is read once), with the sink's Parquet settings."""
    from pyspark.sql import functions as F

    from modeswitch.sinks.native import ROUTE_COLUMN, ROUTE_QUARANTINE, ROUTE_TABLE, WRITE_CONF
    from modeswitch.spark_conf import session_conf
    from modeswitch.transforms import QUARANTINE_REASON

    route = F.when(F.col(QUARANTINE_REASON).isNull(), F.lit(ROUTE_TABLE))
    routed = df.withColumn(ROUTE_COLUMN, route.otherwise(F.lit(ROUTE_QUARANTINE)))
    with session_conf(df.sparkSession, WRITE_CONF):
        routed.write.mode("errorifexists").partitionBy(ROUTE_COLUMN).parquet(staging)


def check_replace_is_exact(
    settings: PipelineSettings,
    plan: BackfillPlan,
    staging: str,
    *,
    storage_options: Mapping[str, str] | None = None,
) -> None:
    """Refuse, before either commit, a backfill whose replace-where would lose or double a
    record: per bucket, every position the sink and the quarantine hold in the window within
    the plan's ranges (what the commits delete) must be among the staged rows (what they
    write), and no staged position may be held already with an event time outside the window
    (it would stay beside its new copy).

    Both hold when each record's event time is what it was when its row was written. They
    fail when it is not: ``event_time_field`` set, changed or cleared on a pipeline whose
    tables hold rows of the other rule (their windows are not the records' windows now).
    Raises :class:`BackfillRefusedError` naming the counts, a few positions and the rule.
    Reads the ``bucket``, ``offset`` and ``event_time`` columns of the window's rows and of
    the rows among the staged offsets only."""
    import numpy as np
    import pyarrow.dataset as ds
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    from modeswitch.sinks.native import ROUTE_COLUMN, ROUTE_QUARANTINE, ROUTE_TABLE
    from modeswitch.storage import filesystem

    fs, root = filesystem(staging)
    written: dict[int, Any] = {}
    for route in (ROUTE_TABLE, ROUTE_QUARANTINE):  # both tables' rows are written
        folder = f"{root}/{ROUTE_COLUMN}={route}"
        if fs.get_file_info(folder).type.name == "Directory":
            staged = ds.dataset(folder, format="parquet", filesystem=fs)
            for b, offsets in _positions(staged, None).items():
                written[b] = np.union1d(written.get(b, offsets), offsets)
    start, end = (_utc_micros(moment) for moment in (plan.window.start, plan.window.end))
    bucket, offset, event_time = ds.field("bucket"), ds.field("offset"), ds.field("event_time")
    in_window = (event_time >= start) & (event_time < end)
    ranges = sorted(plan.ranges.items())
    if not ranges:
        return
    # What the commits delete: the window's rows at the ranges' positions.
    deleting = (
        _any((bucket == b) & (offset >= lo) & (offset < hi) for b, (lo, hi) in ranges) & in_window
    )
    # Where a written record may be held already: its bucket's written span, out of the window.
    spans = [
        (bucket == b) & (offset >= int(max(lo, written[b][0]))) & (offset <= int(written[b][-1]))
        for b, (lo, _) in ranges
        if b in written and len(written[b])
    ]
    lost: dict[int, Any] = {}
    doubled: dict[int, Any] = {}
    for uri in (settings.sink, settings.quarantine):
        try:
            table = DeltaTable(uri, storage_options=dict(storage_options or {}))
        except TableNotFoundError:
            continue
        rows = delta_dataset(table)
        for b, held in _positions(rows, deleting).items():
            gone = np.setdiff1d(held, written.get(b, np.empty(0, np.int64)))
            if len(gone):
                lost[b] = np.union1d(lost.get(b, gone), gone)
        if spans:
            for b, held in _positions(rows, _any(spans) & ~in_window).items():
                twice = np.intersect1d(held, written[b])
                if len(twice):
                    doubled[b] = np.union1d(doubled.get(b, twice), twice)
    if not lost and not doubled:
        return

    def listed(found: dict[int, Any], what: str) -> str:
        total = sum(len(v) for v in found.values())
        sample = ", ".join(f"{b}:{int(o)}" for b, v in sorted(found.items()) for o in v[:3])
        return f"{total} records {what} (bucket:offset {sample}{', ...' if total > 3 else ''})"

    problems = []
    if lost:
        problems.append(f"it would delete {listed(lost, 'it does not write again')}")
    if doubled:
        problems.append(f"it would write {listed(doubled, 'held already outside the window')}")
    rule = plan.event_time or "the log's event time"
    raise BackfillRefusedError(
        f"backfill {plan.mode} {plan.window} (command {plan.command}) refused, nothing "
        f"written: {' and '.join(problems)}. The tables' rows got their event time by "
        f"another rule than this run's ({rule}): was event_time_field set, changed or "
        "cleared since they were written? A window of the tables' event times cannot be "
        "backfilled exactly then; rewind the pipeline by offsets to re-derive those rows"
    )


def _utc_micros(moment: Any) -> Any:
    """A moment as an Arrow UTC timestamp scalar in microseconds (the tables' type)."""
    import pyarrow as pa

    return pa.scalar(moment, type=pa.timestamp("us", tz="UTC"))


def _any(conditions: Any) -> Any:
    """The conditions (dataset expressions) OR-ed."""
    import functools
    import operator

    return functools.reduce(operator.or_, conditions)


def _positions(rows: Any, where: Any | None) -> dict[int, Any]:
    """Per bucket, the sorted offsets of a dataset's rows that match ``where``."""
    import numpy as np
    import pyarrow.compute as pc

    found = rows.to_table(columns=["bucket", "offset"], filter=where)  # where=None: all
    out = {}
    for b in pc.unique(found.column("bucket")).to_pylist():
        offsets = pc.filter(found.column("offset"), pc.equal(found.column("bucket"), b))
        out[b] = np.sort(offsets.to_numpy(zero_copy_only=False).astype(np.int64))
    return out


def commit_backfill(
    settings: PipelineSettings,
    plan: BackfillPlan,
    staging: str,
    *,
    storage_options: Mapping[str, str] | None = None,
) -> tuple[BackfillCommit, int | None]:
    """The two replace-where commits of a staged backfill: the sink's, then the
    quarantine's. Returns the sink's commit and the quarantine's version (None when the
    quarantine table neither exists nor gets a row)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from modeswitch.sinks.files import QUARANTINE_SCHEMA
    from modeswitch.sinks.native import ROUTE_COLUMN, ROUTE_QUARANTINE, ROUTE_TABLE
    from modeswitch.storage import filesystem
    from modeswitch.transforms import QUARANTINE_REASON

    options = dict(storage_options or {})
    fs, root = filesystem(staging)

    def staged(route: str) -> ds.Dataset | None:
        folder = f"{root}/{ROUTE_COLUMN}={route}"
        if fs.get_file_info(folder).type.name != "Directory":
            return None
        return ds.dataset(folder, format="parquet", filesystem=fs)

    good, bad = staged(ROUTE_TABLE), staged(ROUTE_QUARANTINE)
    records = good.count_rows() if good is not None else 0
    quarantined = bad.count_rows() if bad is not None else 0
    commit = BackfillCommit(
        pipeline=plan.pipeline,
        command=plan.command,
        run_id=plan.run_id,
        mode=plan.mode,
        window=plan.window,
        ranges=plan.ranges,
        records=records,
        quarantined=quarantined,
        event_time=plan.event_time,
    )
    sink_schema = _table_schema(settings.sink, options)

    def sink_rows() -> pa.RecordBatchReader:
        if good is None:
            return pa.RecordBatchReader.from_batches(sink_schema, iter(()))
        return good.scanner(columns=sink_schema.names).to_reader()

    sink_version = _replace(settings.sink, sink_rows, plan, commit, options, create=False)

    def quarantine_rows() -> pa.RecordBatchReader:
        if bad is None:
            return pa.RecordBatchReader.from_batches(QUARANTINE_SCHEMA, iter(()))
        columns = {
            f.name: ds.field(QUARANTINE_REASON if f.name == "reason" else f.name).cast(f.type)
            for f in QUARANTINE_SCHEMA
        }
        return bad.scanner(columns=columns).to_reader()

    quarantine_version = _replace(
        settings.quarantine, quarantine_rows, plan, commit, options, create=quarantined > 0
    )
    return replace(commit, table_version=sink_version), quarantine_version


def _table_schema(uri: str, options: Mapping[str, str]) -> Any:
    import pyarrow as pa
    from deltalake import DeltaTable

    return pa.schema(DeltaTable(uri, storage_options=dict(options)).schema().to_arrow())


def _replace(
    uri: str,
    rows: Any,
    plan: BackfillPlan,
    commit: BackfillCommit,
    options: Mapping[str, str],
    *,
    create: bool,
) -> int | None:
    """One replace-where commit of ``rows()`` into the table at ``uri``, checked and made again
    on the new snapshot when a concurrent commit conflicts
    (:func:`~modeswitch.storage.retry_commit_races`); the table's new version. A table that does
    not exist is created when ``create`` (else nothing is done, None)."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.exceptions import TableNotFoundError

    app_id = backfill_app_id(plan.pipeline, plan.window)
    properties = CommitProperties(
        app_transactions=[Transaction(app_id, plan.command)],
        custom_metadata=commit.to_metadata(),
    )

    def attempt(number: int) -> int | None:
        try:
            table = DeltaTable(uri, storage_options=dict(options))
        except TableNotFoundError:
            if not create:
                return None
            write_deltalake(
                uri,
                rows(),
                mode="append",
                storage_options=dict(options),
                commit_properties=properties,
                post_commithook_properties=keep_log(),
            )
            return DeltaTable(uri, storage_options=dict(options)).version()
        held = table.transaction_version(app_id)
        if held is not None and held > plan.command:
            raise FencedError(
                f"{uri}: backfill command {plan.command} refused: a later run of window "
                f"{plan.window} (command {held}) has committed since; this run was superseded"
            )
        write_deltalake(  # CommitFailedError: the race was lost, retry_commit_races checks again
            table,
            rows(),
            mode="overwrite",
            predicate=plan.predicate(),
            commit_properties=properties,
            post_commithook_properties=keep_log(),
        )
        return table.version()

    return retry_commit_races(
        attempt, attempts=COMMIT_ATTEMPTS, what=f"{uri}: backfill command {plan.command}"
    )


__all__ = ["BackfillReport", "commit_backfill", "run_backfill"]
