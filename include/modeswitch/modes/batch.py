"""BATCH mode: drain a batch epoch's backlog to its boundary, wave by wave, one sink commit each.

Called by ``jobs/backlog_batch.py``. The epoch (mode, start, boundary) was opened by the
``decide`` step; this module reads it from the control tables and processes what is not yet
committed:

1. ``reconcile()`` repairs the control tables from the sink's log (a wave committed to the
   sink but not recorded is marked committed and never read again; FLIP-537 case 3).
2. If an earlier run of this epoch left splits pending (it failed), they are marked
   ``replanned`` and the rest ``[committed, boundary)`` is planned again, rebalanced, with new
   wave numbers (FLIP-537 case 1). A failed task inside a wave is Spark's to retry; the sink's
   idempotent commit makes the retry harmless (case 2).
3. Each wave goes through the shared transform and is written by the Delta sink in one
   commit carrying the wave's offsets, by the path that
   :func:`~modeswitch.modes.wave_path.choose_wave_path` chooses once from what the log can do,
   the settings and the transform's forms (its module has the table). By default
   (``batch_reader = arrow``) each of the wave's tasks reads its planned ranges, runs the
   transform's Arrow form and writes the files in one Python worker, no row in the JVM, and
   the driver checks the wave's record count (on a contiguous log) and commits
   (:mod:`modeswitch.sinks.arrow_wave`; any log). With ``batch_reader = native`` Spark's
   Parquet reader reads the segment files and, with ``bucketlog``, the Python data source
   reads exactly the planned partitions (on a Kafka topic, ``native`` is Spark's own Kafka
   source, each partition's range of the wave); then Spark's own Parquet writer writes the
   data files and the sink makes the commit, checking the count after a native read
   (``batch_writer = native``; ``python``: the ``modeswitch_delta`` data source).
   Then the ledger, progress and per-bucket "backlog finished" are recorded.

Each wave is its own Spark job and no record is collected to the driver (peak memory:
docs/BENCHMARKS.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from modeswitch.control.planning import BatchPlan, Wave, newly_finished_buckets, plan_batch
from modeswitch.control.quarantine import QuarantineWatch
from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import FencedError
from modeswitch.faults import pause_point
from modeswitch.modes.job import JobPlan
from modeswitch.modes.waves import WAVE_COMMITS, WaveRead
from modeswitch.offsets import OffsetsMap, offsets_to_json
from modeswitch.sinks.commits import latest_sink_commit
from modeswitch.sinks.options import sink_options
from modeswitch.state import StateStore, reconcile
from modeswitch.storage import remove_tree

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchRunReport:
    """What one run of a batch epoch did."""

    epoch: int
    waves: int
    records: int
    committed: OffsetsMap
    finished_buckets: tuple[int, ...]


def plan_remaining(store: StateStore, settings: PipelineSettings, epoch_id: int) -> BatchPlan:
    """The plan for what this epoch still has to read, recorded in the split ledger."""
    began = time.perf_counter()
    epoch = store.epochs.get(epoch_id)
    assert epoch.boundary is not None
    committed = {**epoch.start, **store.progress.committed_offsets()}
    committed = {b: committed.get(b, epoch.start.get(b, 0)) for b in epoch.boundary}
    ledger = store.ledger.splits(epoch_id)
    pending = [s for s in ledger if s.status == "pending"]
    if pending:
        log.info("epoch %d: %d splits of a failed run are re-planned", epoch_id, len(pending))
        store.ledger.mark(epoch_id, [(s.bucket, s.start, s.end) for s in pending], "replanned")
    first_wave = max((s.wave for s in ledger), default=-1) + 1
    planner = settings.planner
    plan = plan_batch(
        committed,
        epoch.boundary,
        max_split_records=planner.max_split_records,
        wave_records=planner.wave_records,
        parallelism=planner.parallelism,
        first_wave_index=first_wave,
    )
    if plan.waves:
        store.ledger.record(epoch_id, plan.waves)
    log.info(
        "epoch %d: %d records to read in %d waves (makespan %d, ideal %.0f), %d splits of %d "
        "buckets planned and recorded in %.2f s",
        epoch_id,
        plan.total_records,
        len(plan.waves),
        plan.makespan,
        plan.ideal_makespan,
        sum(len(wave.splits) for wave in plan.waves),
        len(epoch.boundary),
        time.perf_counter() - began,
    )
    return plan


def scratch_folder(settings: PipelineSettings, name: str = "") -> str:
    """Where native reads keep their snapshots of growing segments (hard links or copies; one
    subfolder per wave, deleted after it), or the folder of them all without ``name``."""
    root = f"{settings.state_root}/scratch"
    return f"{root}/{name}" if name else root


def clear_scratch(settings: PipelineSettings) -> None:
    """Delete what killed jobs left in the scratch folder. Called by a job of the running
    epoch, the only epoch whose jobs may read: a leftover belongs to a dead job, or to a
    zombie of this epoch, whose read then fails and whose write commits nothing (the count
    check)."""
    remove_tree(scratch_folder(settings))


def run_batch_epoch(
    spark,
    job: JobPlan,
    epoch_id: int,
    *,
    on_wave: Callable[[Wave], None] | None = None,
) -> BatchRunReport:
    """Process every uncommitted split of batch epoch ``epoch_id`` with the resolved ``job``
    (:func:`~modeswitch.modes.job.resolve_job`); see the module docstring.

    Raises :class:`FencedError` if the epoch is not a running batch epoch (a retried task of
    an epoch that was closed or superseded must not write).
    """
    settings = job.settings
    path = job.waves
    assert path is not None and job.kind == "batch", f"a {job.kind} job runs no batch waves"
    commit_wave = WAVE_COMMITS[path.writer]
    store = StateStore.from_settings(settings)
    epoch = store.epochs.get(epoch_id)
    if epoch.mode != "batch" or epoch.status != "running" or epoch.boundary is None:
        raise FencedError(
            f"epoch {epoch_id} is a {epoch.status} {epoch.mode} epoch; the backlog batch job "
            "only runs a running batch epoch"
        )
    repaired = reconcile(store)
    if repaired.progress or repaired.splits:
        log.warning("epoch %d: reconciled the control tables from the sink: %s", epoch_id, repaired)
    plan = plan_remaining(store, settings, epoch_id)
    clear_scratch(settings)
    options = sink_options(settings, epoch_id, "batch", columns_from=job.transform.columns_from)
    finished = set(store.ledger.finished(epoch_id))
    if plan.finished_buckets - finished:
        store.ledger.record_finished(epoch_id, sorted(plan.finished_buckets - finished))
        finished |= plan.finished_buckets
    committed = dict(plan.start)
    records = 0
    watch = QuarantineWatch(settings.pipeline, epoch_id, settings.quarantine_warn_fraction)
    log.info(
        "epoch %d: waves read by %s, written by %s (%s)",
        epoch_id,
        path.reader,
        path.writer,
        path.reason,
    )
    for wave in plan.waves:
        start = {b: committed[b] for b in wave.end_offsets()}
        end = wave.end_offsets()
        wave_options = {
            **options,
            "sequence": str(wave.index),
            "offsetsStart": offsets_to_json(start),
            "offsetsEnd": offsets_to_json(end),
        }
        # The writers refuse to commit unless the wave wrote exactly what it planned; only a
        # contiguous log has a count to expect (Kafka's offsets have gaps).
        if path.count_checked:
            wave_options["expectedRecords"] = str(sum(s.end - s.start for s in wave.splits))
        read = WaveRead.of(
            wave, scratch=scratch_folder(settings, f"epoch-{epoch_id}-wave-{wave.index}")
        )
        try:
            commit_wave(spark, job, read, wave_options)
        finally:
            remove_tree(read.scratch)
        pause_point("batch.after_wave_commit")
        commit = latest_sink_commit(
            settings.sink, settings.pipeline, storage_options=store.tables.storage_options
        )
        assert commit is not None and commit.epoch == epoch_id and commit.sequence == wave.index
        store.progress.record(commit, recorded_by="backlog_batch")
        warning = watch.add(commit.records, commit.quarantined, commit.quarantine_reasons)
        if warning is not None:
            log.warning("%s", warning)
        store.ledger.mark(epoch_id, wave.splits, "committed")
        committed.update(end)
        records += commit.records
        done = newly_finished_buckets(epoch.boundary, committed, finished)
        if done:
            store.ledger.record_finished(epoch_id, sorted(done))
            finished |= done
        log.info(
            "epoch %d wave %d: %d records committed; %d/%d buckets finished",
            epoch_id,
            wave.index,
            commit.records,
            len(finished),
            len(epoch.boundary),
        )
        if on_wave is not None:
            on_wave(wave)
    final = {**committed, **store.progress.committed_offsets()}
    return BatchRunReport(epoch_id, len(plan.waves), records, final, tuple(sorted(finished)))
