"""Avro and Protobuf values framed by a real schema registry, on the real broker: the subject
read by the jobs, values written before and after compatible changes landing in one table with
their types, the malformed ones quarantined, and a version registered while a stream runs adding
its column. (One file: one registry per worker.)

Real parts: Apicurio Registry on loopback (its Confluent-compatible API, conftest), values
written by Confluent's own ``AvroSerializer`` and ``ProtobufSerializer`` (the registry framing
real producers write), the broker, the batch and stream jobs as child processes, Delta tables
read back with delta-rs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import protobuf_tools as pb
import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable
from fault_tools import assert_exactly_once

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import run_job_process
from modeswitch.runners.pipeline_run import run_pipeline
from modeswitch.sinks.commits import committed_offsets
from modeswitch.sinks.schema import SCHEMA_CHANGE_METADATA_KEY
from modeswitch.sources import open_log
from modeswitch.sources.kafka import KafkaLocation
from modeswitch.sources.schema_registry import read_subject
from modeswitch.state import StateStore
from modeswitch.transforms.protobuf import protobuf_decoder

ADDRESS = {
    "type": "record",
    "name": "Address",
    "fields": [{"name": "city", "type": "string"}, {"name": "zip", "type": "string"}],
}
V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "user", "type": "string"},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        },
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "wall", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "ship", "type": ["null", ADDRESS], "default": None},
    ],
}
V2 = dict(V1, fields=[*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}])
V3 = dict(V2, fields=[*V2["fields"], {"name": "channel", "type": "string", "default": "web"}])
UTC = dt.UTC


def order(n: int, version: int) -> dict:
    out = {
        "id": n,
        "user": f"u{n % 17}",
        "amount": Decimal(n % 100_000) / 100,
        "day": dt.date(2026, 1, 1) + dt.timedelta(days=n % 300),
        "at": dt.datetime(2026, 11, 29, tzinfo=UTC) + dt.timedelta(milliseconds=n),
        "wall": dt.datetime(2026, 11, 29, 8, 0) + dt.timedelta(microseconds=n),
        "tags": [f"t{n % 3}"] * (n % 3),
        "attrs": {"n": n, "half": n // 2},
        "ship": None if n % 4 == 0 else {"city": f"c{n % 5}", "zip": f"{n % 90000:05d}"},
    }
    if version >= 2:
        out["note"] = None if n % 2 else f"note {n}"
    if version >= 3:
        out["channel"] = "app"
    return out


class Orders:
    """Writes orders to a topic as a producer with Confluent's serializer does."""

    def __init__(self, config: dict, registry: SchemaRegistryClient, topic: str) -> None:
        self.producer = Producer(config)
        self.registry = registry
        self.topic = topic
        self.partition = 0

    def send(self, values: list[bytes], keys: list[bytes] | None = None) -> None:
        """Each value (with its key, if given) and two headers: who wrote it, and the
        how-manieth it is."""
        for value, key in zip(values, keys or [None] * len(values), strict=True):
            headers = [("producer", b"orders"), ("seq", b"%d" % self.partition)]
            self.producer.produce(
                self.topic, value, key=key, partition=self.partition % 4, headers=headers
            )
            self.partition += 1
        assert self.producer.flush(30) == 0

    def write(self, schema: dict, first: int, count: int, version: int) -> None:
        serializer = AvroSerializer(self.registry, json.dumps(schema))
        context = SerializationContext(self.topic, MessageField.VALUE)
        keyed = AvroSerializer(self.registry, json.dumps(ORDER_KEY))
        key_context = SerializationContext(self.topic, MessageField.KEY)
        numbers = range(first, first + count)
        self.send(
            [serializer(order(n, version), context) for n in numbers],
            [keyed({"id": n, "region": f"r{n % 3}"}, key_context) for n in numbers],
        )


ORDER_KEY = {
    "type": "record",
    "name": "OrderKey",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "region", "type": "string"}],
}
"""The orders' keys, registered under ``<topic>-key`` by the serializer."""


def registry_pipeline(format_: str, source: str, tmp_path: Path, **more: str) -> PipelineSettings:
    """A pipeline of ``format_`` values on ``source``, in small waves and quick micro-batches
    (and ``more`` settings)."""
    return PipelineSettings.from_mapping(
        {
            **more,
            "pipeline": f"{format_}_orders",
            "source": source,
            "warehouse": str(tmp_path / "warehouse"),
            "value_format": format_,
            "wave_records": "3000",
            "max_split_records": "1000",
            "trigger_interval": "200ms",
            "max_stream_runtime": "5m",
        }
    )


@pytest.fixture
def avro_pipeline(kafka_cluster, schema_registry, new_topic: Callable[[int], str], tmp_path: Path):
    source = new_topic(4)
    registry = SchemaRegistryClient(schema_registry.config)
    orders = Orders(kafka_cluster.config, registry, KafkaLocation.parse(source).topic)
    # Read with the records' headers: the batch's consumer and Spark's Kafka source alike.
    # And with the keys decoded (key_format = avro): key_id, key_region.
    settings = registry_pipeline("avro", f"{source}?headers=true", tmp_path, key_format="avro")
    return settings, orders, registry


def test_the_subject_is_read_with_its_versions_and_a_pinned_one(schema_registry):
    registry = SchemaRegistryClient(schema_registry.config)
    first = registry.register_schema("read-value", Schema(json.dumps(V1), "AVRO"))
    second = registry.register_schema("read-value", Schema(json.dumps(V2), "AVRO"))
    latest = read_subject("read-value", None)
    assert (latest.version, latest.reader_id) == (2, second)
    assert {i: v for i, (v, _) in latest.writers.items()} == {first: 1, second: 2}
    assert json.loads(read_subject("read-value", 1).reader)["fields"] == V1["fields"]
    with pytest.raises(ConfigError, match="'nowhere-value' is not in the schema registry"):
        read_subject("nowhere-value", None)
    with pytest.raises(ConfigError, match=r"3 is not a version .*its versions: 1, 2") as caught:
        read_subject("read-value", 3)
    assert caught.value.setting == "value_schema_version"
    with pytest.raises(ConfigError, match=r"^key_schema_version: 3 is not") as caught:
        read_subject("read-value", 3, column="key")  # a key's subject pinned (key_schema_version)
    assert caught.value.setting == "key_schema_version"
    incompatible = dict(V1, fields=[{"name": "id", "type": "string"}])
    registry.set_compatibility("read-value", "BACKWARD")
    with pytest.raises(Exception, match=r"(?i)incompatible"):  # the registry's rule
        registry.register_schema("read-value", Schema(json.dumps(incompatible), "AVRO"))


def sink_rows(settings: PipelineSettings) -> dict[int, dict]:
    table = DeltaTable(settings.sink).to_pyarrow_table()
    return {row["id"]: row for row in table.to_pylist()}


def test_values_before_and_after_a_compatible_change_land_in_one_table(avro_pipeline):
    settings, orders, registry = avro_pipeline
    # The Arrow form (fastavro in the waves' workers) here; batch_reader = auto runs the Spark
    # form (Spark's Kafka source and from_avro) in the next test, and the stream here.
    settings = dataclasses.replace(settings, batch_reader="arrow")
    orders.write(V1, 0, 2000, 1)
    subject = f"{orders.topic}-value"
    first = registry.get_latest_version(subject).schema_id
    other = registry.register_schema(
        "elsewhere-value",
        Schema(json.dumps({"type": "record", "name": "X", "fields": []}), "AVRO"),
    )
    frame = b"\x00" + first.to_bytes(4, "big")
    orders.send(
        [b"plain text", b"\x00\x00\x00", b"\x00" + other.to_bytes(4, "big"), frame + b"\x02"]
    )
    orders.write(V2, 2000, 2000, 2)

    done = run_pipeline(settings, until="caught-up")  # the batch reads as version 2
    assert done[0][0].mode == "batch"
    orders.write(V2, 4000, 500, 2)  # the stream's, through Spark's Kafka source
    log = open_log(settings.source)
    target = log.latest_offsets()
    stream = decide(settings, force_mode="stream")
    watch = PauseAt(settings, target)
    with watch:
        run_job_process("stream", settings, stream.epoch, timeout=600)
    assert close_epoch(settings, stream.epoch) == ("completed", target)
    assert_exactly_once(settings)

    table = DeltaTable(settings.sink).to_pyarrow_table()
    types = {f.name: f.type for f in table.schema}
    assert types["amount"] == pa.decimal128(10, 2)
    assert types["day"] == pa.date32()
    assert types["at"] == pa.timestamp("us", tz="UTC")
    assert types["wall"] == pa.timestamp("us")
    assert types["ship"] == pa.struct([("city", pa.string()), ("zip", pa.string())])
    assert pa.types.is_map(types["attrs"]) and pa.types.is_list(types["tags"])
    assert types["headers"] == pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    rows = sink_rows(settings)
    assert sorted(rows) == list(range(4500))
    sequence = [[(h["key"], h["value"]) for h in row["headers"]] for row in rows.values()]
    assert {tuple(k for k, _ in h) for h in sequence} == {("producer", "seq")}
    assert len({h[1][1] for h in sequence}) == 4500  # each row its own record's
    assert all((r["key_id"], r["key_region"]) == (n, f"r{n % 3}") for n, r in rows.items())
    for n in (0, 1, 1999, 2000, 2001, 4499):
        got = {k: v for k, v in rows[n].items() if k in V3_NAMES}
        want = dict(order(n, 2), note=order(n, 2)["note"] if n >= 2000 else None)
        got["attrs"] = dict(got["attrs"])
        assert got == want, n
    quarantined = DeltaTable(settings.quarantine).to_pyarrow_table().to_pylist()
    not_framed = (
        "value is not in the schema registry's wire format (a zero magic byte and a 4-byte "
        "schema id)"
    )
    assert sorted(r["reason"] for r in quarantined) == sorted(
        [
            not_framed,
            not_framed,
            f"schema id {other} is not a version of subject {subject}",
            f"value does not decode as Avro with schema id {first} (version 1 of {subject}) "
            "read as version 2",
        ]
    )


V3_NAMES = {f["name"] for f in V3["fields"]}


class PauseAt:
    """Pauses the stream once the sink holds ``target``, which may move while it runs."""

    def __init__(self, settings: PipelineSettings, target: dict[int, int]) -> None:
        self.settings = settings
        self.target = target
        self.reached = threading.Event()
        self.done = threading.Event()

    def watch(self) -> None:
        while not self.done.wait(0.3):
            if committed_offsets(self.settings.sink, self.settings.pipeline) == self.target:
                self.reached.set()
                store = StateStore.from_settings(self.settings)
                store.commands.submit("pause", {"note": "caught up"}, issuer="test")
                return

    def __enter__(self) -> PauseAt:
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=30)


def stream_meeting_a_new_version(
    settings: PipelineSettings, before: Callable[[], None], after: Callable[[], None]
) -> float:
    """Runs a stream epoch as a job process: ``before`` writes what it commits first, then
    ``after`` writes values of a version it registers while the stream runs. The seconds from
    ``after`` to their commit; the epoch closed at the topic's end, every record once."""
    log = open_log(settings.source)
    stream = decide(settings, force_mode="stream")
    failures: list[BaseException] = []

    def run() -> None:
        try:
            run_job_process("stream", settings, stream.epoch, timeout=600)
        except BaseException as exc:  # reported below
            failures.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    try:
        before()
        first = log.latest_offsets()
        deadline = time.monotonic() + 300
        while committed_offsets(settings.sink, settings.pipeline) != first:
            assert runner.is_alive() and time.monotonic() < deadline, failures
            time.sleep(0.3)
        changed = time.monotonic()
        after()
        target = log.latest_offsets()
        with PauseAt(settings, target) as watch:
            while not watch.reached.wait(0.5):  # the job fails at once if it cannot evolve
                assert runner.is_alive() and time.monotonic() < deadline, failures
            took = time.monotonic() - changed
    finally:
        runner.join(timeout=300)
    assert not failures
    assert close_epoch(settings, stream.epoch) == ("completed", target)
    assert_exactly_once(settings)
    return took


def test_a_version_registered_while_the_stream_runs_adds_its_column(avro_pipeline):
    settings, orders, _ = avro_pipeline
    orders.write(V2, 0, 1000, 2)
    run_pipeline(settings, until="caught-up")
    took = stream_meeting_a_new_version(
        settings,
        lambda: orders.write(V2, 1000, 300, 2),
        lambda: orders.write(V3, 1300, 300, 3),  # registers version 3 while the stream reads 2
    )
    print(f"version 3's values committed {took:.1f} s after they were sent")
    rows = sink_rows(settings)
    assert sorted(rows) == list(range(1600))
    # The batch (Spark's Kafka source and from_avro) kept the headers and decoded the keys as
    # the stream did.
    assert all(rows[n]["headers"][0] == {"key": "producer", "value": b"orders"} for n in rows)
    assert all(rows[n]["key_id"] == n for n in rows)
    assert {rows[n]["channel"] for n in range(1300)} == {None}
    assert {rows[n]["channel"] for n in range(1300, 1600)} == {"app"}
    assert {rows[n]["note"] for n in range(1300, 1600, 2)} == {
        f"note {n}" for n in range(1300, 1600, 2)
    }
    # Recorded: in the sink's history (the column's commit and the first holding it) and in
    # the decision log.
    changes = [
        json.loads(h[SCHEMA_CHANGE_METADATA_KEY])["added"]
        for h in DeltaTable(settings.sink).history()
        if SCHEMA_CHANGE_METADATA_KEY in h
    ]
    assert changes == [{"channel": "string"}] * 2
    schema_rows = [
        d for d in StateStore.from_settings(settings).decisions.list() if d.decided_by == "schema"
    ]
    assert len(schema_rows) == 1 and "is version 2 of" in schema_rows[0].reason  # V3, 2nd


def test_a_protobuf_subject_is_read_with_its_references(schema_registry):
    """Schemas registered as text with a reference, and as Confluent's serializer registers
    them (base64 descriptors), compile; a value framed with either decodes."""
    registry = SchemaRegistryClient(schema_registry.config)
    money = (
        'syntax = "proto3";\npackage m;\nmessage Money { string currency = 1; int64 units = 2; }\n'
    )
    registry.register_schema("money-proto", Schema(money, "PROTOBUF"))
    refund = (
        'syntax = "proto3";\npackage shop;\nimport "shared/money.proto";\n'
        "message Refund { int64 id = 1; m.Money total = 2; }\n"
    )
    reference = SchemaReference("shared/money.proto", "money-proto", 1)
    first = registry.register_schema("refunds-value", Schema(refund, "PROTOBUF", [reference]))
    settings = PipelineSettings.from_mapping(
        {"pipeline": "p", "source": "kafka://refunds", "value_format": "protobuf"}
    )
    decoder = protobuf_decoder(settings.describe_payload().schemas)
    assert (decoder.message, decoder.version, set(decoder.writers)) == ("shop.Refund", 1, {first})
    cls = pb.message_class(decoder.reader, "shop.Refund")
    value = pb.framed(first, cls(id=4, total={"currency": "EUR", "units": 9}).SerializeToString())
    columns, reasons = decoder.decode(pa.array([pb.as_text(value)]), pa.array([0]), pa.array([0]))
    assert reasons.to_pylist() == [None]
    assert [c.to_pylist() for c in columns] == [[4], [{"currency": "EUR", "units": 9}]]
    broken = refund.replace("Refund", "Broken")
    registry.register_schema("broken-value", Schema(broken, "PROTOBUF"))  # no reference given
    unreferenced = dataclasses.replace(settings.describe_payload().schemas, subject="broken-value")
    with pytest.raises(ConfigError, match=r"schema id \d+\).*does not compile.*shared/money.proto"):
        protobuf_decoder(unreferenced)


class ProtobufOrders(Orders):
    def write_protobuf(self, content: bytes, first: int, count: int) -> None:
        cls = pb.message_class(content)
        serializer = ProtobufSerializer(cls, self.registry, {"use.deprecated.format": False})
        context = SerializationContext(self.topic, MessageField.VALUE)
        self.send([serializer(pb.order(cls, n), context) for n in range(first, first + count)])


def test_protobuf_values_land_through_both_paths_and_a_new_version_adds_its_column(
    kafka_cluster, schema_registry, new_topic: Callable[[int], str], tmp_path: Path
):
    source = new_topic(4)
    registry = SchemaRegistryClient(schema_registry.config)
    orders = ProtobufOrders(kafka_cluster.config, registry, KafkaLocation.parse(source).topic)
    settings = registry_pipeline("protobuf", source, tmp_path)
    v1, v2 = pb.compiled(pb.V1), pb.compiled(pb.V2)
    orders.write_protobuf(v1, 0, 1500)
    orders.send([b"plain text", b"\x00\x00\x00\x00"])
    done = run_pipeline(settings, until="caught-up")  # auto: the Arrow form in the waves
    assert done[0][0].mode == "batch"

    stream_meeting_a_new_version(
        settings,
        lambda: orders.write_protobuf(v1, 1500, 300),  # through Spark's Kafka source
        lambda: orders.write_protobuf(v2, 1800, 200),  # registers version 2 while it reads 1
    )

    table = DeltaTable(settings.sink).to_pyarrow_table()
    assert table.schema.field("big").type == pa.decimal128(20, 0)
    assert table.schema.field("attrs").type == pa.map_(pa.string(), pa.int64())
    rows = sink_rows(settings)
    assert sorted(rows) == list(range(2000))
    names = set(pb.order_row(0, coupon=True))
    for n in (0, 1, 1499, 1500, 1799):
        got = {k: v for k, v in rows[n].items() if k in names}
        assert got == pb.order_row(n) | {"coupon": None}, n
    for n in (1800, 1999):
        assert {k: v for k, v in rows[n].items() if k in names} == pb.order_row(n, coupon=True)
    quarantined = DeltaTable(settings.quarantine).to_pyarrow_table().to_pylist()
    assert (
        sorted(r["reason"] for r in quarantined)
        == [
            "value is not in the schema registry's wire format for Protobuf (a zero magic byte, a "
            "4-byte schema id, the message indexes)"
        ]
        * 2
    )
