"""The kafka tier: an Apache Kafka broker on loopback, owned by this session.

The broker is Apache Kafka itself (:mod:`modeswitch.devtools.kafka_broker`: one KRaft node
from the jars of jvm/kafka-broker/pom.xml), started by this session as a process group of its
own and stopped at its end. Its address reaches the Spark jobs and Python workers the tests
start through ``MODESWITCH_KAFKA_CONFIG``, set for the session before any Spark JVM starts
(the workers inherit it) and removed at the end.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator

import pytest

from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.devtools.schema_registry import SchemaRegistry
from modeswitch.environment import SCHEMA_REGISTRY_CONFIG
from modeswitch.sources.kafka import ENV_KAFKA_CONFIG, SCHEME, kafka_environment
from modeswitch.sources.schema_registry import registry_environment

_names = itertools.count()

KAFKA_SECRET = "kafka-tier-s3cr3t"
"""In the session's client configuration as ``sasl.password`` (librdkafka takes it and, on a
plaintext connection, does not use it): tests check that no file the pipeline writes holds
it."""


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """The broker; its address (and :data:`KAFKA_SECRET`) in ``MODESWITCH_KAFKA_CONFIG``."""
    with KafkaBroker(tmp_path_factory.mktemp("kafka-broker")) as cluster:
        before = os.environ.get(ENV_KAFKA_CONFIG)
        os.environ.update(kafka_environment({**cluster.config, "sasl.password": KAFKA_SECRET}))
        try:
            yield cluster
        finally:
            if before is None:
                os.environ.pop(ENV_KAFKA_CONFIG, None)
            else:
                os.environ[ENV_KAFKA_CONFIG] = before


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchemaRegistry]:
    """A schema registry on loopback (Apicurio Registry, its storage in memory), its address in
    ``MODESWITCH_SCHEMA_REGISTRY_CONFIG`` for the jobs the tests start."""
    with SchemaRegistry(tmp_path_factory.mktemp("schema-registry")) as registry:
        before = os.environ.get(SCHEMA_REGISTRY_CONFIG.name)
        os.environ.update(registry_environment(registry.config))
        try:
            yield registry
        finally:
            if before is None:
                os.environ.pop(SCHEMA_REGISTRY_CONFIG.name, None)
            else:
                os.environ[SCHEMA_REGISTRY_CONFIG.name] = before


@pytest.fixture(scope="session")
def kafka_secret() -> str:
    return KAFKA_SECRET


@pytest.fixture(scope="session")
def new_topic(kafka_cluster: KafkaBroker) -> Callable[[int], str]:
    """Creates a fresh topic of N partitions; returns its source setting, kafka://<topic>."""

    def create(partitions: int = 4) -> str:
        name = f"t{os.getpid()}-{next(_names)}"
        kafka_cluster.create_topic(name, partitions)
        return f"{SCHEME}{name}"

    return create


@pytest.fixture(scope="session")
def spark(kafka_cluster: KafkaBroker) -> Iterator[object]:
    """A local Spark session started after the broker's address is in the environment."""
    from modeswitch.runners.session import create_spark_session
    from modeswitch.sinks.delta import register as register_sink
    from modeswitch.sources.spark import register

    session = create_spark_session(
        "modeswitch-kafka-tests", master="local[2]", conf={"spark.ui.enabled": "false"}
    )
    session.sparkContext.setLogLevel("ERROR")
    # Under two test workers another tier's tests may have started this process's session
    # before the broker: hand its address to the Python workers the data sources start (their
    # functions carry the context's environment when registered), and register them again.
    session.sparkContext.environment[ENV_KAFKA_CONFIG] = os.environ[ENV_KAFKA_CONFIG]
    register(session)
    register_sink(session)
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()


BASE_MS = 1_700_000_000_000
"""Message timestamps of :func:`transactions` start here and grow by 1 s a record."""


def _produce_transactions(
    cluster: KafkaBroker,
    topic: str,
    *,
    partitions: int,
    transactions: int,
    seed: int = 0,
    base_ms: int = BASE_MS,
) -> None:
    """Transactions of 1-20 records to random partitions, about a third aborted (after a
    flush, so that their records and markers reach the broker). Timestamps from ``base_ms``,
    1 s apart."""
    import json
    import random

    from confluent_kafka import Producer

    rng = random.Random(seed)
    producer = Producer({**cluster.config, "transactional.id": f"{topic}-tx"})
    producer.init_transactions(60)  # the coordinator may still be loading (test_real_broker)
    n = 0
    for _ in range(transactions):
        producer.begin_transaction()
        for _ in range(rng.randint(1, 20)):
            value = json.dumps({"n": n, "ts": base_ms + n * 1000})
            producer.produce(
                topic,
                value.encode(),
                key=f"k{n}".encode(),
                partition=rng.randrange(partitions),
                timestamp=base_ms + n * 1000,
            )
            n += 1
        producer.flush(10)
        if rng.random() < 0.33:
            producer.abort_transaction(10)
        else:
            producer.commit_transaction(10)


@pytest.fixture(scope="session")
def transactions(kafka_cluster: KafkaBroker) -> Callable[..., None]:
    """``transactions(topic, partitions=, transactions=, seed=)``: see _produce_transactions."""

    def produce(topic: str, **kwargs: int) -> None:
        _produce_transactions(kafka_cluster, topic, **kwargs)

    return produce
