"""A batch wave's task reports the seconds it spent reading, parsing and writing
(modeswitch.sinks.arrow_wave.run_phases): each stage pulls from the one before, so each one's
own time is what its next() took less what the stage it pulls from took. Timed on a clock the
stages move by known amounts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from modeswitch.sinks.arrow_wave import WavePhases, run_phases


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_stage_is_timed_apart_from_the_stages_it_pulls_from() -> None:
    clock = Clock()

    def read() -> Iterator[int]:
        for batch in range(3):
            clock.now += 1.0  # a second to read each batch
            yield batch
        clock.now += 0.5  # and half a second to find there is no more

    def parse(batches: Iterator[int]) -> Iterator[int]:
        for batch in batches:
            clock.now += 2.0  # two seconds to parse each
            yield batch * 10

    def write(batches: Iterator[int]) -> list[int]:
        written = []
        for batch in batches:
            clock.now += 4.0  # four to write each
            written.append(batch)
        clock.now += 0.25  # the footer
        return written

    message, phases = run_phases(read(), parse, write, clock=clock)
    assert message == [0, 10, 20]
    assert phases == WavePhases(read=3.5, parse=6.0, write=12.25)
    assert clock.now == pytest.approx(100.0 + 3.5 + 6.0 + 12.25)


def test_a_transform_that_drops_every_batch_still_counts_its_time_and_the_reads() -> None:
    clock = Clock()

    def read() -> Iterator[int]:
        for batch in range(4):
            clock.now += 1.0
            yield batch

    def drop_all(batches: Iterator[int]) -> Iterator[int]:
        for _ in batches:
            clock.now += 0.5
        return
        yield  # a generator that yields nothing

    _, phases = run_phases(read(), drop_all, lambda batches: list(batches), clock=clock)
    assert phases == WavePhases(read=4.0, parse=2.0, write=0.0)


def test_phases_sum_over_a_waves_tasks_and_read_in_the_log_line() -> None:
    total = sum([WavePhases(1.0, 2.0, 3.0), WavePhases(0.5, 0.25, 1.0)], WavePhases())
    assert total == WavePhases(1.5, 2.25, 4.0)
    assert str(total) == "read 1.50 s, parse 2.25 s, write 4.00 s"
