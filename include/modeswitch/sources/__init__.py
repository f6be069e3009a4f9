"""Source logs (the embedded segment log, Kafka) and the ``bucketlog`` Spark data source.

:func:`open_log` is the one place that turns the ``source`` setting into a
:class:`~modeswitch.sources.base.BucketedLog`: every reader of the pipeline's source (``decide``,
the jobs, the Spark data source, ``verify``, the Airflow tasks, the CLI) gets its log from it.
"""

from __future__ import annotations

from modeswitch.sources.base import BucketedLog


def open_log(source: str) -> BucketedLog:
    """The log that ``source`` (the ``source`` setting) names: ``kafka://<topic>`` a Kafka
    topic (:mod:`modeswitch.sources.kafka`), anything else (a path or a URI pyarrow can
    address) the embedded segment log. Cheap: nothing is read until the log is asked."""
    from modeswitch.sources.kafka import KafkaLog, is_kafka_source

    if is_kafka_source(source):
        return KafkaLog(source)
    from modeswitch.sources.segments import SegmentLog

    return SegmentLog(source)
