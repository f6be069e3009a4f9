"""Source logs (the embedded segment log, Kafka) and the ``bucketlog`` Spark data source.

:func:`open_log` is the one place that turns the ``source`` setting into a
:class:`~modeswitch.sources.base.BucketedLog`: every reader of the pipeline's source (``decide``,
the jobs, the Spark data source, ``verify``, the Airflow tasks, the CLI) gets its log from it.
What a kind of log can do (contiguous offsets, Parquet files Spark reads natively) is asked of
:func:`log_type`, never of the source URL.
"""

from __future__ import annotations

from modeswitch.sources.base import BucketedLog


def log_type(source: str) -> type[BucketedLog]:
    """The kind of log that ``source`` (the ``source`` setting) names, not opened:
    ``kafka://<topic>`` a Kafka topic (:class:`~modeswitch.sources.kafka.KafkaLog`), anything
    else (a path or a URI pyarrow can address) the embedded segment log
    (:class:`~modeswitch.sources.segments.SegmentLog`). Its class attributes
    (:class:`~modeswitch.sources.base.LogCapabilities`) say what such a log can do, before
    any log, broker or file is touched."""
    from modeswitch.sources.kafka import KafkaLog, is_kafka_source

    if is_kafka_source(source):
        return KafkaLog
    from modeswitch.sources.segments import SegmentLog

    return SegmentLog


def open_log(source: str) -> BucketedLog:
    """The log that ``source`` (the ``source`` setting) names (:func:`log_type`). Cheap:
    nothing is read until the log is asked, beyond the segment log's small metadata file."""
    return log_type(source)(source)
