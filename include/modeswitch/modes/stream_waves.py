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

That first micro-batch is read ahead (:class:`ReadAhead`): while Spark starts the query (its
source's process, the trigger, the offsets log: 0.4-0.5 s in which the driver's Python mostly
waits), a thread of the driver reads, transforms and writes the records between the query's
start offsets and the log's latest into an attempt folder of its own, uncommitted; the first
micro-batch then reads, transforms and writes only what came after, and commits both in its one
exactly-once commit (:func:`~modeswitch.sinks.arrow_wave.write_prepared_wave`'s ``ahead``), its
record count checked against its offsets as always. What was written ahead is used only by a
micro-batch that begins where it does and reaches at least as far, on a contiguous log
(:meth:`ReadAhead.begin`); otherwise it is deleted and the micro-batch reads its whole range.

What Spark's own reports lose: the query's progress counts no input rows (its reader never
runs), so a micro-batch's records are those of its sink commit (the pipeline's progress table
and metrics count from those). A replayed micro-batch (the query restarted between the sink's
commit and Spark's) is found by the commit and its files removed, as with the other writers.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pyarrow as pa

from modeswitch.control.planning import plan_batch
from modeswitch.errors import SourceUnavailableError
from modeswitch.offsets import OffsetsMap
from modeswitch.sinks.arrow_wave import (
    WrittenAhead,
    discard_ahead,
    write_ahead,
    write_prepared_wave,
)
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


def read_ahead_ends(start: OffsetsMap, latest: OffsetsMap, *, most: int) -> OffsetsMap:
    """Where to read a query's first micro-batch ahead to, per bucket (:class:`ReadAhead`): the
    log's ``latest`` offsets when ``[start, latest)`` holds at most ``most`` records (what a
    micro-batch run in the driver holds); else ``start``, nothing ahead."""
    ahead = sum(max(0, latest[b] - start.get(b, 0)) for b in latest)
    if ahead > most:
        return dict(start)
    return {**start, **{b: max(latest[b], start.get(b, 0)) for b in latest}}


Ahead = tuple[OffsetsMap, DeltaSinkOptions, WrittenAhead]
"""Where a read ahead ended, per bucket, the options it wrote with, and what it wrote."""


class ReadAhead:
    """A query's first micro-batch, read, transformed and written on a thread of the driver
    while Spark starts the query (the module docstring; :meth:`begin`). :meth:`take` hands it
    to the first micro-batch, to commit with what it reads itself; a query that stops before
    its first micro-batch leaves it to :func:`discard_untaken`."""

    def __init__(
        self, start: OffsetsMap, ahead: Future[Ahead] | None, checkpoint: str = ""
    ) -> None:
        self.start = dict(start)
        self.checkpoint = checkpoint  # its query's, the key :func:`discard_untaken` finds it by
        self._lock = threading.Lock()
        self._ahead = ahead

    @classmethod
    def nothing(cls) -> ReadAhead:
        """Nothing read ahead: every micro-batch reads its whole range."""
        return cls({}, None)

    @classmethod
    def begin(
        cls,
        source: str,
        start: OffsetsMap,
        transform: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
        output: Any,
        options: dict[str, str],
        *,
        contiguous: bool,
        most: int,
    ) -> ReadAhead:
        """Start reading the log at ``source`` from ``start`` to the ends
        :func:`read_ahead_ends` gives when the thread asks the log, on a thread of its own,
        transformed by ``transform`` (an Arrow form whose output has the Spark schema
        ``output``) and written into the sink of ``options`` (not committed); kept until taken
        under the query's ``checkpointLocation``. A log that is not ``contiguous`` (a Kafka
        topic) is not read ahead: a micro-batch's record count is not checked against its
        offsets there, so nothing would catch a read ahead that gave other records than the
        micro-batch's own read."""
        if not contiguous:
            return cls.nothing()
        ahead: Future[Ahead] = Future()

        def read() -> None:
            try:
                began = time.perf_counter()
                parsed, _ = prepare_write(options, output, overwrite=False, streaming=True)
                source_log = open_log(source)
                latest = source_log.latest_offsets()
                ends = read_ahead_ends(start, latest, most=most)
                ranges = [(b, start.get(b, 0), e) for b, e in ends.items() if e > start.get(b, 0)]
                written = write_ahead(source, source_log, ranges, transform, output, parsed)
                log.info(
                    "read ahead %d records of the first micro-batch in %.2f s",
                    sum(e - s for _, s, e in ranges),
                    time.perf_counter() - began,
                )
                ahead.set_result((ends, parsed, written))
            except BaseException as exc:
                ahead.set_exception(exc)

        read_ahead = cls(start, ahead, options.get("checkpointLocation", ""))
        with _UNTAKEN_LOCK:
            _UNTAKEN[read_ahead.checkpoint] = read_ahead
        threading.Thread(target=read, name="read-ahead", daemon=True).start()
        return read_ahead

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the read ahead has ended, if it has not been taken (its own error, if
        it failed, is :meth:`take`'s to report)."""
        with self._lock:
            ahead = self._ahead
        if ahead is not None:
            concurrent.futures.wait([ahead], timeout=timeout)

    def take(
        self, start: OffsetsMap, end: OffsetsMap, runs_in: str
    ) -> tuple[OffsetsMap, WrittenAhead]:
        """For a micro-batch of ``[start, end)`` run in ``runs_in``: where the read ahead ended
        and what it wrote, if it begins at this micro-batch's start, ends within its range and
        the micro-batch runs in the driver (its wave then is the one task, so nothing is
        written twice); else ``start`` and nothing (it reads its whole range), what was written
        ahead deleted. Given once, to the first micro-batch that asks (which waits for the read
        to end); every later one gets nothing."""
        nothing = (dict(start), WrittenAhead())
        taken = self._taken()
        if taken is None:
            return nothing
        ends, parsed, written = taken
        begins_here = all(start.get(b, 0) == self.start.get(b, 0) for b in {*start, *self.start})
        within = all(at <= end.get(b, start.get(b, 0)) for b, at in ends.items())
        if begins_here and within and runs_in == "driver":
            return ends, written
        discard_ahead(parsed, written)
        return nothing

    def discard(self) -> None:
        """Delete what was read ahead, unless a micro-batch took it (waits for the read)."""
        taken = self._taken()
        if taken is not None:
            discard_ahead(taken[1], taken[2])

    def _taken(self) -> Ahead | None:
        """The read ahead, once (waited for); None if it was taken before or failed."""
        with self._lock:
            ahead, self._ahead = self._ahead, None
        if ahead is None:  # every micro-batch after the first: no other lock, no lookup
            return None
        with _UNTAKEN_LOCK:
            if _UNTAKEN.get(self.checkpoint) is self:
                del _UNTAKEN[self.checkpoint]
        try:
            return ahead.result()
        except Exception as exc:
            log.warning("the first micro-batch was not read ahead, it reads its range: %s", exc)
            return None


_UNTAKEN: dict[str, ReadAhead] = {}
"""The read aheads no micro-batch has taken yet, by their query's checkpoint location."""
_UNTAKEN_LOCK = threading.Lock()


def discard_untaken(checkpoint: str) -> None:
    """Delete what was read ahead for the query of ``checkpoint`` if no micro-batch took it
    (the query stopped, or failed to start, before its first micro-batch): a stream epoch's
    end calls this, so nothing written ahead outlives its query uncommitted."""
    with _UNTAKEN_LOCK:
        ahead = _UNTAKEN.pop(checkpoint, None)
    if ahead is not None:
        ahead.discard()


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
    ahead: ReadAhead = field(default_factory=ReadAhead.nothing, compare=False)
    """The first micro-batch, read ahead while the query starts."""

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
        read_from, written = self.ahead.take(start, end, runs_in)
        partitions = micro_batch_partitions(
            read_from, end, max_split_records=self.max_split_records, parallelism=tasks
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
            ahead=written,
        )


__all__ = [
    "MicroBatchWaves",
    "ReadAhead",
    "discard_untaken",
    "micro_batch_partitions",
    "read_ahead_ends",
    "where_micro_batch_runs",
]
