"""librdkafka's settings as Spark's Kafka source takes them, and its offsets log as the sink
reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeswitch.errors import ConfigError, ModeswitchError
from modeswitch.sinks.stream_offsets import offsets_log_entry
from modeswitch.sources import log_type
from modeswitch.sources.spark_kafka import (
    READ_MAX_POLL_RECORDS,
    _options,
    java_options,
    topic_offsets_json,
)

SECRET = 'pa"ss\\w0rd-marker'


def test_a_plain_broker_needs_only_its_address() -> None:
    assert java_options({"bootstrap.servers": "b:9092", "group.id": "x", "linger.ms": 5}) == {
        "kafka.bootstrap.servers": "b:9092",
        "kafka.isolation.level": "read_committed",
    }


@pytest.mark.parametrize(
    ("mechanism", "module"),
    [
        (None, "org.apache.kafka.common.security.plain.PlainLoginModule"),
        ("plain", "org.apache.kafka.common.security.plain.PlainLoginModule"),
        ("SCRAM-SHA-512", "org.apache.kafka.common.security.scram.ScramLoginModule"),
    ],
)
def test_sasl_credentials_become_a_jaas_login(mechanism: str | None, module: str) -> None:
    config = {
        "bootstrap.servers": "b:9093",
        "security.protocol": "sasl_ssl",
        "sasl.username": "svc",
        "sasl.password": SECRET,
        "ssl.ca.location": "/etc/ca.pem",
    }
    if mechanism:
        config["sasl.mechanisms"] = mechanism
    options = java_options(config)
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.mechanism"] == (mechanism or "PLAIN").upper()
    assert options["kafka.sasl.jaas.config"] == (
        f'{module} required username="svc" password="pa\\"ss\\\\w0rd-marker";'
    )
    # Spark redacts an option whose key or value matches its default redaction pattern.
    assert "password" in options["kafka.sasl.jaas.config"]
    assert options["kafka.ssl.truststore.location"] == "/etc/ca.pem"
    assert options["kafka.ssl.truststore.type"] == "PEM"


def test_a_setting_the_java_client_cannot_take_is_refused_by_name_not_value() -> None:
    with pytest.raises(ConfigError, match=r"'ssl\.key\.password'") as refused:
        java_options({"bootstrap.servers": "b:9092", "ssl.key.password": SECRET})
    assert SECRET not in str(refused.value)
    with pytest.raises(ConfigError, match="GSSAPI"):
        java_options(
            {"bootstrap.servers": "b", "sasl.mechanism": "GSSAPI", "sasl.password": SECRET}
        )


class _Reader:
    """What a read's options builder is given: the options, in order."""

    def __init__(self) -> None:
        self.given: dict[str, str] = {}

    def format(self, _name: str) -> _Reader:
        return self

    def option(self, key: str, value: str) -> _Reader:
        self.given[key] = value
        return self

    def options(self, **more: str) -> _Reader:
        self.given.update(more)
        return self


def test_every_read_polls_many_records_at_once() -> None:
    reader = _Reader()
    _options(reader, "events", {0: 3}, java_options({"bootstrap.servers": "b:9092"}))
    assert reader.given["kafka.max.poll.records"] == str(READ_MAX_POLL_RECORDS)
    assert READ_MAX_POLL_RECORDS >= 10_000  # not the Java client's 500
    assert reader.given["startingOffsets"] == '{"events": {"0": 3}}'
    assert reader.given["kafka.isolation.level"] == "read_committed"


def test_the_log_names_its_spark_source() -> None:
    assert log_type("kafka://events").spark_source == "kafka"
    assert log_type("/data/log").spark_source == "bucketlog"


def _offsets_log(checkpoint: Path, batch: int, line: str) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{line}\n')


def test_the_sink_reads_the_kafka_sources_offsets_log(tmp_path: Path) -> None:
    _offsets_log(tmp_path, 0, topic_offsets_json("events", {1: 40, 0: 12}))
    _offsets_log(tmp_path, 1, '{"0": 5, "1": 6}')  # the bucketlog source's form
    _offsets_log(tmp_path, 2, '{"a": {"0": 1}, "b": {"0": 2}}')
    assert offsets_log_entry(str(tmp_path), 0) == {0: 12, 1: 40}
    assert offsets_log_entry(str(tmp_path), 1) == {0: 5, 1: 6}
    with pytest.raises(ModeswitchError, match="topics \\['a', 'b'\\]"):
        offsets_log_entry(str(tmp_path), 2)
    assert offsets_log_entry(str(tmp_path), 3) is None
