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
from modeswitch.modes.stream_waves import MicroBatchWaves, ReadAhead
from modeswitch.offsets import offsets_from_json
from modeswitch.sinks.delta import SINK_NAME
from modeswitch.sinks.delta import register as register_sink
from modeswitch.sources import log_type
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


def with_watermark(job: JobPlan, frame: Any) -> Any:
    """``frame``'s watermark on ``event_time``, of the policy's allowed lateness."""
    lateness = int(job.settings.policy.allowed_lateness.total_seconds() * 1000)
    return frame.withWatermark("event_time", f"{lateness} milliseconds")


def kafka_records(spark: Any, job: JobPlan, source: str, start_json: str) -> Any:
    """Spark's Kafka source on the topic ``source`` from ``start_json`` (with the read limit),
    each micro-batch in ``parallelism`` tasks at most: the records as read. An ``arrow``
    writer's query reads nothing of them; it takes its micro-batches' offsets."""
    return read_stream(
        spark,
        source,
        offsets_from_json(start_json, source="the stream's start"),
        max_records_per_trigger=job.settings.max_records_per_trigger,
        tasks=job.settings.planner.parallelism,
    )


def read_kafka_stream(spark: Any, job: JobPlan, source: str, start_json: str) -> Any:
    """:func:`kafka_records`, the transform's Spark form on them, watermarked."""
    return with_watermark(job, job.transform(kafka_records(spark, job, source, start_json)))


def bucketlog_stream(spark: Any, source: str, start_json: str, limit: int | None) -> Any:
    """A stream reader of the ``bucketlog`` source from ``start_json`` (with the read limit)."""
    register_source(spark)
    reader = spark.readStream.format(SOURCE_NAME).option("startingOffsets", start_json)
    return reader.options(**({} if limit is None else {"maxRecordsPerTrigger": str(limit)}))


def bucketlog_records(spark: Any, job: JobPlan, source: str, start_json: str) -> Any:
    """The ``bucketlog`` source's records as read (what an ``arrow`` writer's query takes
    its micro-batches' offsets from)."""
    limit = job.settings.max_records_per_trigger
    return bucketlog_stream(spark, source, start_json, limit).load(source)


def read_bucketlog_stream(spark: Any, job: JobPlan, source: str, start_json: str) -> Any:
    """The ``bucketlog`` source, the transform's Spark form on its rows, watermarked."""
    return with_watermark(job, job.transform(bucketlog_records(spark, job, source, start_json)))


def read_bucketlog_stream_transformed(
    spark: Any, job: JobPlan, source: str, start_json: str
) -> Any:
    """The ``bucketlog`` source running the transform's Arrow form in its reader: the rows
    reach the JVM parsed, with no second trip to Python for the parse."""
    limit = job.settings.max_records_per_trigger
    reader = bucketlog_stream(spark, source, start_json, limit)
    return with_watermark(job, reader.options(**job.reader_arrow_options).load(source))


STREAM_READERS: Mapping[tuple[str, str], Callable[[Any, JobPlan, str, str], Any]] = {
    ("kafka", "spark"): read_kafka_stream,
    ("bucketlog", "spark"): read_bucketlog_stream,
    ("bucketlog", "arrow"): read_bucketlog_stream_transformed,
    ("kafka", "wave"): kafka_records,
    ("bucketlog", "wave"): bucketlog_records,
}
"""The rows of a stream, by ``StreamPath`` (reader, transform): transformed and watermarked,
or, for a ``wave`` (the ``arrow`` writer), the records as read, which it does not read."""


def write_to_sink(
    spark: Any, job: JobPlan, source: str, stream: Any, options: dict[str, str]
) -> Any:
    """The ``modeswitch_delta`` sink (``stream_writer = python``)."""
    register_sink(spark)
    return stream.format(SINK_NAME).options(**options)


def write_arrow_waves(
    spark: Any, job: JobPlan, source: str, stream: Any, options: dict[str, str]
) -> Any:
    """Each micro-batch of the log ``source`` an Arrow wave in ``foreachBatch``
    (``stream_writer = arrow``, :mod:`modeswitch.modes.stream_waves`), the first one read
    ahead from here, before the query starts."""
    settings = job.settings
    contiguous = log_type(source).contiguous
    waves = MicroBatchWaves(
        source=source,
        transform=job.arrow.function,
        output=job.arrow.schema,
        options=options,
        count_checked=contiguous,
        max_split_records=settings.planner.max_split_records,
        parallelism=settings.planner.parallelism,
        driver_records=settings.stream_driver_records,
        outage_grace=settings.source_outage_grace.total_seconds(),
        ahead=ReadAhead.begin(
            source,
            offsets_from_json(options["offsetsStart"]),
            job.arrow.function,
            job.arrow.schema,
            options,
            contiguous=contiguous,
            most=min(
                settings.stream_driver_records,
                settings.max_records_per_trigger or settings.stream_driver_records,
            ),
        ),
    )
    return stream.foreachBatch(waves).option("checkpointLocation", options["checkpointLocation"])


def write_with_delta_spark(
    spark: Any, job: JobPlan, source: str, stream: Any, options: dict[str, str]
) -> Any:
    """Delta's own writer in ``foreachBatch`` (``stream_writer = delta_spark``,
    :mod:`modeswitch.sinks.delta_spark`); its options are checked here, before the query
    starts."""
    from modeswitch.sinks.delta_spark import stream_writer

    return stream.foreachBatch(stream_writer(options)).option(
        "checkpointLocation", options["checkpointLocation"]
    )


STREAM_WRITERS: Mapping[str, Callable[[Any, JobPlan, str, Any, dict[str, str]], Any]] = {
    "arrow": write_arrow_waves,
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
    stream = STREAM_READERS[path.reader, path.transform](spark, job, source, start_json).writeStream
    options = {
        **options,
        "path": sink,
        "offsetsStart": start_json,
        "checkpointLocation": checkpoint,
    }
    return STREAM_WRITERS[path.writer](spark, job, source, stream, options)


__all__ = [
    "LOCAL_CHECKPOINT_CONF",
    "STREAM_READERS",
    "STREAM_WRITERS",
    "checkpoint_conf",
    "sink_stream",
]
