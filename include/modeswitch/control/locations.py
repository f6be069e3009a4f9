"""What a ``source`` setting names, read from the URL alone: no client, no broker, no file.

The settings check a ``kafka://`` source here when they are built, and the Kafka log
(:mod:`modeswitch.sources.kafka`, which re-exports these names) opens its topic from the same
parse, so both refuse the same URLs with the same message.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from modeswitch.errors import ConfigError

SCHEME = "kafka://"


def is_kafka_source(source: str) -> bool:
    """Whether ``source`` names a Kafka topic (``kafka://...``, any case)."""
    return source.lower().startswith(SCHEME)


HEADERS_COLUMN = "headers"
"""The column a Kafka record's headers land in with ``kafka://<topic>?headers=true``: an
array of ``struct<key string, value binary>`` in the order they were written, null for a
record without headers (Spark's Kafka source's own ``headers`` column)."""

_PARAMETERS = "event_time=<JSON field> (default: the message timestamp), headers=true|false"
_SWITCH = {"true": True, "false": False, "": False}


@dataclass(frozen=True)
class KafkaLocation:
    """``kafka://<topic>[?event_time=<field>][&headers=true]``, parsed."""

    topic: str
    event_time_field: str | None = None
    headers: bool = False
    """Whether the records' headers are read, into :data:`HEADERS_COLUMN`."""

    @classmethod
    def parse(cls, source: str) -> KafkaLocation:
        """The topic, event-time field and headers switch of ``source``; a
        :class:`ConfigError` naming the ``source`` setting and the URL when it names no topic
        or has an unknown parameter or value."""
        if not is_kafka_source(source):
            raise ConfigError(f"source: {source!r} is not kafka://<topic>", setting="source")
        parts = urlsplit(source)
        topic = unquote(parts.netloc + parts.path).strip("/")
        if not topic or "/" in topic:
            raise ConfigError(
                f"source: {source!r} names no topic; expected kafka://<topic>"
                "[?event_time=<JSON field>][&headers=true]",
                setting="source",
            )
        params = parse_qs(parts.query, keep_blank_values=True)
        unknown = sorted(set(params) - {"event_time", "headers"})
        if unknown:
            raise ConfigError(
                f"source: {source!r}: unknown parameter(s) {', '.join(unknown)}; the known "
                f"ones are {_PARAMETERS}",
                setting="source",
            )
        field = (params.get("event_time") or [""])[-1].strip()
        switch = (params.get("headers") or [""])[-1].strip().lower()
        if switch not in _SWITCH:
            raise ConfigError(
                f"source: {source!r}: headers={switch!r} is neither true nor false",
                setting="source",
            )
        return cls(topic=topic, event_time_field=field or None, headers=_SWITCH[switch])


def record_columns(source: str) -> tuple[str, ...]:
    """The columns a record of ``source`` has beyond ``bucket, offset, event_time, key,
    value``: :data:`HEADERS_COLUMN` for a topic read with its headers, else none. A payload's
    field may not take their names."""
    keeps_headers = is_kafka_source(source) and KafkaLocation.parse(source).headers
    return (HEADERS_COLUMN,) if keeps_headers else ()


__all__ = ["HEADERS_COLUMN", "SCHEME", "KafkaLocation", "is_kafka_source", "record_columns"]
