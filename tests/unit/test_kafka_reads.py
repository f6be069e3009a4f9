"""How a Kafka read groups its work (modeswitch.sources.kafka_reads), without a broker: ranges
into rounds one consumer reads at once, fetched messages into runs of one partition."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from modeswitch.sources.kafka_reads import partition_runs, read_rounds

pytestmark = pytest.mark.unit


def test_a_split_bucket_is_one_range_and_a_range_apart_waits_for_a_second_round() -> None:
    ranges = [(0, 0, 10), (1, 5, 7), (0, 10, 20), (0, 40, 50), (1, 7, 9)]
    assert read_rounds(ranges) == [{0: (0, 20), 1: (5, 9)}, {0: (40, 50)}]


@dataclass
class Message:
    part: int
    at: int
    failed: bool = False

    def partition(self) -> int:
        return self.part

    def offset(self) -> int:
        return self.at

    def error(self) -> object | None:
        return "eof" if self.failed else None


def test_messages_come_out_as_runs_of_one_partition_between_errors() -> None:
    a, b, c, d = Message(0, 1), Message(0, 2), Message(1, 7), Message(1, 9)
    eof = Message(1, 8, failed=True)
    runs = list(partition_runs([a, b, c, eof, d]))
    assert runs == [(0, [a, b], None), (1, [c], None), (1, [], eof), (1, [d], None)]
