"""A real Kafka-protocol broker on loopback for tests and demos: librdkafka's mock cluster.

librdkafka (inside confluent-kafka) ships a mock cluster that speaks the Kafka protocol on
real TCP sockets: producers, consumers, transactions, ``offsets_for_times`` and metadata from
any process that connects to its ``bootstrap`` address. A confluent-kafka client created with
``test.mock.num.brokers`` starts one, but then every topic has 4 partitions and the cluster
answers neither CreateTopics nor CreatePartitions. So this module drives the same mock
through librdkafka's C API (``rd_kafka_mock_cluster_new``, ``rd_kafka_mock_topic_create``,
``rd_kafka_mock_partition_delete_records``), loaded from the library confluent-kafka itself
uses: topics get the partition count asked for, and records can be dropped below an offset
(what retention does).

Known differences from Apache Kafka, measured with confluent-kafka 2.16.1: ``offsets_for_times``
answers -1 for every timestamp (the log answers it by a search instead), and
``isolation.level=read_committed`` does not hide the records of aborted transactions (their
markers still leave gaps in the offsets). Partitions cannot be added to an existing topic.

``python -m modeswitch.devtools.kafka_mock --topic events:8`` runs one until it is stopped
(SIGTERM or Ctrl-C) and prints ``{"bootstrap": "127.0.0.1:PORT"}`` on its first line.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import signal
import sys
import threading
from pathlib import Path

from modeswitch.errors import ModeswitchError

_RD_KAFKA_PRODUCER = 0


def _library() -> ctypes.CDLL:
    import confluent_kafka

    here = Path(confluent_kafka.__file__).resolve().parent
    found = sorted((here.parent / "confluent_kafka.libs").glob("librdkafka*"))
    if not found:
        raise ModeswitchError(f"librdkafka not found beside confluent_kafka at {here}")
    lib = ctypes.CDLL(str(found[0]))
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_topic_create.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_int,
    ]
    lib.rd_kafka_mock_partition_delete_records.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int32,
        ctypes.c_int64,
    ]
    lib.rd_kafka_err2str.restype = ctypes.c_char_p
    lib.rd_kafka_err2str.argtypes = [ctypes.c_int]
    return lib


class MockKafkaCluster:
    """One mock cluster of ``brokers`` brokers, alive until :meth:`close` (a context manager)."""

    def __init__(self, brokers: int = 1) -> None:
        self._lib = _library()
        errors = ctypes.create_string_buffer(512)
        conf = self._lib.rd_kafka_conf_new()
        # The handle that owns the cluster logs nothing of its own.
        self._lib.rd_kafka_conf_set(conf, b"log_level", b"3", errors, 512)
        self._handle = self._lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errors, 512)
        if not self._handle:
            raise ModeswitchError(f"librdkafka: {errors.value.decode()}")
        self._cluster = self._lib.rd_kafka_mock_cluster_new(self._handle, brokers)
        if not self._cluster:
            self._lib.rd_kafka_destroy(self._handle)
            raise ModeswitchError("librdkafka: the mock cluster did not start")
        self.bootstrap = self._lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()

    @property
    def config(self) -> dict[str, str]:
        """The client configuration that reaches this cluster."""
        return {"bootstrap.servers": self.bootstrap}

    def _check(self, code: int, what: str) -> None:
        if code:
            reason = self._lib.rd_kafka_err2str(code).decode()
            raise ModeswitchError(f"mock kafka: {what}: {reason}")

    def create_topic(self, topic: str, partitions: int) -> None:
        self._check(
            self._lib.rd_kafka_mock_topic_create(self._cluster, topic.encode(), partitions, 1),
            f"create topic {topic!r} with {partitions} partitions",
        )

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """Drop the records of ``partition`` below offset ``before``, as retention does."""
        self._check(
            self._lib.rd_kafka_mock_partition_delete_records(
                self._cluster, topic.encode(), partition, before
            ),
            f"delete records of {topic!r} partition {partition} below {before}",
        )

    def close(self) -> None:
        if self._cluster:
            self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
            self._cluster = None
        if self._handle:
            self._lib.rd_kafka_destroy(self._handle)
            self._handle = None

    def __enter__(self) -> MockKafkaCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--topic", action="append", default=[], help="NAME:PARTITIONS, created at start"
    )
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with MockKafkaCluster() as cluster:
        for spec in args.topic:
            name, _, count = spec.partition(":")
            cluster.create_topic(name, int(count or 4))
        print(json.dumps({"bootstrap": cluster.bootstrap}), flush=True)
        while not stop.wait(1.0):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
