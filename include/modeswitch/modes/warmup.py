"""The stream standby's warm-up: a throwaway stream run the way an epoch runs, so that the epoch
that follows in the same session starts warm (:func:`warm_up`; used by ``jobs/stream.py
--standby``, :mod:`modeswitch.runners.jobs`)."""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pendulum
import pyarrow as pa

from modeswitch.control.settings import PipelineSettings
from modeswitch.control.value_schema import PayloadField, is_nested
from modeswitch.errors import StreamQueryError, TopicNotFoundError
from modeswitch.modes.job import resolve_job
from modeswitch.modes.stream_query import checkpoint_conf, sink_stream
from modeswitch.modes.stream_waves import discard_untaken
from modeswitch.offsets import OffsetsMap, offsets_to_json
from modeswitch.sinks.commits import committed_offsets, sink_commits
from modeswitch.sources import open_log
from modeswitch.sources.segments import SegmentLog
from modeswitch.spark_conf import session_conf
from modeswitch.storage import remove_tree

log = logging.getLogger(__name__)

WARM_UP_RECORDS = 2_000
WARM_UP_TIMEOUT = timedelta(minutes=5)
WARM_UP_POLL = timedelta(milliseconds=200)


@dataclass(frozen=True)
class WarmUp:
    """What a warm-up did: the records its sink committed (data and quarantine), how many of
    them went to quarantine, how long it took, and whether it read generated events in place
    of a Kafka topic that held nothing yet (``stand_in``: the rest of the path is warm, Spark's
    Kafka source is not)."""

    records: int
    seconds: float
    quarantined: int = 0
    stand_in: bool = False


def append_warm_up_events(
    log_: SegmentLog, records: int, *, fields: Sequence[PayloadField] = ()
) -> None:
    """Append ``records`` events for a warm-up to ``log_``: the last minute's, over its
    buckets, every tenth one malformed so that the quarantine's path warms up too. Their
    payload fits ``value_schema``'s ``fields`` (the pipeline's payload:
    :func:`warm_up_payload`), or is the demo's events
    (:data:`modeswitch.transforms.EVENT_SCHEMA`) without any, which a pipeline that lands its
    records raw takes as they are."""
    buckets = log_.buckets()
    now_us = int(pendulum.now("UTC").timestamp() * 1_000_000)
    values = [
        "{not json"
        if i % 10 == 9
        else json.dumps(
            warm_up_payload(fields, i)
            if fields
            else {
                "event_id": i,
                "user_id": i % 97,
                "action": "view",
                "amount": 1.5,
                "country": "DE",
            }
        )
        for i in range(records)
    ]
    events = pa.table(
        {
            "event_time": pa.array(
                [now_us - 60_000_000 + i * 60_000_000 // max(1, records) for i in range(records)],
                pa.timestamp("us", tz="UTC"),
            ),
            "key": pa.array([f"user-{i % 97}" for i in range(records)]),
            "value": pa.array(values),
        }
    )
    for at, bucket in enumerate(buckets):
        log_.append(bucket, events.take(list(range(at, records, len(buckets)))))


_SAMPLES: dict[str, Callable[[int], Any]] = {
    "long": lambda i: i,
    "integer": lambda i: i,
    "short": lambda i: i % 30_000,
    "double": lambda i: i + 0.5,
    "float": lambda i: 1.5,
    "string": lambda i: f"warm-up-{i % 97}",
    "boolean": lambda i: i % 2 == 0,
    "timestamp": lambda i: f"2026-01-01T00:00:{i % 60:02d}Z",
    "timestamp_ntz": lambda i: f"2026-01-01T00:00:{i % 60:02d}",
    "date": lambda i: f"2026-01-{i % 28 + 1:02d}",
}


def kafka_tail(source: str, records: int) -> OffsetsMap | None:
    """Where a warm-up on the topic ``source`` starts: each partition's latest offset less its
    share of ``records`` (never below its earliest), or None when the topic holds nothing or
    is not there yet (a broker that does not answer raises)."""
    log_ = open_log(source)
    try:
        earliest, latest = log_.earliest_offsets(), log_.latest_offsets()
    except TopicNotFoundError:
        return None
    finally:
        log_.close()
    share = max(1, records // max(1, len(latest)))
    start = {b: max(earliest.get(b, 0), end - share) for b, end in latest.items()}
    if not any(latest[b] > start[b] for b in latest):
        return None
    return start


def warm_up_payload(fields: Sequence[PayloadField], index: int) -> dict[str, Any]:
    """A well-formed payload of ``value_schema``'s ``fields`` (every field set, of its type):
    what a warm-up's good records hold, so that they take the parse's path to the table."""
    return {f.name: _sample(f.type, index) for f in fields}


def _sample(type_name: str, index: int) -> Any:
    """A value of a field of ``type_name``: an empty object or array for a nested type's, 0
    for a decimal's (it fits any DECIMAL(p,s), DECIMAL(3,3) too)."""
    if type_name in _SAMPLES:
        return _SAMPLES[type_name](index)
    if is_nested(type_name):
        return [] if type_name.startswith("array<") else {}
    return 0


class WarmingUp:
    """A warm-up stream started and not waited for (:func:`start_warm_up`): it runs in Spark's
    own threads beside whatever the session does next, and :meth:`finish` collects it."""

    def __init__(
        self, query: Any, work: str, started: float, start: OffsetsMap, stand_in: bool = False
    ) -> None:
        self.query, self.work, self.started, self.start = query, work, started, start
        self.stand_in = stand_in

    def ended(self) -> bool:
        """Whether the warm-up query has ended (its ``availableNow`` run read everything)."""
        return not self.query.isActive

    def _remove_work(self, attempts: int = 5, pause: float = 0.5) -> None:
        """Remove the warm-up's folder. A query stopped mid-micro-batch can leave a task still
        writing into it for a moment (delta-spark's write, interrupted: a file created while
        the folder was being deleted, seen in `make test`'s random faults), so the delete is
        tried again; a folder that still cannot go is logged and left, never failing the
        standby it warmed."""
        for attempt in range(attempts):
            try:
                remove_tree(self.work)
                return
            except OSError as exc:
                if attempt == attempts - 1:
                    log.warning("stream warm-up: its folder %s stays: %s", self.work, exc)
                    return
                time.sleep(pause)

    def finish(self) -> WarmUp | None:
        """Stop the query if it still runs (what is warm by then is kept), remove its folder,
        and say what it did; None if it failed (logged: it only means a cold start)."""
        try:
            self.query.stop()
            error = self.query.exception()
            if error is not None:
                raise StreamQueryError(f"the warm-up query failed: {error}") from error
            committed = committed_offsets(f"{self.work}/sink", "warm-up")
            done = WarmUp(
                sum(end - self.start.get(b, 0) for b, end in committed.items()),
                time.monotonic() - self.started,
                sum(c.quarantined for c in sink_commits(f"{self.work}/sink", "warm-up")),
                self.stand_in,
            )
        except Exception as exc:  # a warm-up that fails only means a cold start
            log.warning("stream warm-up failed; the epoch will start cold: %s", exc)
            return None
        finally:
            discard_untaken(f"{self.work}/checkpoint")
            self._remove_work()
        log.info(
            "stream warm-up: %d records through source, transform and sink in %.1f s%s",
            done.records,
            done.seconds,
            " (generated events: the topic held nothing yet)" if self.stand_in else "",
        )
        return done


def start_warm_up(
    spark, settings: PipelineSettings, *, records: int = WARM_UP_RECORDS, stand_in: bool = True
) -> WarmingUp | None:
    """Start the warm-up stream of :func:`warm_up` and return without waiting for it (None if
    it could not start: logged, a cold start). The warm-up is a stream job of its own,
    resolved from ``settings`` here (:func:`~modeswitch.modes.job.resolve_job`): settings
    that cannot run a stream only mean a cold start too, and the epoch reports them. On a
    Kafka topic that holds nothing yet it reads generated events instead (``stand_in``), or,
    without ``stand_in``, starts nothing and returns None (quietly: the warm engine asks again
    until the topic has records, :class:`~modeswitch.runners.engine_server.StreamPath`)."""
    started = time.monotonic()
    # Beside the pipeline's state, not on the driver's disk: on a cluster the executors read
    # the warm-up's log and write its sink.
    work = f"{settings.state_root}/warm-up/{uuid.uuid4().hex[:12]}"
    try:
        job = resolve_job(settings, "stream")
        assert job.stream is not None
        # Spark's Kafka source warms up on the topic's own tail; a log read by bucketlog, or a
        # topic with nothing in it, on generated events.
        on_kafka = job.stream.reader == "kafka"
        tail = kafka_tail(settings.source, records) if on_kafka else None
        if on_kafka and not tail and not stand_in:
            log.debug("stream warm-up: the topic of %s holds nothing yet", settings.source)
            return None
        if tail:
            source, start, path = settings.source, tail, job.stream
        else:
            log_ = SegmentLog.create(f"{work}/log", buckets=2)
            append_warm_up_events(log_, records, fields=job.payload.fields)
            source, start, path = log_.root, log_.earliest_offsets(), job.stream_path_on(log_)
        writer = sink_stream(
            spark,
            job,
            path,
            source=source,
            start_json=offsets_to_json(start),
            sink=f"{work}/sink",
            options={
                "pipeline": "warm-up",
                "epoch": "1",
                "mode": "stream",
                "quarantinePath": f"{work}/quarantine",
            },
            checkpoint=f"{work}/checkpoint",
        )
        with session_conf(spark, checkpoint_conf(work)):
            query = writer.trigger(availableNow=True).start()
    except Exception as exc:  # a warm-up that fails only means a cold start
        log.warning("stream warm-up failed; the epoch will start cold: %s", exc)
        discard_untaken(f"{work}/checkpoint")
        remove_tree(work)
        return None
    return WarmingUp(query, work, started, start, stand_in=on_kafka and not tail)


def warm_up(
    spark,
    settings: PipelineSettings,
    *,
    records: int = WARM_UP_RECORDS,
    should_stop: Callable[[], bool] = lambda: False,
) -> WarmUp | None:
    """Run a throwaway stream the way an epoch runs, so that the epoch that follows starts warm.

    A stream's first micro-batch in a new session pays for everything that starts on first
    use: a Python process for each step of the ``bucketlog`` source and the ``modeswitch_delta``
    sink (lookup, schema, planning, reading and writing workers, the commit) and the JVM's
    first compilations of the query. Measured here: a stream's
    start to its first commit of 80 000 records took 9.3 s in a new session and 2.9 s in a
    session that had run one stream before.

    The warm-up stream reads ``records`` generated events from a two-bucket log in a folder of
    its own under ``<state_root>/warm-up/`` (where the executors of a cluster reach it, unlike
    the driver's disk), applies the pipeline's transform with its watermark, and writes them
    with the ``modeswitch_delta`` sink into that folder (``availableNow``); the folder is
    removed after. On a Kafka topic it reads the topic's own last ``records`` (spread over its
    partitions: :func:`kafka_tail`) with Spark's Kafka source, as the epoch will, so that the
    Kafka source, its consumers and their connections are warm too; a topic with nothing in
    it gets the generated events.
    Nothing of the pipeline's is touched, and the session's settings are put back. It stops
    early once ``should_stop()`` (its epoch has come: what is warm by then is kept). Returns what
    it did, or None if it failed: a failed warm-up is logged and only means a cold start (the
    epoch itself reports any real fault). :func:`start_warm_up` starts the same stream without
    waiting for it (the warm engine runs it beside its first batch).
    """
    warming = start_warm_up(spark, settings, records=records)
    if warming is None:
        return None
    deadline = warming.started + WARM_UP_TIMEOUT.total_seconds()
    with contextlib.suppress(Exception):  # a failed query is told by finish()
        while not warming.query.awaitTermination(WARM_UP_POLL.total_seconds()):
            if should_stop() or time.monotonic() > deadline:
                break
    return warming.finish()
