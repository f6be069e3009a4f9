"""How a Kafka read groups its work (:meth:`modeswitch.sources.kafka.KafkaLog.read_ranges`): a
task's or a micro-batch's ranges into rounds one consumer reads at once, and what a
``consume()`` returned into runs of one partition's records between errors."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any


def read_rounds(ranges: Sequence[tuple[int, int, int]]) -> list[dict[int, tuple[int, int]]]:
    """``ranges`` as rounds of at most one range per partition, in order: the ranges of a
    partition that follow on from each other (a split bucket's pieces) joined into one."""
    rounds: list[dict[int, tuple[int, int]]] = []
    for partition, start, end in ranges:
        for round_ in rounds:
            held = round_.get(partition)
            if held is None or held[1] == start:
                round_[partition] = (start if held is None else held[0], end)
                break
        else:
            rounds.append({partition: (start, end)})
    return rounds


def partition_runs(messages: list[Any]) -> Iterator[tuple[int, list[Any], Any]]:
    """``messages`` as ``(partition, records, None)`` for each run of records of one partition
    between errors, and ``(partition, [], message)`` for each error."""
    run: list[Any] = []
    for message in messages:
        partition = message.partition()
        if message.error() is not None:
            if run:
                yield run[0].partition(), run, None
                run = []
            yield partition, [], message
        elif run and run[0].partition() != partition:
            yield run[0].partition(), run, None
            run = [message]
        else:
            run.append(message)
    if run:
        yield run[0].partition(), run, None


__all__ = ["partition_runs", "read_rounds"]
