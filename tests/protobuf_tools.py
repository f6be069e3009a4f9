"""The Protobuf schemas and values the unit tier's decoder tests, the spark tier's and the kafka
tier's share (tests/unit/test_protobuf_payload.py, tests/spark/test_protobuf_forms.py,
tests/kafka/test_protobuf_registry.py)."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

from google.protobuf import message_factory

from modeswitch.sources.kafka import NOT_UTF8_PREFIX
from modeswitch.transforms.protobuf import ProtobufDecoder
from modeswitch.transforms.protobuf_schemas import descriptor_set, pool_of

ORDER_FIELDS = """
  enum Channel { WEB = 0; APP = 1; }
  message Address { string city = 1; string zip = 2; }
  int64 id = 1;
  string user = 2;
  double amount = 3;
  uint64 big = 4;
  uint32 small = 5;
  sint32 delta = 6;
  bool paid = 7;
  bytes blob = 8;
  float ratio = 9;
  Channel channel = 10;
  google.protobuf.Timestamp at = 11;
  google.protobuf.StringValue note = 12;
  repeated string tags = 13;
  map<string, int64> attrs = 14;
  Address ship = 15;
  optional int32 score = 16;
  oneof contact { string email = 17; string phone = 18; }
  repeated Address stops = 19;
"""
HEADER = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
"""
V1 = HEADER + "message Order {" + ORDER_FIELDS + "}\nmessage Refund { int64 id = 1; }\n"
V2 = HEADER + "message Order {" + ORDER_FIELDS + "  string coupon = 20;\n}\n"
"""Version 2: a field added (a compatible change)."""
CLASHING = HEADER + "message Order { string id = 1; }\n"
"""A version whose field 1 has another wire type (length-delimited, not a varint)."""

UTC = dt.UTC


def compiled(text: str, name: str = "order.proto") -> bytes:
    return descriptor_set({name: text}, name, what="test schema")


def message_class(content: bytes, name: str = "shop.Order") -> Any:
    return message_factory.GetMessageClass(pool_of(content).FindMessageTypeByName(name))


def order(cls: Any, n: int) -> Any:
    """Order ``n`` (of ``cls``: version 1's or 2's), its optional parts set on some orders."""
    out = cls(
        id=n,
        user=f"u{n % 7}",
        amount=n / 4,
        big=2**64 - 1 - n,
        small=2**32 - 1 - n,
        delta=-n,
        paid=n % 2 == 0,
        blob=bytes([n % 256, 0xFF]),
        ratio=0.5,
        channel=n % 2,
        tags=[f"t{i}" for i in range(n % 3)],
        attrs={"n": n},
    )
    out.at.FromDatetime(dt.datetime(2026, 11, 29, tzinfo=UTC) + dt.timedelta(microseconds=n))
    if n % 3:
        out.note.value = f"note {n}"
        out.ship.city = f"c{n % 5}"
        out.score = n
        out.email = f"{n}@example.org"
    else:
        out.phone = str(n)
    out.stops.add(city="a", zip="1")
    if hasattr(out, "coupon"):
        out.coupon = f"C{n}"
    return out


def order_row(n: int, *, coupon: bool = False) -> dict:
    """The row :func:`order` ``n`` lands as."""
    optional = bool(n % 3)
    row = {
        "id": n,
        "user": f"u{n % 7}",
        "amount": n / 4,
        "big": 2**64 - 1 - n,
        "small": 2**32 - 1 - n,
        "delta": -n,
        "paid": n % 2 == 0,
        "blob": bytes([n % 256, 0xFF]),
        "ratio": 0.5,
        "channel": ("WEB", "APP")[n % 2],
        "at": dt.datetime(2026, 11, 29, tzinfo=UTC) + dt.timedelta(microseconds=n),
        "note": f"note {n}" if optional else None,
        "tags": [f"t{i}" for i in range(n % 3)],
        "attrs": [("n", n)],
        "ship": {"city": f"c{n % 5}", "zip": ""} if optional else None,
        "score": n if optional else None,
        "email": f"{n}@example.org" if optional else None,
        "phone": None if optional else str(n),
        "stops": [{"city": "a", "zip": "1"}],
    }
    if coupon:
        row["coupon"] = f"C{n}"
    return row


def framed(schema_id: int, body: bytes, indexes: bytes = b"\x00") -> bytes:
    """A value as registry clients frame it (``indexes``: the message indexes' bytes)."""
    return b"\x00" + schema_id.to_bytes(4, "big") + indexes + body


def as_text(raw: bytes) -> str:
    """A value's bytes as a source keeps them."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return NOT_UTF8_PREFIX + base64.b64encode(raw).decode()


def framed_decoder(version: int, **kw: Any) -> ProtobufDecoder:
    """Reads as ``version`` of subject ``orders-value``: version 1 is id 11, 2 id 12."""
    sets = {11: (1, compiled(V1)), 12: (2, compiled(V2))}
    return ProtobufDecoder(
        sets[10 + version][1],
        kw.pop("message", ""),
        sets,
        subject="orders-value",
        version=version,
        what=f"version {version} of subject 'orders-value'",
        **kw,
    )
