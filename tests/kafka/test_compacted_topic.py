"""The pipeline on a compacted topic (``cleanup.policy=compact``), on the real broker: Kafka's
cleaner keeps the newest record of each key and removes the older ones, before the pipeline
reads them (gaps in the offsets it reads) and after (records in the sink that the topic no
longer holds). The pipeline reads what the topic holds, once; ``verify`` finds nothing missing,
doubled or out of range, before and after the cleaner removed records the sink already has.

librdkafka's mock cluster has no cleaner: this needs the broker (see conftest)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from itertools import count
from pathlib import Path

from confluent_kafka import Producer
from deltalake import DeltaTable
from fault_tools import assert_exactly_once, wait_for

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.ops.verify import audit
from modeswitch.runners.pipeline_run import run_pipeline
from modeswitch.sources import open_log
from modeswitch.sources.kafka import SCHEME

PARTITIONS = 2
KEYS = 20
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "100",  # a segment rolls once a record comes 100 ms after its first
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
}
_rounds = count()


def _produce_rounds(producer: Producer, topic: str, rounds: int) -> None:
    """Each round writes every key once to each partition; rounds 300 ms apart, so each lands
    in a segment of its own and all but the newest can be cleaned."""
    for _ in range(rounds):
        number = next(_rounds)
        for partition in range(PARTITIONS):
            for key in range(KEYS):
                value = {"round": number, "key": key, "partition": partition}
                producer.produce(
                    topic, json.dumps(value).encode(), f"k{key}".encode(), partition=partition
                )
        producer.flush(30)
        time.sleep(0.3)


def _held(log, below: dict[int, int]) -> dict[int, list[int]]:
    return {b: log.held_offsets(b, 0, end).tolist() for b, end in below.items()}


def _positions(held: dict[int, list[int]]) -> set[tuple[int, int]]:
    return {(b, o) for b, offsets in held.items() for o in offsets}


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    wait_for(condition, what, timeout=120)


def test_a_compacted_topic_is_read_once_and_verified_after_the_cleaner_ran(
    kafka_cluster: KafkaBroker, tmp_path: Path
) -> None:
    topic = f"compacted{os.getpid()}"
    kafka_cluster.create_topic(topic, PARTITIONS, **COMPACTED)
    source = f"{SCHEME}{topic}"
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "compacted",
            "source": source,  # no value_schema: the records land raw
            "warehouse": str(tmp_path / "warehouse"),
            "wave_records": "100",
            "max_split_records": "50",
            "max_records_per_trigger": "100",
            "trigger_interval": "200ms",
        }
    )
    with (
        contextlib.closing(open_log(source)) as log,
        contextlib.closing(Producer(kafka_cluster.config)) as producer,
    ):
        _read_once_before_and_after_the_cleaner(settings, log, producer)


def _read_once_before_and_after_the_cleaner(settings, log, producer: Producer) -> None:
    topic, source = log.topic, settings.source
    assert log.compacting
    _produce_rounds(producer, topic, rounds=8)
    written = PARTITIONS * KEYS * 8

    # The cleaner ran before the pipeline reads: the offsets it reads have gaps.
    _wait_for(
        lambda: sum(map(len, _held(log, log.latest_offsets()).values())) < written / 2,
        "the cleaner to compact the first rounds",
    )
    before = log.latest_offsets()
    assert sum(before.values()) == written  # the offsets stay; the records are gone
    held_before = _positions(_held(log, before))

    done = run_pipeline(settings, until="caught-up")
    assert all(status == "completed" for _, status, _ in done)
    first = audit(source, settings.sink, settings.quarantine, settings.pipeline)
    assert first.ok, first
    sink = DeltaTable(settings.sink).to_pyarrow_table(columns=["bucket", "offset"])
    in_sink = set(
        zip(sink.column("bucket").to_pylist(), sink.column("offset").to_pylist(), strict=True)
    )
    assert sink.num_rows == len(in_sink)  # none twice
    # What the topic held when the read began, less what the cleaner took while it ran, and
    # every record it still holds: nothing skipped, nothing the topic did not hold.
    assert _positions(_held(log, before)) <= in_sink <= held_before
    assert first.totals.expected == sink.num_rows

    # New rounds of the same keys: the cleaner removes records the sink already holds. The
    # audit takes them as read before they went; nothing shows as out of range or missing.
    _produce_rounds(producer, topic, rounds=3)
    _wait_for(
        lambda: not in_sink <= _positions(_held(log, before)),
        "the cleaner to remove records the sink holds",
    )
    after = audit(source, settings.sink, settings.quarantine, settings.pipeline)
    assert after.ok, after
    assert (after.totals.missing, after.totals.duplicated, after.totals.out_of_range) == (0, 0, 0)
    assert after.totals.expected == first.totals.expected
    assert_exactly_once(settings)
