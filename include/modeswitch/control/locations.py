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


@dataclass(frozen=True)
class KafkaLocation:
    """``kafka://<topic>[?event_time=<field>]``, parsed."""

    topic: str
    event_time_field: str | None = None

    @classmethod
    def parse(cls, source: str) -> KafkaLocation:
        """The topic and event-time field of ``source``; a :class:`ConfigError` naming the
        ``source`` setting and the URL when it names no topic or has an unknown parameter."""
        if not is_kafka_source(source):
            raise ConfigError(f"source: {source!r} is not kafka://<topic>", setting="source")
        parts = urlsplit(source)
        topic = unquote(parts.netloc + parts.path).strip("/")
        if not topic or "/" in topic:
            raise ConfigError(
                f"source: {source!r} names no topic; expected kafka://<topic>"
                "[?event_time=<JSON field>]",
                setting="source",
            )
        params = parse_qs(parts.query, keep_blank_values=True)
        unknown = sorted(set(params) - {"event_time"})
        if unknown:
            raise ConfigError(
                f"source: {source!r}: unknown parameter(s) {', '.join(unknown)}; the only one "
                "is event_time=<JSON field> (default: the message timestamp)",
                setting="source",
            )
        field = (params.get("event_time") or [""])[-1].strip()
        return cls(topic=topic, event_time_field=field or None)


__all__ = ["SCHEME", "KafkaLocation", "is_kafka_source"]
