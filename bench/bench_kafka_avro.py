"""Benchmark: Avro and Protobuf values framed by a schema registry on Kafka against the same
records as JSON.

    .venv/bin/python bench/bench_kafka_avro.py [--records 10000000] [--only batch,latency]
        [--formats json,avro,protobuf] [--latency-seconds 60] [--logs FOLDER]

An Apache Kafka broker (one KRaft node) and an Apicurio Registry on loopback, both started and
stopped here. Topics of 16 partitions hold the same events (bench_kafka.py's: the demo's
events and skew, an hour of event time): one as JSON text, one as Avro (``EVENT_AVRO``
registered under ``<topic>-value``, each value the framing and the body, as Confluent's
serializer writes them; the events that are malformed JSON stay as their text, which the Avro
pipeline quarantines as not framed), one as Protobuf likewise (``EVENT_PROTO``, the framing
with the message indexes). Every pipeline is a user's: the default transform, ``value_schema``
(the demo's events' DDL) for JSON, ``value_format = avro`` or ``protobuf``.

``batch``: the batch path over each topic as a job (bench_kafka.run_batch), JSON and Avro
each with ``batch_reader = arrow`` (the Python workers read and decode: msgspec, fastavro) and
``native`` (Spark's Kafka source and the transform's Spark form: ``from_json``, ``from_avro``),
and Avro with ``bucketlog`` (the Python reader in Spark's data source, the Spark form);
Protobuf with ``arrow`` and ``native`` (both run its one decoder, in the Python workers).
``batch_reader = auto`` runs ``arrow`` for JSON and Protobuf, ``native`` for Avro.
Records per second of wall time and per CPU-second of the job's process tree; the issue's
target: Avro >= JSON by records per CPU-second. ``latency``: bench_kafka's live latency (a
batch epoch, then the stream at 5 000 records/s, 100 ms trigger) on an Avro topic and on a
Protobuf topic (the binary ones of ``--formats``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import bench_kafka as kafka
import bench_modes as modes
import fastavro
import msgspec
import pyarrow as pa
from bench_avro import EVENT_AVRO, EVENT_PROTO  # bench/ is on the path
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.devtools.schema_registry import SchemaRegistry
from modeswitch.sources.kafka import KafkaLog, kafka_environment
from modeswitch.sources.schema_registry import registry_environment
from modeswitch.transforms.payload import EVENT_VALUE_SCHEMA

JSON = {"transform": "value_schema", "value_schema": EVENT_VALUE_SCHEMA}
AVRO = {"transform": "value_schema", "value_format": "avro"}
PROTOBUF = {"transform": "value_schema", "value_format": "protobuf"}


class AvroTopic:
    """A Kafka log written through as Avro: each event's JSON value becomes the registry's
    framing (schema id ``schema_id``) and the Avro body; a value that is not an event stays
    as its text."""

    def __init__(self, log: KafkaLog, schema_id: int) -> None:
        self.log = log
        self.frame = b"\x00" + schema_id.to_bytes(4, "big")
        self.schema = fastavro.parse_schema(EVENT_AVRO)
        self.decoder = msgspec.json.Decoder()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.log, name)

    def _body(self, record: dict) -> bytes:
        body = io.BytesIO()
        fastavro.schemaless_writer(body, self.schema, record)
        return body.getvalue()

    def _encode(self, text: str) -> bytes:
        try:
            return self.frame + self._body(self.decoder.decode(text))
        except Exception:  # malformed JSON, or not an event: its text, as produced
            return text.encode("utf-8")

    def write_events(self, events: pa.Table) -> dict[int, int]:
        values = [self._encode(v) for v in events.column("value").to_pylist()]
        index = events.schema.get_field_index("value")
        return self.log.write_events(events.set_column(index, "value", pa.array(values)))


class ProtobufTopic(AvroTopic):
    """The same as Protobuf: the framing with the message indexes of the file's first message,
    and the body."""

    def __init__(self, log: KafkaLog, schema_id: int) -> None:
        from google.protobuf import message_factory

        from modeswitch.transforms.protobuf_schemas import descriptor_set, pool_of

        super().__init__(log, schema_id)
        self.frame += b"\x00"
        content = descriptor_set({"event.proto": EVENT_PROTO}, "event.proto", what="bench")
        event = pool_of(content).FindMessageTypeByName("demo.events.Event")
        self.event = message_factory.GetMessageClass(event)

    def _body(self, record: dict) -> bytes:
        return self.event(**record).SerializeToString()


def register_protobuf(registry: SchemaRegistry, topic: str) -> int:
    """``EVENT_PROTO`` registered under ``<topic>-value`` (as text): its schema id."""
    client = SchemaRegistryClient(registry.config)
    return client.register_schema(f"{topic}-value", Schema(EVENT_PROTO, "PROTOBUF"))


def register(registry: SchemaRegistry, topic: str) -> int:
    """``EVENT_AVRO`` registered under ``<topic>-value``: its schema id."""
    client = SchemaRegistryClient(registry.config)
    return client.register_schema(f"{topic}-value", Schema(json.dumps(EVENT_AVRO), "AVRO"))


def avro_topic(broker: KafkaBroker, registry: SchemaRegistry, topic: str, records: int) -> str:
    schema_id = register(registry, topic)
    return kafka.produce_topic(broker, topic, records, lambda log: AvroTopic(log, schema_id))


def protobuf_topic(broker: KafkaBroker, registry: SchemaRegistry, topic: str, records: int) -> str:
    schema_id = register_protobuf(registry, topic)
    return kafka.produce_topic(broker, topic, records, lambda log: ProtobufTopic(log, schema_id))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--only", default="batch,latency", help="among: batch, latency")
    parser.add_argument(
        "--formats", default="json,avro,protobuf", help="the topics (latency: avro, protobuf)"
    )
    parser.add_argument("--latency-seconds", type=float, default=60.0)
    parser.add_argument("--logs", help="keep the job processes' output in this folder")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    modes.LOGS = Path(args.logs) if args.logs else None
    scratch = Path(tempfile.mkdtemp(prefix="bench-kafka-avro-"))
    try:
        with (
            KafkaBroker(scratch / "broker") as broker,
            SchemaRegistry(scratch / "registry") as registry,
        ):
            os.environ.update(kafka_environment(broker.config))  # the jobs inherit them
            os.environ.update(registry_environment(registry.config))
            print(f"broker at {broker.bootstrap}, registry at {registry.url}", flush=True)
            if "batch" in only:
                formats = set(args.formats.split(","))
                runs = []
                if "json" in formats:
                    source = kafka.produce_topic(broker, "events_json", args.records)
                    runs += [(source, reader, " JSON", JSON) for reader in ("arrow", "native")]
                if "avro" in formats:
                    source = avro_topic(broker, registry, "events_avro", args.records)
                    runs += [
                        (source, reader, " Avro", AVRO)
                        for reader in ("arrow", "native", "bucketlog")
                    ]
                if "protobuf" in formats:
                    source = protobuf_topic(broker, registry, "events_protobuf", args.records)
                    runs += [
                        (source, reader, " Protobuf", PROTOBUF) for reader in ("arrow", "native")
                    ]
                rows: list[tuple[modes.Run, float]] = []
                for source, reader, name, extra in runs:
                    before = kafka.broker_cpu(broker)
                    run = kafka.run_batch(scratch, source, reader, name, **extra)
                    rows.append((run, kafka.broker_cpu(broker) - before))
                    print(f"{run.name}: {run.rate:,.0f} records/s", flush=True)
                kafka.print_table(rows)
            live = {
                "avro": ("Avro", register, AvroTopic, AVRO),
                "protobuf": ("Protobuf", register_protobuf, ProtobufTopic, PROTOBUF),
            }
            for fmt in (
                [f for f in args.formats.split(",") if f in live] if "latency" in only else []
            ):
                name, registered, writer, extra = live[fmt]
                topic = f"live_{fmt}"
                schema_id = registered(registry, topic)
                (scratch / topic).mkdir()  # a pipeline of its own per topic
                result = kafka.run_latency(
                    broker,
                    scratch / topic,
                    args.latency_seconds,
                    topic,
                    lambda log, writer=writer, schema_id=schema_id: writer(log, schema_id),
                    **extra,
                )
                print(
                    f"{name}, live at 5 000 records/s, 100 ms trigger, {result['records']:,} "
                    f"records: p50 {result['p50'] * 1000:.0f} ms, p95 {result['p95'] * 1000:.0f} "
                    f"ms, p99 {result['p99'] * 1000:.0f} ms, max {result['max'] * 1000:.0f} ms "
                    "(targets: p50 <= 300 ms, p99 <= 600 ms); handoff, the batch's last commit "
                    f"-> the stream's first: {result['handoff']:.1f} s",
                    flush=True,
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
