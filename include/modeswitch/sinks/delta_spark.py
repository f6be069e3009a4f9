"""The ``delta_spark`` stream writer: each micro-batch appended by Delta Lake's own Spark writer
inside ``foreachBatch``, with Delta's idempotent-write options.

The stream's other writer, ``python`` (the default), is the ``modeswitch_delta`` data source
(:mod:`modeswitch.sinks.delta`): executors write the files with pyarrow and the driver commits
them with delta-rs. This one hands the write and the commit to delta-spark, the writer every
Spark user runs, and keeps the pipeline's guarantees around it. For micro-batch ``batch_id``
of epoch ``epoch`` (sequence = the option ``sequence`` + ``batch_id``):

1. **Check first.** The micro-batch's offsets come from the query's offsets log (as for the
   other writer). The sink's app transaction for the pipeline is compared with
   ``txn_version(epoch, sequence)``, exactly as :mod:`modeswitch.sinks.committer` does (both
   use :mod:`modeswitch.sinks.fencing`): equal is a replay (skipped, after checking it covers
   the same end offsets), higher is a zombie (:class:`~modeswitch.errors.FencedError`), lower
   goes on, and the micro-batch must start where the pipeline's newest commit ended. Delta's
   own check cannot be the fence: it skips a write whose version is at or below the recorded
   one *silently*, and it keeps the last version written per app id, not the highest.
2. **Describe.** One pass over the (cached) micro-batch in Python workers counts the records,
   takes the max event time per bucket and writes the malformed rows' files into the
   quarantine table's folder (:func:`modeswitch.sinks.files.write_files` without the data).
3. **Write.** ``df.write.format("delta").mode("append")`` of the good rows with ``txnAppId`` =
   the pipeline, ``txnVersion`` = that version and ``userMetadata`` = the commit's record
   (offsets range, epoch, sequence, records, event times, quarantine files: delta-spark can put
   nothing else into ``commitInfo``; :func:`~modeswitch.sinks.commits.user_metadata_record`).
   Delta's transaction closes the race the check leaves open: a commit with the same app id
   landing after its snapshot fails it (``ConcurrentTransactionException``), and one landing
   before makes Delta skip the write.
4. **Check after.** The pipeline's newest commit must now be this one (same version, same end
   offsets); if Delta skipped the write, the quarantine files are removed and the micro-batch
   fails with :class:`~modeswitch.errors.FencedError`, so a skipped write never passes for a
   commit.
5. **Quarantine.** Its files are committed to the quarantine table from the sink commit's
   record (:func:`~modeswitch.sinks.committer.sync_quarantine`), repaired by the next
   micro-batch after a crash between the two, as with the other writer.

Timestamps are written as int64 microseconds (as pyarrow and the other writers do), not
Spark's default INT96. The session needs delta-spark's jars and SQL extension (every session
of ours has them: :mod:`modeswitch.runners.jvm`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from modeswitch.errors import FencedError
from modeswitch.faults import pause_point
from modeswitch.sinks.commits import (
    SinkCommit,
    newest_commit_in,
    user_metadata_record,
)
from modeswitch.sinks.committer import (
    CommitOutcome,
    merged_message,
    quarantine_metadata,
    sync_quarantine,
    with_quarantine,
)
from modeswitch.sinks.delta import stream_commit_range
from modeswitch.sinks.features import check_table_features
from modeswitch.sinks.fencing import check_fencing, check_replay, next_sink_commit, open_sink_table
from modeswitch.sinks.files import DeltaCommitMessage, delete_files, write_files
from modeswitch.sinks.native import WRITE_CONF  # int64 timestamps, as pyarrow writes them
from modeswitch.sinks.options import DeltaSinkOptions
from modeswitch.sinks.parquet_files import WrittenFile
from modeswitch.spark_conf import session_conf
from modeswitch.transforms import QUARANTINE_REASON

log = logging.getLogger(__name__)

DESCRIPTION_SCHEMA = "message string"


@dataclasses.dataclass(frozen=True)
class MicroBatchWriter:
    """The ``foreachBatch`` function of a stream epoch with ``stream_writer = delta_spark``."""

    options: DeltaSinkOptions

    def __call__(self, frame: Any, batch_id: int) -> None:
        write_micro_batch(frame, batch_id, self.options)


def stream_writer(options: Mapping[str, str]) -> MicroBatchWriter:
    """The writer for the sink options a stream epoch gives (:func:`sink_options` with
    ``path``, ``sequence``, ``offsetsStart`` and ``checkpointLocation``), checked now, on the
    driver, before the query starts."""
    parsed = DeltaSinkOptions.parse(options)
    if parsed.pipeline is None or parsed.checkpoint_location is None:
        raise ValueError(
            "the delta_spark stream writer needs options pipeline, epoch and checkpointLocation"
        )
    return MicroBatchWriter(parsed)


def write_micro_batch(frame: Any, batch_id: int, options: DeltaSinkOptions) -> CommitOutcome:
    """Append micro-batch ``batch_id`` to the sink exactly once (see the module's steps)."""
    assert options.pipeline is not None and options.epoch is not None
    sequence = (options.sequence or 0) + batch_id
    start, end = stream_commit_range(options, batch_id)
    table = open_sink_table(options)
    if table is not None:
        if options.quarantine_path:
            # A crash may have come between the last commit and its quarantine commit.
            sync_quarantine(options, table)
        check_table_features(table, f"sink table {options.path}")
    previous = check_fencing(table, options, sequence)
    if previous == "replayed":
        check_replay(table, options, sequence, end)
        return CommitOutcome("replayed", table.version(), None)
    cached = frame.persist()
    message = DeltaCommitMessage()
    commit = None
    try:
        message = describe_micro_batch(cached, options)
        quarantine = quarantine_metadata(message)
        commit = with_quarantine(
            next_sink_commit(
                options,
                sequence,
                start,
                end,
                message.records,
                message.max_event_time_us,
                previous,
            ),
            quarantine,
        )
        data = cached
        if QUARANTINE_REASON in cached.columns:
            data = cached.filter(cached[QUARANTINE_REASON].isNull()).drop(QUARANTINE_REASON)
        writer = (
            data.write.format("delta")
            .mode("append")
            .option("txnAppId", options.pipeline)
            .option("txnVersion", str(commit.txn_version))
            .option("userMetadata", user_metadata_record(commit, quarantine))
        )
        if options.merge_schema:
            writer = writer.option("mergeSchema", "true")
        if options.partition_by:
            writer = writer.partitionBy(*options.partition_by)
        pause_point("sink.between_check_and_commit")
        with session_conf(cached.sparkSession, WRITE_CONF):
            writer.save(options.path)
    except BaseException:
        # The files are the commit's once it has landed (a failure after Delta's commit:
        # its checkpoint, say), and sync_quarantine commits them.
        if commit is None or _landed(options, commit)[1] is None:
            _discard_quarantine_files(options, message)
        raise
    finally:
        cached.unpersist()
    landed, found = _landed(options, commit)
    if found is None:
        _discard_quarantine_files(options, message)
        raise FencedError(
            f"sink {options.path}: delta-spark skipped the write of pipeline "
            f"{options.pipeline!r} epoch {options.epoch} sequence {sequence} (txnVersion "
            f"{commit.txn_version}): another writer committed for the pipeline between this "
            "writer's check and its commit, so this writer is a zombie or a replay out of order"
        )
    pause_point("sink.after_commit")
    if message.quarantine_files:
        pause_point("sink.before_quarantine_commit")
        sync_quarantine(options, landed)
    log.info(
        "sink commit %s (delta-spark): %d records, table version %s",
        commit.txn_version,
        commit.records,
        found.table_version,
    )
    return CommitOutcome("committed", found.table_version, found)


def describe_micro_batch(frame: Any, options: DeltaSinkOptions) -> DeltaCommitMessage:
    """One Spark job over ``frame``: per task, its records and max event time per bucket, and
    its malformed rows written to files in the quarantine table's folder; merged."""
    rows = frame.mapInArrow(
        functools.partial(_describe_task, options), DESCRIPTION_SCHEMA
    ).collect()
    parts = []
    for row in rows:
        part = json.loads(row.message)
        for files in ("files", "quarantine_files"):
            part[files] = [WrittenFile(**f) for f in part[files]]
        part["max_event_time_us"] = {int(b): t for b, t in part["max_event_time_us"].items()}
        parts.append(DeltaCommitMessage(**part))
    return merged_message(parts)


def _describe_task(
    options: DeltaSinkOptions, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    message = write_files(options, batches, write_data=False)
    body = dataclasses.asdict(message)
    yield pa.RecordBatch.from_pydict({"message": [json.dumps(body)]})


def _landed(options: DeltaSinkOptions, commit: SinkCommit) -> tuple[Any, SinkCommit | None]:
    """The sink's snapshot now, and ``commit`` as the log holds it if it is the pipeline's
    newest commit (same app-transaction version and end offsets), else None."""
    assert options.pipeline is not None
    table = open_sink_table(options)
    found = newest_commit_in(table, options.pipeline) if table is not None else None
    if found is None or found.txn_version != commit.txn_version or found.end != commit.end:
        return table, None
    return table, found


def _discard_quarantine_files(options: DeltaSinkOptions, message: DeltaCommitMessage) -> None:
    if options.quarantine_path and message.quarantine_files:
        delete_files(options.quarantine_path, message.quarantine_files)


__all__ = ["MicroBatchWriter", "describe_micro_batch", "stream_writer", "write_micro_batch"]
