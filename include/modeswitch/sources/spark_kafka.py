"""A Kafka topic read by Spark's own Kafka source (``format("kafka")``, spark-sql-kafka-0-10).

The stream job reads a ``kafka://`` source this way: JVM consumers in the executors, no record
through Python before the transform, offsets checkpointed by Spark as for any Kafka stream.
:func:`read_stream` gives the source's rows in the pipeline's record schema
(:data:`~modeswitch.sources.base.RECORD_SCHEMA`: ``bucket, offset, event_time, key, value``),
row for row what :class:`~modeswitch.sources.kafka.KafkaLog` reads from the same range:

- ``bucket`` is the partition, ``offset`` the Kafka offset;
- ``event_time`` is the message timestamp, or the value's top-level JSON field named by
  ``kafka://<topic>?event_time=<field>`` (epoch milliseconds, or ISO-8601 with a zone; a record
  whose field is missing, of another type or unreadable keeps its timestamp);
- ``key`` and ``value`` are the bytes as UTF-8 text, or where they are not UTF-8,
  :data:`~modeswitch.sources.kafka.NOT_UTF8_PREFIX` and their base64 (the transform
  quarantines such a value: "value is not UTF-8");
- ``headers`` only with ``kafka://<topic>?headers=true``: Spark's own column
  (``includeHeaders``), which :class:`~modeswitch.sources.kafka.KafkaLog` gives alike.

A stream subscribes to the topic (a partition added while it runs is read from its earliest
offset), a batch read takes exact ranges with ``assign``; both under
``isolation.level=read_committed``: aborted transactions are never read, and "latest" is each
partition's last stable offset, where an open transaction holds the end (the planner's boundary
for a batch is the same). Spark's offsets log holds ``{"<topic>": {"<partition>": offset}}``;
:func:`modeswitch.sinks.stream_offsets.offsets_log_entry` reads it for the sink's fenced commits.

**Client configuration.** :func:`java_options` turns the librdkafka settings
(``MODESWITCH_KAFKA_CONFIG``, or the Airflow Connection's extras) into the Java client's
``kafka.*`` options; how the client authenticates (SASL, mutual TLS, OAUTHBEARER) is
:mod:`modeswitch.sources.kafka_security`'s. They are options of the query, set in-process
(never on a command line); Spark redacts an option in plans, the UI and the event log when its
key or its value matches ``spark.redaction.regex`` (``password``, ``secret``, ``token``, ...,
and ``keystore.key``: ``modeswitch.runners.session.REDACTION_REGEX``), and the SASL
credentials travel in ``kafka.sasl.jaas.config``, whose value names ``password`` or
``clientSecret``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from modeswitch.control.locations import HEADERS_COLUMN
from modeswitch.errors import ConfigError
from modeswitch.offsets import OffsetsMap
from modeswitch.sources.kafka import NOT_UTF8_PREFIX, KafkaLocation, KafkaLog, kafka_config
from modeswitch.sources.kafka_security import SECURITY_SETTINGS, java_security

SPARK_FORMAT = "kafka"
EARLIEST = -2
"""A partition's start in the Kafka source's offsets JSON: its earliest offset."""

_SAME_NAME = frozenset(
    {
        "bootstrap.servers",
        "client.id",
        "client.dns.lookup",
        "connections.max.idle.ms",
        "fetch.max.bytes",
        "fetch.min.bytes",
        "max.partition.fetch.bytes",
        "metadata.max.age.ms",
        "reconnect.backoff.max.ms",
        "reconnect.backoff.ms",
        "request.timeout.ms",
        "retry.backoff.ms",
        "sasl.kerberos.service.name",
        "socket.connection.setup.timeout.ms",
        "socket.connection.setup.timeout.max.ms",
        "ssl.endpoint.identification.algorithm",
    }
)
"""librdkafka settings with the same name and meaning in the Java client."""

_LIBRDKAFKA_ONLY = frozenset(
    {
        # Consumer behaviour the Kafka source sets itself, or that has no Java counterpart
        # and changes nothing about what is read.
        "group.id",
        "isolation.level",
        "auto.offset.reset",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "enable.partition.eof",
        "fetch.wait.max.ms",
        "queued.min.messages",
        "queued.max.messages.kbytes",
        "statistics.interval.ms",
        "debug",
        "log_level",
        "api.version.request",
        "broker.version.fallback",
        # Producer settings (the demo's producer shares the configuration).
        "compression.type",
        "linger.ms",
        "batch.num.messages",
        "queue.buffering.max.messages",
        "queue.buffering.max.ms",
        "acks",
        "enable.idempotence",
        "transactional.id",
    }
)
"""librdkafka settings the Java consumer of a read does not need: left out."""


def java_options(config: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The Kafka source's ``kafka.*`` client options for librdkafka's ``config`` (by default
    the configuration in force: :func:`~modeswitch.sources.kafka.kafka_config`).

    Translated: how the client proves who it is (``security.protocol``, SASL PLAIN or SCRAM,
    mutual TLS with PEM files or a PKCS#12 keystore, OAUTHBEARER at an OIDC token endpoint,
    ``ssl.ca.location``: :func:`~modeswitch.sources.kafka_security.java_security`); settings
    of the same name in both clients pass as they are; librdkafka's own consumer and producer
    settings are left out. Anything else is refused with a :class:`ConfigError` naming the
    setting (never its value): a setting silently dropped could be the one that makes the
    connection secure.
    """
    config = dict(kafka_config() if config is None else config)
    options: dict[str, str] = {"kafka.isolation.level": "read_committed"}
    for key, value in config.items():
        if key in _LIBRDKAFKA_ONLY or key in SECURITY_SETTINGS or key == "logger":
            continue
        if key not in _SAME_NAME:
            raise ConfigError(
                f"kafka client setting {key!r}: Spark's Kafka source (the Java client) has no "
                "setting modeswitch knows to match it; remove it, or use one of "
                + ", ".join(sorted(_SAME_NAME | SECURITY_SETTINGS)),
                setting=key,
            )
        options[f"kafka.{key}"] = str(value)
    options |= {f"kafka.{key}": value for key, value in java_security(config).items()}
    return options


def topic_offsets_json(topic: str, offsets: OffsetsMap) -> str:
    """``{"<topic>": {"<partition>": offset}}``: offsets as the Kafka source's options and
    its offsets log write them."""
    return json.dumps({topic: {str(b): int(offsets[b]) for b in sorted(offsets)}})


STREAM_FETCH_MAX_WAIT_MS = 0
"""The stream's ``kafka.fetch.max.wait.ms`` (the Java client's default: 500). A consumer sends
the next fetch of its partition before it hands back what it has; when a micro-batch ends at
the partition's end, that fetch waits at the broker for new records. Spark keeps the consumer
for the next micro-batch, whose first read of the partition waits for that pending fetch: up to
the whole 500 ms, partition after partition. A micro-batch reads only offsets that exist, so
the broker need never wait. Measured here (a Spark session reading a topic of 16 partitions at
5 000 records/s, 100 ms trigger, a ``count()`` per micro-batch, medians over 25 s): 464 ms a
micro-batch with the default, 254 ms with 0."""


STREAM_API_TIMEOUT_MS = 20_000
"""The stream's ``kafka.default.api.timeout.ms`` (the Java client's default: 60 000). Spark asks
the broker for the latest offsets in the query's own thread, which ``stop()`` does not
interrupt: with the broker down, a job that ends its stream (the policy, a command, or
``source_outage_grace`` spent) waited up to the whole 60 s here (21 to 61 s from the broker's
loss to the job's failure, ``tests/kafka/test_broker_faults.py``). Spark tries the request 3
times (``fetchOffset.numRetries``), so a query still rides out a minute's restart. Each request
times out after half of it (``kafka.request.timeout.ms``, unless the configuration sets it: the
admin client refuses an API timeout below it)."""


READ_MAX_POLL_RECORDS = 10_000
"""Every read's ``kafka.max.poll.records`` (the Java client's default: 500). Before each poll
Spark's Kafka source seeks its consumer to the offset it wants (which drops what the consumer
had fetched beyond the records the last poll returned), and after it asks the broker for the
partition's earliest and latest offsets: with polls of 500 records the broker sends each
partition's data again and again, and answers two offset requests every 500 records. Measured
here (``bench/bench_kafka.py --only k4``: 10 M records in 16 partitions to ``noop``, the Apache
Kafka broker on loopback, one run each the same hour): the read took 21.6 s with the default
(the broker 7.8 CPU-s, the job's peak 754 MB), 13.5 s with 10 000 (1.9 CPU-s, 1 040 MB), 13.0 s
with 100 000 (1.3 CPU-s, 1 363 MB)."""


def read_stream(
    spark,
    source: str,
    start: OffsetsMap,
    *,
    max_records_per_trigger: int | None = None,
    tasks: int | None = None,
    config: Mapping[str, Any] | None = None,
):
    """A streaming DataFrame of the topic ``source`` (``kafka://...``) from exactly ``start``
    (each partition's next offset), in the record schema; see the module docstring. The query
    subscribes to the topic: a partition added while it runs is read from its earliest offset.
    ``max_records_per_trigger`` caps the offsets a micro-batch spans (``maxOffsetsPerTrigger``:
    an upper bound on its records, as offsets have gaps).

    ``tasks``: read (and transform and write) each micro-batch in at most this many tasks, each
    reading several partitions one after the other (``coalesce``, no shuffle), where the topic
    has more partitions. Spark's Kafka source makes a task of every partition, and a live
    micro-batch of a few thousand records over 16 partitions spends its time starting tasks
    (and writing 16 small files): the same measure as :data:`STREAM_FETCH_MAX_WAIT_MS`'s, 254 ms
    in 16 tasks, 155 ms in 2."""
    location = KafkaLocation.parse(source)
    # Spark wants a start for every partition the topic has when the query starts; one added
    # since the epoch's plan starts at its earliest offset (-2), as those added later do.
    log = KafkaLog(source, config)
    try:
        partitions = log.buckets()
    finally:
        log.close()
    begin = {**dict.fromkeys(partitions, EARLIEST), **start}
    client = java_options(config)
    # The admin client refuses an API timeout below its request timeout (30 s by default).
    request = int(client.get("kafka.request.timeout.ms", STREAM_API_TIMEOUT_MS // 2))
    client |= {
        "kafka.fetch.max.wait.ms": str(STREAM_FETCH_MAX_WAIT_MS),
        "kafka.request.timeout.ms": str(request),
        "kafka.default.api.timeout.ms": str(max(STREAM_API_TIMEOUT_MS, request)),
    }
    reader = _options(spark.readStream, location, begin, client).option("subscribe", location.topic)
    if max_records_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_records_per_trigger))
    frame = reader.load()
    if tasks is not None and len(partitions) > tasks:
        frame = frame.coalesce(tasks)
    return as_records(frame, location)


def read_batch(
    spark,
    source: str,
    start: OffsetsMap,
    end: OffsetsMap,
    *,
    min_partitions: int | None = None,
    config: Mapping[str, Any] | None = None,
):
    """A DataFrame of the topic ``source``'s records in ``[start, end)`` per partition (every
    partition of ``start``; ``end`` exclusive, at most the last stable offset), in the record
    schema; see the module docstring. ``min_partitions``: Spark cuts the larger ranges so that
    there are at least this many tasks (a skewed partition is read by several)."""
    location = KafkaLocation.parse(source)
    reader = (
        _options(spark.read, location, start, java_options(config))
        .option("assign", json.dumps({location.topic: sorted(start)}))
        .option("endingOffsets", topic_offsets_json(location.topic, end))
    )
    if min_partitions is not None:
        reader = reader.option("minPartitions", str(min_partitions))
    return as_records(reader.load(), location)


def _options(reader, location: KafkaLocation, start: OffsetsMap, client: Mapping[str, str]):
    """What every read of ours sets: the client options, polls of up to
    :data:`READ_MAX_POLL_RECORDS`, the exact start, a failure (not a skip) where records the
    range needs are gone, the headers only where the source keeps them."""
    return (
        reader.format(SPARK_FORMAT)
        .option("kafka.max.poll.records", str(READ_MAX_POLL_RECORDS))
        .options(**client)
        .option("startingOffsets", topic_offsets_json(location.topic, start))
        .option("failOnDataLoss", "true")
        .option("includeHeaders", str(location.headers).lower())
    )


def as_records(frame, location: KafkaLocation):
    """The Kafka source's rows (``partition``, ``offset``, ``timestamp``, ``key``, ``value``
    as bytes, ...) in the record schema, as the module docstring says."""
    from pyspark.sql import functions as F

    stamp = F.col("timestamp")
    if location.event_time_field is not None:
        stamp = F.coalesce(_field_time(location.event_time_field), stamp)
    return frame.select(
        F.col("partition").cast("int").alias("bucket"),
        F.col("offset").cast("bigint").alias("offset"),
        stamp.alias("event_time"),
        bytes_as_text(F.col("key")).alias("key"),
        bytes_as_text(F.col("value")).alias("value"),
        *([F.col(HEADERS_COLUMN)] if location.headers else []),
    )


def bytes_as_text(column):
    """Bytes as text; bytes that are not UTF-8 as the prefix and their base64."""
    from pyspark.sql import functions as F

    return (
        F.when(column.isNull(), F.lit(None).cast("string"))
        .when(F.is_valid_utf8(column), column.cast("string"))
        .otherwise(F.concat(F.lit(NOT_UTF8_PREFIX), F.base64(column)))
    )


def _field_time(field: str):
    """The event time in the value's top-level JSON ``field``, or null: a JSON number is
    epoch milliseconds, a string ISO-8601 with a zone (``Z`` or an offset); anything else,
    or a value that is not a JSON object, null."""
    from pyspark.sql import functions as F

    found = F.try_variant_get(
        F.try_parse_json(F.col("value").cast("string")), "$" + _json_path_key(field), "variant"
    )
    kind = F.schema_of_variant(found)
    millis = F.try_variant_get(found, "$", "decimal(38,6)")
    text = F.try_variant_get(found, "$", "string")
    zoned = text.rlike(r"(?i)(z|[+-]\d{2}(:?\d{2}(:?\d{2})?)?)$")
    return (
        F.when(
            kind.rlike("^(BIGINT|INT|SMALLINT|TINYINT|DECIMAL.*|DOUBLE|FLOAT)$"),
            F.timestamp_micros((millis * 1000).cast("bigint")),
        )
        .when((kind == "STRING") & zoned, F.try_to_timestamp(text))
        .otherwise(F.lit(None).cast("timestamp"))
    )


def _json_path_key(field: str) -> str:
    """``field`` as one key of a JSON path (any characters, quoted)."""
    return "['" + field.replace("\\", "\\\\").replace("'", "\\'") + "']"


__all__ = [
    "READ_MAX_POLL_RECORDS",
    "SPARK_FORMAT",
    "STREAM_API_TIMEOUT_MS",
    "STREAM_FETCH_MAX_WAIT_MS",
    "as_records",
    "bytes_as_text",
    "java_options",
    "read_batch",
    "read_stream",
    "topic_offsets_json",
]
