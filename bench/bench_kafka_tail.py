"""Benchmark: what the warm engine's ask for a Kafka topic's records costs.

    .venv/bin/python bench/bench_kafka_tail.py [--rounds 10] [--partitions 8]

A warm engine whose stream path awaits its topic's records asks for them every
``WARM_UP_RETRY_SECONDS`` (:class:`modeswitch.runners.engine_server.StreamPath`): one call of
:func:`modeswitch.modes.warmup.kafka_tail` (a metadata request and each partition's offsets).
This starts a loopback Kafka broker (:class:`modeswitch.devtools.kafka_broker.KafkaBroker`,
the project's own jars), makes an empty topic and one with records, and times the call on a
topic not there, the empty one and the full one: wall and CPU (this process, librdkafka's
threads included), medians of ``--rounds`` after one call to warm up. The broker is stopped
at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer

from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.modes.warmup import WARM_UP_RECORDS, kafka_tail
from modeswitch.sources.kafka import kafka_environment


def timed(source: str, rounds: int) -> tuple[float, float, bool]:
    """Medians of ``rounds`` calls' wall and CPU seconds, and whether the tail was found."""
    kafka_tail(source, WARM_UP_RECORDS)
    walls, cpus, found = [], [], False
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        found = kafka_tail(source, WARM_UP_RECORDS) is not None
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="bench-kafka-tail-") as work,
        KafkaBroker(Path(work)) as broker,
    ):
        os.environ.update(kafka_environment(broker.config))
        broker.create_topic("empty", args.partitions)
        broker.create_topic("full", args.partitions)
        producer = Producer(broker.config)
        for i in range(4 * WARM_UP_RECORDS):
            producer.produce("full", b"{}", partition=i % args.partitions)
        producer.flush(30)
        for topic in ("not-there", "empty", "full"):
            wall, cpu, found = timed(f"kafka://{topic}", args.rounds)
            print(
                f"{topic:>9}: {wall * 1000:6.1f} ms wall, {cpu * 1000:5.1f} ms CPU "
                f"(medians of {args.rounds}; records to warm up on: {'yes' if found else 'no'})"
            )


if __name__ == "__main__":
    main()
