"""Benchmark: the Avro and Protobuf decoders against the JSON parse on the same records, one
core, no Spark.

    .venv/bin/python bench/bench_avro.py [--records 500000] [--rounds 3]

The demo's events (``event_id, user_id, action, amount, country``) written once as JSON text
and once as registry-framed Avro (a zero byte, a 4-byte schema id, the body), each kept as a
source keeps values (text; the prefix and base64 where the bytes are not UTF-8), and once as
registry-framed Protobuf (the framing, the message indexes, the body). Then, rounds
alternating, each Arrow form's work on batches of 65 536 values in this process: the JSON
parse (``modeswitch.transforms.arrow``, msgspec), the Avro decoder
(``modeswitch.transforms.avro``, fastavro), reading as the version written and, with
``--resolve``, as a later version with one more optional field (Avro's schema resolution), and
the Protobuf decoder (``modeswitch.transforms.protobuf``, protobuf's upb; both its forms).
Reports records per CPU-second of this process (one core: nothing else runs).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import random
import time

import fastavro
import pyarrow as pa

from modeswitch.sources.kafka import NOT_UTF8_PREFIX
from modeswitch.transforms import EVENT_SCHEMA
from modeswitch.transforms.arrow import PayloadParser
from modeswitch.transforms.avro import AvroDecoder
from modeswitch.transforms.protobuf import ProtobufDecoder
from modeswitch.transforms.protobuf_schemas import descriptor_set, pool_of

EVENT_AVRO = {
    "type": "record",
    "name": "Event",
    "fields": [
        {"name": "event_id", "type": "long"},
        {"name": "user_id", "type": "long"},
        {"name": "action", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "country", "type": "string"},
    ],
}
LATER = dict(
    EVENT_AVRO,
    fields=[*EVENT_AVRO["fields"], {"name": "note", "type": ["null", "string"], "default": None}],
)
EVENT_PROTO = """syntax = "proto3";
package demo.events;
message Event { int64 event_id = 1; int64 user_id = 2; string action = 3; double amount = 4;
  string country = 5; }
"""
BATCH = 65_536


def events(count: int) -> list[dict]:
    rng = random.Random(1)
    actions = ["view", "click", "buy", "refund"]
    countries = ["FR", "DE", "US", "JP", "BR"]
    return [
        {
            "event_id": n,
            "user_id": rng.randrange(1_000_000),
            "action": rng.choice(actions),
            "amount": round(rng.random() * 500, 2),
            "country": rng.choice(countries),
        }
        for n in range(count)
    ]


def as_text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return NOT_UTF8_PREFIX + base64.b64encode(raw).decode("ascii")


def avro_values(records: list[dict], *, raw: bool = False) -> list[str] | list[bytes]:
    """The records as registry-framed Avro, each kept as a source keeps values (text), or
    ``raw``: the bytes."""
    schema = fastavro.parse_schema(EVENT_AVRO)
    out = []
    for record in records:
        body = io.BytesIO()
        fastavro.schemaless_writer(body, schema, record)
        value = b"\x00" + (1).to_bytes(4, "big") + body.getvalue()
        out.append(value if raw else as_text(value))
    return out


def protobuf_values(records: list[dict], content: bytes) -> list[str]:
    from google.protobuf import message_factory

    event = message_factory.GetMessageClass(
        pool_of(content).FindMessageTypeByName("demo.events.Event")
    )
    frame = b"\x00" + (1).to_bytes(4, "big") + b"\x00"
    return [as_text(frame + event(**record).SerializeToString()) for record in records]


def batches(values: list[str]) -> list[tuple[pa.Array, pa.Array, pa.Array]]:
    return [
        (
            pa.array(values[i : i + BATCH], pa.string()),
            pa.array([0] * len(values[i : i + BATCH]), pa.int32()),
            pa.array(range(i, i + len(values[i : i + BATCH])), pa.int64()),
        )
        for i in range(0, len(values), BATCH)
    ]


def timed(work) -> float:
    start = time.process_time()
    work()
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--resolve", action="store_true")
    args = parser.parse_args(argv)

    records = events(args.records)
    json_batches = batches([json.dumps(r, separators=(",", ":")) for r in records])
    avro_batches = batches(avro_values(records))
    parser_json = PayloadParser(
        [(f.name, f.dataType.typeName()) for f in EVENT_SCHEMA.fields],
        [f.name for f in EVENT_SCHEMA.fields],
    )
    writers = {1: (1, json.dumps(EVENT_AVRO)), 2: (2, json.dumps(LATER))}
    same = AvroDecoder(json.dumps(EVENT_AVRO), writers, subject="e", version=1, what="bench")
    later = AvroDecoder(json.dumps(LATER), writers, subject="e", version=2, what="bench")
    content = descriptor_set({"event.proto": EVENT_PROTO}, "event.proto", what="bench")
    protobuf_batches = batches(protobuf_values(records, content))
    protobuf = ProtobufDecoder(content, "", {1: (1, content)}, subject="e", version=1, what="b")
    variants = {
        "json (msgspec)": lambda: [parser_json.parse_values(v) for v, _, _ in json_batches],
        "avro (fastavro)": lambda: [same.decode(*b) for b in avro_batches],
        "protobuf (upb)": lambda: [protobuf.decode(*b) for b in protobuf_batches],
    }
    if args.resolve:
        variants["avro, read as a later version"] = lambda: [later.decode(*b) for b in avro_batches]
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, work in variants.items():
            seconds[name].append(timed(work))
    print(f"{args.records} records, batches of {BATCH}, {args.rounds} rounds alternating")
    for name, taken in seconds.items():
        best = min(taken)
        print(
            f"{name:32s} best {best:6.2f} CPU-s  {args.records / best / 1000:8.0f} k records/CPU-s"
            f"  (rounds: {', '.join(f'{t:.2f}' for t in taken)})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
