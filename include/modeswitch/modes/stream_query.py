"""A stream's query built as its :class:`~modeswitch.modes.stream_path.StreamPath` says, with no
branch: the log read by the path's reader (:data:`STREAM_READERS`, by reader and where the
transform runs), the watermark, and the path's writer (:data:`STREAM_WRITERS`).
:func:`sink_stream` is used by a stream epoch (:mod:`modeswitch.modes.stream`) and by the
standby's warm-up (:mod:`modeswitch.modes.warmup`); :func:`checkpoint_conf` is how both set the
session for the query's checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from modeswitch.modes.job import JobPlan
from modeswitch.modes.stream_path import StreamPath
from modeswitch.offsets import offsets_from_json
from modeswitch.sinks.delta import SINK_NAME
from modeswitch.sinks.delta import register as register_sink
from modeswitch.sources.spark import SOURCE_NAME
from modeswitch.sources.spark import register as register_source
from modeswitch.sources.spark_kafka import read_stream
from modeswitch.storage import is_local

LOCAL_CHECKPOINT_CONF: dict[str, str] = {
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
}
"""How Spark writes a local checkpoint's offsets and commit logs (two files per micro-batch).
Its default, the FileContext API, sets each file's permissions with a forked ``chmod`` when
Hadoop has no native library (as here): 46-58 ms per file on this 2-core machine under load,
against 16-19 ms through the FileSystem API (measured, 40 files each, alternating). Both write
aside and rename into place, refusing to replace an existing entry."""


def checkpoint_conf(location: str) -> dict[str, str]:
    """Session settings for a stream whose checkpoint is at ``location``:
    :data:`LOCAL_CHECKPOINT_CONF` for a local folder, none for other filesystems."""
    return dict(LOCAL_CHECKPOINT_CONF) if is_local(location) else {}


def read_kafka_stream(spark: Any, job: JobPlan, source: str, start_json: str) -> Any:
    """Spark's Kafka source on the topic ``source`` from ``start_json`` (with the read limit),
    each micro-batch in ``parallelism`` tasks at most, the transform's Spark form on its
    rows."""
    records = read_stream(
        spark,
        source,
        offsets_from_json(start_json, source="the stream's start"),
        max_records_per_trigger=job.settings.max_records_per_trigger,
        tasks=job.settings.planner.parallelism,
    )
    return job.transform(records)


def bucketlog_stream(spark: Any, source: str, start_json: str, limit: int | None) -> Any:
    """A stream reader of the ``bucketlog`` source from ``start_json`` (with the read limit)."""
    register_source(spark)
    reader = spark.readStream.format(SOURCE_NAME).option("startingOffsets", start_json)
    return reader.options(**({} if limit is None else {"maxRecordsPerTrigger": str(limit)}))


def read_bucketlog_stream(spark: Any, job: JobPlan, source: str, start_json: str) -> Any:
    """The ``bucketlog`` source, the transform's Spark form on its rows."""
    limit = job.settings.max_records_per_trigger
    return job.transform(bucketlog_stream(spark, source, start_json, limit).load(source))


def read_bucketlog_stream_transformed(
    spark: Any, job: JobPlan, source: str, start_json: str
) -> Any:
    """The ``bucketlog`` source running the transform's Arrow form in its reader: the rows
    reach the JVM parsed, with no second trip to Python for the parse."""
    limit = job.settings.max_records_per_trigger
    reader = bucketlog_stream(spark, source, start_json, limit)
    return reader.options(**job.reader_arrow_options).load(source)


STREAM_READERS: Mapping[tuple[str, str], Callable[[Any, JobPlan, str, str], Any]] = {
    ("kafka", "spark"): read_kafka_stream,
    ("bucketlog", "spark"): read_bucketlog_stream,
    ("bucketlog", "arrow"): read_bucketlog_stream_transformed,
}
"""The transformed rows of a stream, by ``StreamPath`` (reader, transform)."""


def write_to_sink(spark: Any, stream: Any, options: dict[str, str], checkpoint: str) -> Any:
    """The ``modeswitch_delta`` sink (``stream_writer = python``)."""
    register_sink(spark)
    return stream.format(SINK_NAME).options(**options)


def write_with_delta_spark(
    spark: Any, stream: Any, options: dict[str, str], checkpoint: str
) -> Any:
    """Delta's own writer in ``foreachBatch`` (``stream_writer = delta_spark``,
    :mod:`modeswitch.sinks.delta_spark`); its options are checked here, before the query
    starts."""
    from modeswitch.sinks.delta_spark import stream_writer

    return stream.foreachBatch(stream_writer(options)).option("checkpointLocation", checkpoint)


STREAM_WRITERS: Mapping[str, Callable[[Any, Any, dict[str, str], str], Any]] = {
    "python": write_to_sink,
    "delta_spark": write_with_delta_spark,
}
"""The writer of a stream, by ``StreamPath.writer``."""


def sink_stream(
    spark,
    job: JobPlan,
    path: StreamPath,
    *,
    source: str,
    start_json: str,
    sink: str,
    options: Mapping[str, str],
    checkpoint: str,
):
    """The query an epoch runs, and the warm-up too: the log ``source`` read from
    ``start_json``, transformed and written to the sink table ``sink`` with ``options``, as
    ``path`` says (:func:`~modeswitch.modes.stream_path.choose_stream_path`: the job's own
    path for an epoch, the warm-up's log's for a warm-up), with the watermark of the
    policy's allowed lateness; a writer without its trigger, not started."""
    frame = STREAM_READERS[path.reader, path.transform](spark, job, source, start_json)
    lateness = int(job.settings.policy.allowed_lateness.total_seconds() * 1000)
    stream = frame.withWatermark("event_time", f"{lateness} milliseconds").writeStream
    options = {
        **options,
        "path": sink,
        "offsetsStart": start_json,
        "checkpointLocation": checkpoint,
    }
    return STREAM_WRITERS[path.writer](spark, stream, options, checkpoint)


__all__ = [
    "LOCAL_CHECKPOINT_CONF",
    "STREAM_READERS",
    "STREAM_WRITERS",
    "checkpoint_conf",
    "sink_stream",
]
