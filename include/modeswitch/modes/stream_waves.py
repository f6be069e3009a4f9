"""The ``arrow`` stream writer: each micro-batch of a stream epoch committed as an Arrow wave.

The query is Spark's own (its source, trigger, checkpoint and offsets log, its progress and
its retries) but its micro-batch DataFrame is not read: in ``foreachBatch`` the micro-batch's
offsets (from the query's offsets log, :func:`~modeswitch.sinks.delta.stream_commit_range`) are
read, transformed and written as a batch wave's are (:mod:`modeswitch.sinks.arrow_wave`: the
log's own reader, the transform's Arrow form, the sink's pyarrow writer), and committed with
the pipeline's exactly-once commit, sequence = the option ``sequence`` + the micro-batch id.
No record crosses between the JVM and Python.

Where the wave's work runs is :func:`where_micro_batch_runs`'s choice, by the micro-batch's
size: a micro-batch of at most ``stream_driver_records`` records runs in the driver's own
process, with no Spark job at all; a larger one (a catch-up, the first micro-batch after a long
batch) in Spark tasks, cut as the planner cuts a wave (:func:`micro_batch_partitions`). A
job with Python tasks costs 100-130 ms here before it reads a record (a trivial
``mapInArrow`` of two tasks on a warm session), which is most of a live micro-batch; the driver
reads, parses and writes about 3.5 µs a record, so up to the default read limit (100 000) it is
the faster here: the first micro-batch after a 10 s batch (55-59 k records) took 0.41-0.75 s in
the driver against 0.57-1.02 s in tasks (docs/BENCHMARKS.md).

What Spark's own reports lose: the query's progress counts no input rows (its reader never
runs), so a micro-batch's records are those of its sink commit (the pipeline's progress table
and metrics count from those). A replayed micro-batch (the query restarted between the sink's
commit and Spark's) is found by the commit and its files removed, as with the other writers.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pyarrow as pa

from modeswitch.control.planning import plan_batch
from modeswitch.errors import SourceUnavailableError
from modeswitch.offsets import OffsetsMap
from modeswitch.sinks.arrow_wave import write_prepared_wave
from modeswitch.sinks.committer import CommitOutcome
from modeswitch.sinks.delta import prepare_write, stream_commit_range
from modeswitch.sinks.options import DeltaSinkOptions
from modeswitch.sources import open_log
from modeswitch.sources.base import BucketedLog

log = logging.getLogger(__name__)

Ranges = tuple[tuple[int, int, int], ...]


def where_micro_batch_runs(records: int, driver_records: int, parallelism: int) -> tuple[str, int]:
    """Where a micro-batch of ``records`` runs (:data:`~modeswitch.sinks.arrow_wave.TASK_RUNNERS`)
    and in how many partitions: ``driver`` and one (one file per table, not one per task) for
    at most ``driver_records``, else ``spark`` and ``parallelism``; see the module docstring."""
    return ("driver", 1) if records <= driver_records else ("spark", parallelism)


def micro_batch_partitions(
    start: OffsetsMap, end: OffsetsMap, *, max_split_records: int, parallelism: int
) -> tuple[Ranges, ...]:
    """The ranges ``[start, end)`` per bucket, cut and balanced into at most ``parallelism``
    partitions as the planner cuts one wave (:func:`~modeswitch.control.planning.plan_batch`);
    one empty partition when there is nothing to read (Kafka's offsets may move over
    transaction markers only), so the micro-batch still commits its offsets."""
    total = sum(end[b] - start.get(b, 0) for b in end)
    plan = plan_batch(
        start,
        end,
        max_split_records=max_split_records,
        wave_records=max(1, total),
        parallelism=parallelism,
    )
    if not plan.waves:
        return ((),)
    return tuple(
        tuple((s.bucket, s.start, s.end) for s in partition)
        for partition in plan.waves[0].partitions
    )


@dataclass(frozen=True)
class MicroBatchWaves:
    """The ``foreachBatch`` function of a stream epoch with the ``arrow`` writer."""

    source: str
    transform: Any  # the transform's Arrow form (a callable on Arrow batches)
    output: Any  # its Spark schema, with the quarantine reason
    options: dict[str, str]
    """The sink options of the epoch's writes (``path``, ``sequence``, ``offsetsStart``,
    ``checkpointLocation`` among them)."""
    count_checked: bool
    """Whether the log is contiguous, so a micro-batch's offsets are its record count."""
    max_split_records: int
    parallelism: int
    driver_records: int
    outage_grace: float = 0.0
    """Seconds a micro-batch is tried again while its source does not answer (a Kafka broker
    restarting: ``source_outage_grace``), as the query's own source rides it out."""
    retry_pause: float = 1.0

    @cached_property
    def prepared(self) -> tuple[DeltaSinkOptions, pa.Schema]:
        """The epoch's sink options and the table's schema, checked once per query
        (:func:`~modeswitch.sinks.delta.prepare_write`; each commit checks the table again)."""
        return prepare_write(self.options, self.output, overwrite=False, streaming=True)

    @cached_property
    def log(self) -> BucketedLog:
        """The log, open for the query's life: its clients (a Kafka consumer) are kept from
        one micro-batch run in the driver to the next."""
        return open_log(self.source)

    def __call__(self, frame: Any, batch_id: int) -> CommitOutcome:
        """Commit micro-batch ``batch_id``; a wave whose source did not answer wrote nothing
        that stays (its folders are removed before its commit), so it is tried again until
        :attr:`outage_grace` is spent, then fails naming the source."""
        began = time.monotonic()
        while True:
            try:
                return self.write(frame, batch_id)
            except SourceUnavailableError as exc:
                silent = time.monotonic() - began
                if silent >= self.outage_grace:
                    raise SourceUnavailableError(
                        f"micro-batch {batch_id}: the source has not answered for {silent:.0f} s "
                        f"(source_outage_grace {self.outage_grace:g} s): {exc}"
                    ) from exc
                log.warning(
                    "micro-batch %d: the source did not answer, trying again: %s", batch_id, exc
                )
                time.sleep(self.retry_pause)

    def write(self, frame: Any, batch_id: int) -> CommitOutcome:
        """One try of micro-batch ``batch_id`` (see the module docstring)."""
        epoch, schema = self.prepared
        start, end = stream_commit_range(epoch, batch_id)
        assert start is not None and end is not None, "a stream epoch's writes have a pipeline"
        records = sum(end[b] - start.get(b, 0) for b in end)
        runs_in, tasks = where_micro_batch_runs(records, self.driver_records, self.parallelism)
        partitions = micro_batch_partitions(
            start, end, max_split_records=self.max_split_records, parallelism=tasks
        )
        micro_batch = dataclasses.replace(
            epoch,
            sequence=(epoch.sequence or 0) + batch_id,
            offsets_start=start,
            offsets_end=end,
            expected_records=records if self.count_checked else None,
        )
        return write_prepared_wave(
            frame.sparkSession,
            self.source,
            partitions,
            self.transform,
            self.output,
            micro_batch,
            schema,
            runs_in=runs_in,
            source_log=self.log,
        )


__all__ = ["MicroBatchWaves", "micro_batch_partitions", "where_micro_batch_runs"]
