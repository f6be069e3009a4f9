"""Spark sessions for modeswitch: one place that knows the settings the package relies on."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from modeswitch.environment import (
    KAFKA_CONFIG,
    PREFIX,
    SCHEMA_REGISTRY_CONFIG,
    SPARK_MASTER,
    STORAGE_OPTIONS,
    env_text,
    env_value,
)
from modeswitch.errors import ConfigError, ModeswitchError
from modeswitch.sources.kafka_security import with_java_properties

log = logging.getLogger(__name__)

BASE_CONF: dict[str, str] = {
    # Event times are UTC microseconds end to end.
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Python data sources run in Python workers; reusing them avoids a fork per task.
    "spark.python.worker.reuse": "true",
}

DELTA_SPARK_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
"""Delta's own connector in every session (its jars: :func:`spark_jars`): Spark reads, writes
and maintains the sink's tables with ``format("delta")``, ``DESCRIBE HISTORY``, time travel,
beside the sink's own commits."""

LOCAL_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    # delta-spark rebuilds a table's state from its log in this many partitions (50 by default,
    # sized for a cluster): on a local master each costs a task. A SELECT count(*) of a
    # 100-commit table took 14.5 s with 50, 2.0 s with 4; a second VACUUM LITE 16.2 s against
    # 8.9 s; tests/spark/test_user_delta_commands.py 316 s against 135 s (same hour).
    "spark.databricks.delta.snapshotPartitions": "4",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


EXECUTOR_VARIABLES = (KAFKA_CONFIG, STORAGE_OPTIONS)
"""The credentials the jobs' tasks read from their environment (a Kafka source's client
configuration, the tables' storage options; not the schema registry's, which only the driver
asks: :func:`modeswitch.transforms.schema_ids.learn_schema_id`). On a cluster the
executors, started by the workers, do not have the driver's environment: the session hands
them these as ``spark.executorEnv.*``, set in this process (never on a command line), and
redacted from the UI and the event log (:data:`REDACTION_REGEX`)."""
EXECUTOR_ENVIRONMENT = tuple(variable.name for variable in EXECUTOR_VARIABLES)
"""The names of :data:`EXECUTOR_VARIABLES`."""
CREDENTIAL_ENVIRONMENT = (*EXECUTOR_ENVIRONMENT, SCHEMA_REGISTRY_CONFIG.name)
"""The names of every credential a job reads from its environment: its tasks' and the
driver's own (the schema registry's client configuration)."""
WORKER_MEMORY_POOL = "jemalloc"
"""pyarrow's allocator in the Python workers (``ARROW_DEFAULT_MEMORY_POOL``, handed to them as
``spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL``; the driver's environment, or the session's
conf, names another). pyarrow's wheels default to mimalloc, which keeps much of what a task
freed: a worker reused for wave after wave grew with each. Measured here, five wave
partitions of the 100 M-record scale log (read, the Arrow parse, write) one after the other in
one process: a peak of 453-476 MB with mimalloc, 429 MB with the system allocator, 297-298 MB
with jemalloc, in about the same time (docs/BENCHMARKS.md, the scale section)."""
REDACTION_REGEX = f"(?i)secret|password|token|access[.]?key|keystore[.]key|{PREFIX}"
"""Spark's default ``spark.redaction.regex``, the names of :data:`EXECUTOR_ENVIRONMENT`, and
``keystore.key``: the Kafka source's ``kafka.ssl.keystore.key`` option holds a client's private
key (mutual TLS with PEM files, :mod:`modeswitch.sources.kafka_security`), under a name and in
a value Spark's default does not match. Every session of ours sets it."""


def spark_jars(existing: str | None = None) -> str:
    """``spark.jars``: the jars ``make install`` fetched
    (:func:`modeswitch.runners.jvm.fetched_jars`) after ``existing`` ones (a deployment's own,
    comma-separated), each once. Raises when the jars were not fetched."""
    from modeswitch.runners.jvm import fetched_jars

    jars = [jar.strip() for jar in (existing or "").split(",") if jar.strip()]
    return ",".join(dict.fromkeys([*jars, *fetched_jars()]))


def _require_jars(spark) -> None:
    """Under spark-submit the command line put the jars on the driver's class path, not this
    process: refuse a session that lacks some of them (Spark would only log that it cannot
    load Delta's extension, and fail later on the first Delta table)."""
    from urllib.parse import urlparse

    from modeswitch.runners.jvm import fetched_jars

    given = spark.sparkContext.getConf().get("spark.jars", "")
    names = {Path(urlparse(jar.strip()).path).name for jar in given.split(",") if jar.strip()}
    missing = [Path(jar).name for jar in fetched_jars() if Path(jar).name not in names]
    if missing:
        raise ModeswitchError(
            f"spark-submit without modeswitch's jars ({', '.join(missing)} missing from "
            'spark.jars): pass --jars "$(modeswitch jars)"'
        )


def _kafka_config_in_force() -> dict[str, str]:
    """The Kafka client configuration in force, or none where it cannot be read: a session
    also serves jobs that read no topic, and a Kafka source refuses the malformed variable,
    naming it, when a job opens its topic."""
    from modeswitch.sources.kafka import kafka_config

    try:
        return kafka_config()
    except ConfigError:
        log.warning(
            "%s is not a JSON object: this session sets no Kafka JVM options", KAFKA_CONFIG.name
        )
        return {}


def create_spark_session(
    app_name: str,
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    data_sources: bool = True,
):
    """A Spark session with the ``bucketlog`` source and ``modeswitch_delta`` sink registered
    (or neither, with ``data_sources`` False: an epoch job's, whose readers and writers each
    register the one they use where they use it).

    ``master`` defaults to ``$MODESWITCH_SPARK_MASTER`` or ``local[*]``; under spark-submit the
    master given there wins. The Python workers use this interpreter.

    Why a job registers neither up front: a session's first registration makes Spark look up
    the Python data sources installed beside pyspark, in a Python worker of its own (0.94 s of
    the cold batch job's 16 s here, measured; later registrations take 4-8 ms), and a batch
    epoch on the Arrow waves reads and writes with neither.
    """
    from pyspark.sql import SparkSession

    from modeswitch.runners.jvm import java_options, with_java_options
    from modeswitch.runners.worker_python import python_for
    from modeswitch.sinks.delta import register as register_sink
    from modeswitch.sources.spark import register

    named = master or env_value(SPARK_MASTER)
    # Python workers (not the driver) through the launcher, where they run on this machine.
    os.environ.setdefault("PYSPARK_PYTHON", python_for(named))
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    local = (named or "local").startswith("local")
    if local:
        # Bind to loopback: this machine's hostname resolves to a routable address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    if named:
        builder = builder.master(named)
    # Otherwise spark-submit's --master applies, or pyspark's own default, local[*].
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started the driver JVM
    settings = dict(BASE_CONF)
    if local and not submitted:
        settings.update(LOCAL_CONF)
    settings["spark.redaction.regex"] = REDACTION_REGEX
    if not local or submitted:  # executors may be elsewhere
        for variable in EXECUTOR_VARIABLES:
            text = env_text(variable)  # handed on as set: the executors parse it
            if text:
                settings[f"spark.executorEnv.{variable.name}"] = text
    settings["spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL"] = os.environ.get(
        "ARROW_DEFAULT_MEMORY_POOL", WORKER_MEMORY_POOL
    )
    settings.update(DELTA_SPARK_CONF)
    settings.update(conf or {})
    if not submitted:
        # This process starts the driver JVM (pyspark's launcher): the jars go on its command
        # line, for the driver's class path and the executors'.
        settings["spark.jars"] = spark_jars(settings.get("spark.jars"))
    # Map the JVM class archive when there is one (modeswitch.runners.jvm): a faster start.
    options = java_options()
    if options:
        settings["spark.driver.extraJavaOptions"] = with_java_options(
            settings.get("spark.driver.extraJavaOptions"), options
        )
    if not submitted:
        # What the Kafka source's Java client needs of its JVMs (an OAuth token endpoint
        # allowed). Under spark-submit its conf has them (modeswitch.runners.submit), and a
        # value set here would replace the deployment's own executor options.
        kafka = _kafka_config_in_force()
        for side in ("driver", "executor"):
            key = f"spark.{side}.extraJavaOptions"
            if jvm := with_java_properties(settings.get(key), kafka):
                settings[key] = jvm
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if submitted:
        try:
            _require_jars(spark)
        except ModeswitchError:
            spark.stop()
            raise
    if data_sources:
        register(spark)
        register_sink(spark)
    log.info("spark session %s on %s", app_name, spark.sparkContext.master)
    return spark
