"""The ``modeswitch_delta`` sink: a PySpark data source writer that commits to Delta exactly once.

Executors write Parquet files with pyarrow straight into the table's folder (any filesystem
pyarrow supports) and return, in a commit message, the files with their statistics. The
driver then makes one atomic Delta commit per batch write or micro-batch with ``deltalake``.
Nothing but file descriptions reaches the driver.

With ``pipeline`` and ``epoch`` set, every commit also carries the offsets range it covers,
its epoch and mode (see :mod:`modeswitch.sinks.commits`) and a Delta application transaction
``(pipeline, txn_version(epoch, sequence))``. Before committing, the driver checks the
table's transaction version for the pipeline:

- equal: this commit already landed (a replay after a crash); it is skipped and its files
  deleted;
- higher: a later epoch or sequence already committed; this writer is a zombie and is refused
  with :class:`FencedError`;
- lower: the commit goes ahead, made from exactly the snapshot that was checked, with no
  automatic retry. If any other commit landed in between, delta-rs refuses it
  (``CommitFailedError``) and the check is made again on the new snapshot. So two writers
  racing between check and commit cannot both land.

Options:

- ``path``: the table URI. The driver's commits open it with the storage options in its
  ``MODESWITCH_STORAGE_OPTIONS``; a ``storage.<key>`` option overrides one of them (Spark
  prints options in its plans: keep secrets in the environment).
- ``pipeline``, ``epoch``, ``mode`` (``batch`` / ``stream``): the exactly-once protocol.
- ``sequence``: batch writes: the wave's number within the epoch; streaming writes: the
  sequence of the checkpoint's micro-batch 0 (default 0), later ones count on from it.
- ``offsetsStart`` / ``offsetsEnd`` (JSON offsets maps): the source range this write covers.
  Batch writes with a pipeline must give ``offsetsEnd``. Streaming writes read the micro-batch's
  end from Spark's offsets log in ``checkpointLocation``; the start is the previous
  micro-batch's end, or ``offsetsStart`` for the first micro-batch, and 0 for a bucket that
  neither has (one added to the log while the stream runs, read from its first offset).
- ``partitionBy``: comma-separated partition columns (for example an event date column).
- ``mergeSchema``: ``true`` to add new columns to the table; otherwise new columns are an error.
- ``maxRecordsPerFile``: roll files within a task (default 5 000 000).
- ``eventTimeColumn`` (default ``event_time``): its max per ``bucket`` is recorded per commit.

The sink is four modules: :mod:`~modeswitch.sinks.options` (the options),
:mod:`~modeswitch.sinks.files` (the executors' files and statistics),
:mod:`~modeswitch.sinks.committer` (the driver's fenced commit) and
:mod:`~modeswitch.sinks.schema` (schema checks); this one is the PySpark data source that ties
them together.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from modeswitch.errors import ModeswitchError
from modeswitch.offsets import OffsetsMap
from modeswitch.sinks.commits import METADATA_KEY
from modeswitch.sinks.committer import (
    COMMIT_ATTEMPTS,
    QUARANTINE_METADATA_KEY,
    CommitOutcome,
    commit_files,
    commit_quarantine,
    sync_quarantine,
)
from modeswitch.sinks.files import (
    QUARANTINE_SCHEMA,
    DeltaCommitMessage,
    write_files,
)
from modeswitch.sinks.options import DeltaSinkOptions
from modeswitch.sinks.parquet_files import WrittenFile
from modeswitch.sinks.schema import check_schema_before_write
from modeswitch.sinks.stream_offsets import offsets_log_entry
from modeswitch.transforms import QUARANTINE_REASON

log = logging.getLogger(__name__)

SINK_NAME = "modeswitch_delta"


# -- streaming: the micro-batch's offsets from Spark's offsets log ----------------------------
def micro_batch_offsets(checkpoint: str, batch_id: int) -> tuple[OffsetsMap | None, OffsetsMap]:
    """``(start, end)`` of micro-batch ``batch_id`` from the query's offsets log.

    Spark writes ``<checkpoint>/offsets/<id>`` before running a micro-batch; its last line is
    the source's end offsets. The start is the previous micro-batch's end (None for batch 0).
    """
    end = offsets_log_entry(checkpoint, batch_id)
    if end is None:
        raise ModeswitchError(
            f"sink: Spark's offsets log in {checkpoint} has no entry for micro-batch {batch_id}"
        )
    return (offsets_log_entry(checkpoint, batch_id - 1) if batch_id > 0 else None, end)


def stream_commit_range(
    options: DeltaSinkOptions, batch_id: int
) -> tuple[OffsetsMap | None, OffsetsMap | None]:
    """``(start, end)`` a streaming write's micro-batch ``batch_id`` commits: from the offsets
    log (:func:`micro_batch_offsets`), the first micro-batch starting at ``offsetsStart``;
    ``(None, None)`` without a pipeline."""
    if options.pipeline is None:
        return None, None
    if options.checkpoint_location is None:
        raise ValueError("option checkpointLocation: required for streaming writes with a pipeline")
    start, end = micro_batch_offsets(options.checkpoint_location, batch_id)
    if start is None:
        start = options.offsets_start
    if start is not None:
        # A bucket the previous end lacks (a Kafka partition added since) was read from its
        # first offset: the sources start new buckets at their earliest, and Spark's Kafka
        # source fails the query (failOnDataLoss) if that is not 0.
        start = {**dict.fromkeys(end, 0), **start}
    return start, end


# -- the PySpark data source ------------------------------------------------------------------
class DeltaSinkWriter(DataSourceArrowWriter):
    """Batch writes: one Delta commit for the whole write."""

    def __init__(self, options: DeltaSinkOptions, schema: pa.Schema) -> None:
        self.options = options
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        return write_files(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_files(
            self.options,
            self.schema,
            messages,
            sequence=self.options.sequence if self.options.sequence is not None else 0,
            start=self.options.offsets_start,
            end=self.options.offsets_end,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        leave_to_vacuum(self.options, messages, "a write")


class DeltaSinkStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes: one Delta commit per micro-batch; its sequence is the micro-batch id
    plus the option ``sequence`` (0 by default: a stream restarted with a fresh checkpoint
    counts on from the sequences its epoch already committed)."""

    def __init__(self, options: DeltaSinkOptions, schema: pa.Schema) -> None:
        self.options = options
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        return write_files(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        start, end = stream_commit_range(self.options, batchId)
        sequence = (self.options.sequence or 0) + batchId
        commit_files(self.options, self.schema, messages, sequence=sequence, start=start, end=end)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        leave_to_vacuum(self.options, messages, f"micro-batch {batchId}")


def leave_to_vacuum(
    options: DeltaSinkOptions, messages: Sequence[WriterCommitMessage | None], what: str
) -> None:
    """What Spark's ``abort`` of a write does here: nothing to the files, which stay until
    vacuum removes those no version of the table references.

    Spark aborts a write whose commit it lost, and it loses a commit that was still running
    when the query stopped: the policy stops streams between micro-batches, and the commit
    runs in a Python worker of its own, which goes on and lands while (or after) ``abort``
    runs in another. An abort that deleted the tasks' files removed files of a commit that
    had landed (`make soak-faults`, broker seed 200: a micro-batch committed 40 ms after the
    stop, its file gone, the table unreadable). A commit that fails in the committer deletes
    its own files before it lands (:func:`~modeswitch.sinks.committer.commit_files`), and a
    failed task its own (:func:`~modeswitch.sinks.files.write_files`)."""
    parts = [m for m in messages if isinstance(m, DeltaCommitMessage)]
    files = sum(len(m.files) + len(m.quarantine_files) for m in parts)
    if files:
        log.warning(
            "sink %s: %s aborted; its %d files stay until vacuum removes what no commit holds "
            "(the commit may still land)",
            options.path,
            what,
            files,
        )


class DeltaSinkDataSource(DataSource):
    """``df.write.format("modeswitch_delta")`` / ``df.writeStream.format("modeswitch_delta")``."""

    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def writer(self, schema: Any, overwrite: bool) -> DeltaSinkWriter:
        return DeltaSinkWriter(*prepare_write(self.options, schema, overwrite=overwrite))

    def streamWriter(self, schema: Any, overwrite: bool) -> DeltaSinkStreamWriter:
        # Spark asks for a stream writer twice per micro-batch; the table's schema is checked
        # once per worker process and query (every commit checks it again anyway).
        key = (json.dumps(self.options, sort_keys=True, default=str), schema.json(), overwrite)
        prepared = _PREPARED_STREAM_WRITERS.get(key)
        if prepared is None:
            prepared = prepare_write(self.options, schema, overwrite=overwrite, streaming=True)
            while len(_PREPARED_STREAM_WRITERS) >= PREPARED_KEPT:  # the oldest goes
                _PREPARED_STREAM_WRITERS.pop(next(iter(_PREPARED_STREAM_WRITERS)), None)
            _PREPARED_STREAM_WRITERS[key] = prepared
        return DeltaSinkStreamWriter(*prepared)


_PREPARED_STREAM_WRITERS: dict[tuple[str, str, bool], tuple[DeltaSinkOptions, pa.Schema]] = {}
PREPARED_KEPT = 8
"""Stream writers' checked options kept per Python worker: a worker of a shared engine serves
the streams of several pipelines, each kept instead of checked again at every micro-batch."""


def prepare_write(
    raw_options: Mapping[str, str], schema: Any, *, overwrite: bool, streaming: bool = False
) -> tuple[DeltaSinkOptions, pa.Schema]:
    """Parse and check a write's options and Spark schema on the driver, before any file is
    written; return the options and the table's Arrow schema (without the quarantine reason).

    Shared by both data paths: the Python data source writer and Spark's own Parquet writer
    (:mod:`modeswitch.sinks.native`).
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    if overwrite:
        raise ValueError(
            f"{SINK_NAME}: mode overwrite is not supported; the sink only appends "
            "(offsets must never go backwards)"
        )
    options = DeltaSinkOptions.parse(raw_options)
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    if QUARANTINE_REASON in arrow_schema.names:
        if options.quarantine_path is None or options.pipeline is None:
            raise ValueError(
                f"option quarantinePath: the data has a {QUARANTINE_REASON} column, so "
                "malformed records need a quarantine table (and a pipeline); refusing to "
                "write rather than lose them"
            )
        arrow_schema = arrow_schema.remove(arrow_schema.get_field_index(QUARANTINE_REASON))
    if not streaming and options.pipeline is not None and options.offsets_end is None:
        raise ValueError(
            "option offsetsEnd: batch writes with a pipeline must say which source "
            "offsets they cover"
        )
    check_schema_before_write(options, arrow_schema)
    return options, arrow_schema


def register(spark: Any) -> None:
    """Register the ``modeswitch_delta`` sink with a Spark session."""
    spark.dataSource.register(DeltaSinkDataSource)


def vacuum(
    table_uri: str,
    *,
    retention: timedelta = timedelta(days=7),
    dry_run: bool = False,
    storage_options: Mapping[str, str] | None = None,
) -> list[str]:
    """Delete files in the table folder that no table version references and that are older
    than ``retention``: what failed or aborted writes left behind.

    Files younger than ``retention`` are kept, because a running write may be about to commit
    them: keep ``retention`` well above the longest write.
    """
    from deltalake import DeltaTable

    table = DeltaTable(table_uri, storage_options=dict(storage_options or {}))
    hours = retention.total_seconds() / 3600
    return table.vacuum(
        retention_hours=int(hours),
        dry_run=dry_run,
        enforce_retention_duration=False,
        full=True,
    )


__all__ = [
    "COMMIT_ATTEMPTS",
    "METADATA_KEY",
    "QUARANTINE_METADATA_KEY",
    "QUARANTINE_SCHEMA",
    "SINK_NAME",
    "CommitOutcome",
    "DeltaCommitMessage",
    "DeltaSinkDataSource",
    "DeltaSinkOptions",
    "WrittenFile",
    "commit_files",
    "commit_quarantine",
    "micro_batch_offsets",
    "prepare_write",
    "register",
    "stream_commit_range",
    "sync_quarantine",
    "vacuum",
    "write_files",
]
