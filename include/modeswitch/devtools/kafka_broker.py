"""An Apache Kafka broker on loopback for tests and demos: one KRaft node, started and stopped here.

The broker is Apache Kafka itself, from the jars ``make install`` fetched into
``.kafka-broker/`` (``jvm/kafka-broker/pom.xml``; ``$MODESWITCH_KAFKA_BROKER_JARS`` names
another folder): one JVM that is both broker and controller (``process.roles=broker,controller``),
its data in a folder of its own, replication factors of 1. Unlike librdkafka's mock cluster
it implements what clients of a real cluster rely on: ``isolation.level=read_committed``
hides aborted transactions and stops at the last stable offset, ``offsets_for_times``
answers, retention deletes whole segments, and a broker can be killed and started again on
the same data.

:class:`KafkaBroker` formats its storage on first start (``kafka.tools.StorageTool format
--standalone``), starts ``kafka.Kafka`` as the leader of a new process group, waits until a
client gets the cluster's metadata with a leader for every partition, and stops the group
(SIGTERM, then SIGKILL) on :meth:`~KafkaBroker.stop` or at the end of its ``with`` block.
:meth:`~KafkaBroker.kill` SIGKILLs it and :meth:`~KafkaBroker.start` starts it again, on the
same ports and data.

The JVM runs with a small heap and the client compiler only (a broker for tests: seconds to
start, ~350-400 MB resident measured here); its log goes to ``broker.log`` in its folder.

``python -m modeswitch.devtools.kafka_broker --dir /tmp/kafka --topic events:8`` runs one until
it is stopped (SIGTERM or Ctrl-C) and prints ``{"bootstrap": "127.0.0.1:PORT"}`` on its first
line.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from modeswitch.devtools.standalone import free_ports
from modeswitch.environment import KAFKA_BROKER_JARS, env_value
from modeswitch.errors import ModeswitchError
from modeswitch.runners.jvm import java_executable
from modeswitch.runners.processes import kill_group, start_group, stop_group

ENV_BROKER_JARS = KAFKA_BROKER_JARS.name
JVM_OPTIONS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
READY_TIMEOUT = 90.0
STOP_GRACE = 30.0

LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = INFO
"""


def broker_jars() -> Path:
    """The folder of the broker's jars; :class:`ModeswitchError` when it holds none."""
    folder = env_value(KAFKA_BROKER_JARS)
    if not any(folder.glob("kafka_2.13-*.jar")):
        raise ModeswitchError(
            f"no Apache Kafka broker jars in {folder}: run `make install` (it fetches "
            f"jvm/kafka-broker/pom.xml there), or set {ENV_BROKER_JARS} to a folder that holds them"
        )
    return folder


def _cluster_id() -> str:
    """A random Kafka cluster id: 16 bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class KafkaBroker:
    """One Apache Kafka node (broker and controller) on loopback, its data under ``directory``.

    ``settings`` are extra ``server.properties`` lines (for example ``log.retention.ms``).
    ``listeners`` adds client listeners beside the plaintext one the broker is administered
    and waited for on: their names and security protocols (``{"MTLS": "SSL"}``), each on a
    port of its own (:meth:`address`); ``settings`` configures them
    (``listener.name.mtls.ssl.client.auth``, ...). ``java_options`` go on the broker's JVM
    (system properties such as ``org.apache.kafka.sasl.oauthbearer.allowed.urls``)."""

    def __init__(
        self,
        directory: str | Path,
        settings: Mapping[str, str] | None = None,
        *,
        listeners: Mapping[str, str] | None = None,
        java_options: Sequence[str] = (),
    ) -> None:
        self.directory = Path(directory).resolve()
        extra = dict(listeners or {})
        self.port, self.controller_port, *ports = free_ports(2 + len(extra))
        self.listeners = {
            name: (protocol, port)
            for (name, protocol), port in zip(extra.items(), ports, strict=True)
        }
        self.settings = dict(settings or {})
        self.java_options = tuple(java_options)
        self.process: subprocess.Popen | None = None
        self._formatted = False

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def config(self) -> dict[str, str]:
        """The client configuration that reaches this broker."""
        return {"bootstrap.servers": self.bootstrap}

    def address(self, listener: str) -> str:
        """The ``host:port`` of one of the ``listeners`` the broker was made with."""
        return f"127.0.0.1:{self.listeners[listener][1]}"

    @property
    def log_file(self) -> Path:
        return self.directory / "broker.log"

    def _properties(self) -> Path:
        clients = [f"PLAINTEXT://{self.bootstrap}"]
        clients += [f"{name}://{self.address(name)}" for name in self.listeners]
        protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
        protocols += [f"{name}:{protocol}" for name, (protocol, _) in self.listeners.items()]
        properties = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": ",".join([*clients, f"CONTROLLER://127.0.0.1:{self.controller_port}"]),
            "advertised.listeners": ",".join(clients),
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": ",".join(protocols),
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.directory / "data"),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # No retention by time: tests and demos write records stamped in the past (a
            # week-old timestamp would be deleted at the next retention check otherwise).
            "log.retention.ms": "-1",
            # The cleaner of compacted topics looks for work every second (15 s by default):
            # a compacted topic's rolled segments are compacted within seconds.
            "log.cleaner.backoff.ms": "1000",
            **self.settings,
        }
        path = self.directory / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        (self.directory / "log4j2.properties").write_text(LOG4J2.format(log=self.log_file))
        return path

    def _command(self, main: str, *args: str) -> list[str]:
        # Its temporary files (the native libraries it unpacks: lz4, zstd, snappy) in its own
        # folder, not the machine's /tmp, where a SIGKILLed broker would leave them.
        scratch = self.directory / "tmp"
        scratch.mkdir(parents=True, exist_ok=True)
        return [
            str(java_executable() or "java"),
            *JVM_OPTIONS,
            *self.java_options,
            f"-Djava.io.tmpdir={scratch}",
            f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}",
            "-cp",
            f"{broker_jars()}/*",
            main,
            *args,
        ]

    def _format(self, properties: Path) -> None:
        command = self._command(
            "kafka.tools.StorageTool",
            "format",
            # One argument: an id may start with "-", which would read as an option.
            f"--cluster-id={_cluster_id()}",
            f"--config={properties}",
            "--standalone",
        )
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise ModeswitchError(
                f"formatting the Kafka broker's storage in {self.directory} failed: "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )
        self._formatted = True

    def start(self) -> str:
        """Start the broker (formatting its storage the first time) and wait until a client
        gets its metadata; returns its bootstrap address."""
        if self.process is not None and self.process.poll() is None:
            return self.bootstrap
        self.directory.mkdir(parents=True, exist_ok=True)
        properties = self._properties()
        if not self._formatted:
            self._format(properties)
        with open(self.directory / "broker.out", "ab") as output:
            self.process = start_group(self._command("kafka.Kafka", str(properties)), output=output)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.bootstrap

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        assert self.process is not None
        deadline = time.monotonic() + READY_TIMEOUT
        admin = AdminClient({**self.config, "log_level": 0})
        while True:
            if self.process.poll() is not None:
                raise ModeswitchError(
                    f"the Kafka broker in {self.directory} exited with status "
                    f"{self.process.returncode} while starting:\n{self._tail()}"
                )
            try:
                metadata = admin.list_topics(timeout=1)
                # Started again on its data, the broker is listed before it leads its
                # partitions again (recovering its logs after a kill): ready when each has a
                # leader.
                partitions = [p for t in metadata.topics.values() for p in t.partitions.values()]
                errors = [t.error for t in metadata.topics.values()] + [p.error for p in partitions]
                if metadata.brokers and all(p.leader >= 0 for p in partitions) and not any(errors):
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise ModeswitchError(
                    f"the Kafka broker at {self.bootstrap} did not answer within "
                    f"{READY_TIMEOUT:.0f} s:\n{self._tail()}"
                )
            time.sleep(0.2)

    def _tail(self, lines: int = 30) -> str:
        text = []
        for path in (self.directory / "broker.out", self.log_file):
            if path.exists():
                text += path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(text)

    def stop(self) -> None:
        """Stop the broker's process group: SIGTERM (a clean shutdown), then SIGKILL."""
        if self.process is not None:
            stop_group(self.process, grace=STOP_GRACE)
            self.process = None

    def kill(self) -> None:
        """SIGKILL the broker's process group, as a machine losing power would."""
        if self.process is not None:
            kill_group(self.process)
            self.process.wait()
            self.process = None

    def _admin(self):
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.config)

    def create_topic(self, topic: str, partitions: int, **config: str) -> None:
        from confluent_kafka.admin import NewTopic

        admin = self._admin()  # kept until the answer came: its futures die with it
        futures = admin.create_topics(
            [NewTopic(topic, partitions, 1, config=dict(config))], operation_timeout=30
        )
        try:
            futures[topic].result(timeout=60)
        except Exception as exc:
            raise ModeswitchError(
                f"kafka broker {self.bootstrap}: create topic {topic!r} with {partitions} "
                f"partitions: {exc}"
            ) from exc

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """Drop the records of ``partition`` below offset ``before`` (what retention does,
        through the DeleteRecords request)."""
        from confluent_kafka import TopicPartition

        admin = self._admin()
        futures = admin.delete_records([TopicPartition(topic, partition, before)])
        try:
            for future in futures.values():
                future.result(timeout=60)
        except Exception as exc:
            raise ModeswitchError(
                f"kafka broker {self.bootstrap}: delete records of {topic!r} partition "
                f"{partition} below {before}: {exc}"
            ) from exc

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> KafkaBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modeswitch.devtools.kafka_broker")
    parser.add_argument("--dir", required=True, help="the broker's folder (data and logs)")
    parser.add_argument("--topic", action="append", default=[], help="NAME:PARTITIONS")
    args = parser.parse_args(argv)
    stopped = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stopped.set())
    with KafkaBroker(args.dir) as broker:
        for spec in args.topic:
            name, _, partitions = spec.partition(":")
            broker.create_topic(name, int(partitions or 1))
        print(json.dumps({"bootstrap": broker.bootstrap}), flush=True)
        stopped.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
