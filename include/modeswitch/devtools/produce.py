"""Synthetic events for the embedded log or a Kafka topic: a backlog, a live stream at a rate.

Record ``i`` of a run depends only on the seed and ``i`` (records are generated in fixed
blocks, each from its own seeded generator), so the same seed gives the same buckets, keys
and payloads however the run is paced. Event times come from the clock passed in: a backlog
spreads them over ``span`` before its start, a live run stamps them as they are produced.
A fraction of events is *late* (event time pushed back by up to ``max_lateness``) and a
fraction is *malformed* (a payload that is not valid JSON).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pendulum
import pyarrow as pa
import pyarrow.compute as pc

from modeswitch.errors import ConfigError
from modeswitch.sinks.commits import event_time_to_micros
from modeswitch.sources.kafka import KafkaLog
from modeswitch.sources.segments import SegmentLog

log = logging.getLogger(__name__)

EventLog = SegmentLog | KafkaLog

BLOCK = 4096
APPEND_THREADS = 4
ACTIONS = np.array(["view", "click", "add_to_cart", "purchase", "refund"])
COUNTRIES = np.array(["DE", "FR", "US", "BR", "IN", "JP", "NG", "AU"])
MALFORMED = np.array(['{"user_id": 17, "action": "cli', "not json at all", '{"user_id": }', ""])


def parse_skew(text: str, buckets: int) -> np.ndarray:
    """Bucket weights from ``uniform`` or ``zipf:S`` (bucket 0 heaviest, weight ∝ rank^-S)."""
    text = text.strip().lower()
    if text in ("", "none", "uniform"):
        return np.full(buckets, 1.0 / buckets)
    if text.startswith("zipf:"):
        try:
            exponent = float(text.split(":", 1)[1])
        except ValueError as exc:
            raise ConfigError(f"--skew: {text!r} is not 'zipf:<exponent>'") from exc
        if exponent <= 0:
            raise ConfigError(f"--skew: zipf exponent must be > 0, got {exponent}")
        weights = np.arange(1, buckets + 1, dtype=float) ** -exponent
        return weights / weights.sum()
    raise ConfigError(f"--skew: {text!r} is not 'uniform' or 'zipf:<exponent>'")


@dataclass(frozen=True)
class EventGenerator:
    """Deterministic synthetic events; ``generate(first, count, times)`` is a pure function."""

    seed: int
    buckets: int
    skew: str = "uniform"
    late_fraction: float = 0.0
    malformed_fraction: float = 0.0
    max_lateness: timedelta = timedelta(minutes=10)

    def __post_init__(self) -> None:
        for name in ("late_fraction", "malformed_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"--{name.replace('_', '-')}: {value} is not within [0, 1]")
        object.__setattr__(self, "_weights", parse_skew(self.skew, self.buckets))

    def _block(self, index: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, index])
        weights = self._weights  # type: ignore[attr-defined]
        return {
            "bucket": rng.choice(self.buckets, size=BLOCK, p=weights).astype(np.int32),
            "user": rng.integers(0, 100_000, size=BLOCK),
            "action": rng.integers(0, len(ACTIONS), size=BLOCK),
            "country": rng.integers(0, len(COUNTRIES), size=BLOCK),
            "cents": rng.integers(0, 100_000, size=BLOCK),
            "late": rng.random(size=BLOCK) < self.late_fraction,
            "lateness_us": rng.integers(
                1, max(2, int(self.max_lateness.total_seconds() * 1e6)), size=BLOCK
            ),
            "malformed": rng.random(size=BLOCK) < self.malformed_fraction,
            "malformed_kind": rng.integers(0, len(MALFORMED), size=BLOCK),
        }

    def generate(self, first: int, count: int, event_times_us: np.ndarray) -> pa.Table:
        """Events ``first .. first+count-1`` with columns bucket, event_time, key, value.

        ``event_times_us`` gives each event's on-time event time (microseconds since the epoch);
        late events are pushed back from it.
        """
        if count == 0:
            return _empty_events()
        blocks = range(first // BLOCK, (first + count - 1) // BLOCK + 1)
        parts = [self._block(b) for b in blocks]
        lo = first - blocks.start * BLOCK
        cols = {k: np.concatenate([p[k] for p in parts])[lo : lo + count] for k in parts[0]}
        times = np.asarray(event_times_us, dtype=np.int64) - np.where(
            cols["late"], cols["lateness_us"], 0
        )
        ids = np.arange(first, first + count)
        user = pa.array(cols["user"]).cast(pa.string())
        amount = pa.array(cols["cents"] / 100.0).cast(pa.string())
        good = pc.binary_join_element_wise(
            '{"event_id": ',
            pa.array(ids).cast(pa.string()),
            ', "user_id": ',
            user,
            ', "action": "',
            pa.array(ACTIONS[cols["action"]]),
            '", "amount": ',
            amount,
            ', "country": "',
            pa.array(COUNTRIES[cols["country"]]),
            '"}',
            "",
        )
        value = pc.if_else(
            pa.array(cols["malformed"]), pa.array(MALFORMED[cols["malformed_kind"]]), good
        )
        key = pc.binary_join_element_wise("user-", user, "")
        return pa.table(
            {
                "bucket": pa.array(cols["bucket"], pa.int32()),
                "event_time": pa.array(times, pa.timestamp("us", tz="UTC")),
                "key": key,
                "value": value,
            }
        )


def _empty_events() -> pa.Table:
    return pa.table(
        {
            "bucket": pa.array([], pa.int32()),
            "event_time": pa.array([], pa.timestamp("us", tz="UTC")),
            "key": pa.array([], pa.string()),
            "value": pa.array([], pa.string()),
        }
    )


def append_events(
    log_: SegmentLog,
    events: pa.Table,
    *,
    segment_records: int = 100_000,
    on_append: Callable[[int, int, int], None] | None = None,
) -> dict[int, int]:
    """Append generated events to their buckets, at most ``segment_records`` per append.

    Returns the number of records appended per bucket. ``on_append(bucket, start, end)`` is
    called once each append is published (readers can see it).
    """
    if events.num_rows == 0:
        return {}
    order = pc.sort_indices(events, sort_keys=[("bucket", "ascending")])
    events = events.take(order)
    buckets = events.column("bucket").to_numpy()
    edges = np.flatnonzero(np.diff(buckets)) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [len(buckets)]])
    parts = {
        int(buckets[lo]): events.slice(lo, hi - lo).drop_columns(["bucket"])
        for lo, hi in zip(starts, ends, strict=True)
    }

    def append_bucket(bucket: int) -> None:
        part = parts[bucket]
        for at in range(0, part.num_rows, segment_records):
            chunk = part.slice(at, segment_records)
            # Full chunks are segments of their own; smaller ones may grow an open segment.
            start, end = log_.append(bucket, chunk, close=chunk.num_rows == segment_records)
            if on_append is not None:
                on_append(bucket, start, end)

    # Buckets are independent appenders; pyarrow writes without the GIL, so a live producer
    # publishing one segment per bucket per flush keeps up by appending them side by side.
    with ThreadPoolExecutor(max_workers=min(APPEND_THREADS, len(parts))) as pool:
        list(pool.map(append_bucket, parts))
    return {bucket: part.num_rows for bucket, part in parts.items()}


def _write(log_: EventLog, events: pa.Table, **options: Any) -> dict[int, int]:
    """Events to a log: a Kafka topic produces them (one message each, partition = bucket,
    timestamp = event time), the embedded log appends them as segments."""
    if isinstance(log_, SegmentLog):
        return append_events(log_, events, **options)
    return log_.write_events(events)


@dataclass
class ProduceReport:
    records: int
    per_bucket: dict[int, int]
    seconds: float


def produce_backlog(
    log_: EventLog,
    generator: EventGenerator,
    *,
    records: int,
    first: int = 0,
    span: timedelta = timedelta(0),
    now: datetime | None = None,
    chunk: int = 262_144,
    segment_records: int = 100_000,
    on_progress: Callable[[int], None] | None = None,
) -> ProduceReport:
    """Append ``records`` events as fast as possible, event times spread over ``span`` to now."""
    started = time.monotonic()
    end_us = event_time_to_micros(now or pendulum.now("UTC"))
    span_us = int(span.total_seconds() * 1e6)
    per_bucket: dict[int, int] = {}
    for at in range(0, records, chunk):
        count = min(chunk, records - at)
        idx = np.arange(at, at + count, dtype=np.int64)
        times = end_us - span_us + (idx * span_us) // max(1, records)
        events = generator.generate(first + at, count, times)
        for bucket, n in _write(log_, events, segment_records=segment_records).items():
            per_bucket[bucket] = per_bucket.get(bucket, 0) + n
        if on_progress:
            on_progress(count)
    return ProduceReport(records, dict(sorted(per_bucket.items())), time.monotonic() - started)


def produce_live(
    log_: EventLog,
    generator: EventGenerator,
    *,
    rate: float,
    duration: timedelta | None,
    records: int | None = None,
    first: int = 0,
    flush_every: timedelta = timedelta(milliseconds=100),
    clock: Callable[[], datetime] = lambda: pendulum.now("UTC"),
    should_stop: Callable[[], bool] = lambda: False,
    on_progress: Callable[[int], None] | None = None,
    on_append: Callable[[int, int, int], None] | None = None,
) -> ProduceReport:
    """Append events at ``rate`` per second, flushing every ``flush_every``, until ``duration``
    has passed, ``records`` were written, or ``should_stop()`` says so. ``on_append`` goes to
    :func:`append_events`."""
    if duration is None and records is None:
        raise ConfigError("a live producer needs --duration or --records to know when to stop")
    started = time.monotonic()
    produced = 0
    per_bucket: dict[int, int] = {}
    limit = records if records is not None else math.inf
    for due in _ticks(started, rate, duration, flush_every):
        if should_stop():
            break
        count = int(min(due, limit)) - produced
        if count > 0:
            times = np.full(count, event_time_to_micros(clock()), dtype=np.int64)
            events = generator.generate(first + produced, count, times)
            for bucket, n in _write(log_, events, on_append=on_append).items():
                per_bucket[bucket] = per_bucket.get(bucket, 0) + n
            produced += count
            if on_progress:
                on_progress(count)
        if produced >= limit:
            break
    return ProduceReport(produced, dict(sorted(per_bucket.items())), time.monotonic() - started)


def _ticks(
    started: float, rate: float, duration: timedelta | None, every: timedelta
) -> Iterator[float]:
    """Yield, every ``every``, how many records should have been produced by now."""
    interval = every.total_seconds()
    stop_at = started + duration.total_seconds() if duration is not None else math.inf
    tick = started
    while True:
        tick += interval
        now = time.monotonic()
        if tick > now:
            time.sleep(min(tick, stop_at) - now if stop_at > now else 0)
        now = time.monotonic()
        yield rate * (min(now, stop_at) - started)
        if now >= stop_at:
            return


__all__ = [
    "EventGenerator",
    "ProduceReport",
    "append_events",
    "parse_skew",
    "produce_backlog",
    "produce_live",
]
