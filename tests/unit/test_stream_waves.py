"""The ``arrow`` stream writer's choices (modeswitch.modes.stream_waves): where a micro-batch's
wave runs, by its size, and how a large one is cut into tasks."""

from __future__ import annotations

import itertools

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError, SourceUnavailableError
from modeswitch.modes.stream_waves import (
    MicroBatchWaves,
    ReadAhead,
    micro_batch_partitions,
    read_ahead_ends,
    where_micro_batch_runs,
)
from modeswitch.sinks.arrow_wave import WrittenAhead

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("records", "runs_in"),
    [(0, ("driver", 1)), (1, ("driver", 1)), (50_000, ("driver", 1)), (50_001, ("spark", 3))],
)
def test_a_micro_batch_up_to_the_limit_runs_in_the_driver_as_one_partition(
    records: int, runs_in: tuple[str, int]
) -> None:
    assert where_micro_batch_runs(records, 50_000, 3) == runs_in


def test_the_limit_is_a_setting_above_zero() -> None:
    base = {"pipeline": "p", "source": "/tmp/log", "warehouse": "/tmp/wh"}
    assert PipelineSettings.from_mapping(base).stream_driver_records == 100_000
    with pytest.raises(ConfigError, match="stream_driver_records"):
        PipelineSettings.from_mapping({**base, "stream_driver_records": "0"})


def test_a_micro_batch_is_cut_and_balanced_as_a_wave_and_covers_its_offsets() -> None:
    start = {0: 100, 1: 0, 2: 7}
    end = {0: 400, 1: 50, 2: 7, 3: 20}  # bucket 3 is new: read from 0
    partitions = micro_batch_partitions(start, end, max_split_records=100, parallelism=2)
    assert len(partitions) == 2
    ranges = sorted(r for partition in partitions for r in partition)
    assert all(hi - lo <= 100 for _, lo, hi in ranges)
    covered: dict[int, list[tuple[int, int]]] = {}
    for bucket, lo, hi in ranges:
        covered.setdefault(bucket, []).append((lo, hi))
    # Each bucket's pieces join end to end from its start to its end: no gap, no overlap.
    for bucket, pieces in covered.items():
        assert pieces[0][0] == start.get(bucket, 0) and pieces[-1][1] == end[bucket]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    assert set(covered) == {0, 1, 3}
    sizes = sorted(sum(hi - lo for _, lo, hi in p) for p in partitions)
    assert sizes[1] - sizes[0] <= 100  # balanced


def test_a_micro_batch_with_nothing_to_read_is_one_empty_partition() -> None:
    # Kafka's offsets can move over transaction markers alone: the offsets still commit.
    assert micro_batch_partitions({0: 5}, {0: 5}, max_split_records=10, parallelism=2) == ((),)


def test_a_first_micro_batch_is_read_ahead_to_the_logs_latest_offsets_when_they_fit() -> None:
    start = {0: 100, 1: 50}
    latest = {0: 160, 1: 50, 2: 30}  # bucket 2 is new: read from 0
    ahead = {0: 160, 1: 50, 2: 30}
    assert read_ahead_ends(start, latest, most=90) == ahead
    # More than a micro-batch run in the driver holds: nothing ahead.
    assert read_ahead_ends(start, latest, most=89) == start


def test_a_kafka_topic_is_not_read_ahead(caplog: pytest.LogCaptureFixture) -> None:
    """Its offsets are not its record count, so no commit could catch a read ahead that
    differed: no thread, no client."""
    ahead = ReadAhead.begin(
        "kafka://broker:9092/t", {0: 5}, None, None, {}, contiguous=False, most=100
    )
    assert ahead.take({0: 5}, {0: 9}, "driver") == ({0: 5}, WrittenAhead())
    assert not caplog.text


def test_a_read_ahead_that_failed_leaves_the_micro_batch_its_whole_range(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ahead = ReadAhead.begin(
        "/nonexistent/log",
        {0: 5},
        lambda batches: batches,
        None,
        {"path": "/nonexistent/table"},
        contiguous=True,
        most=100,
    )
    assert ahead.take({0: 5}, {0: 9}, "driver") == ({0: 5}, WrittenAhead())
    assert "was not read ahead" in caplog.text
    assert ReadAhead.nothing().take({0: 5}, {0: 9}, "driver") == ({0: 5}, WrittenAhead())


class Flaky(MicroBatchWaves):
    """A writer whose source does not answer for its first ``failures`` tries."""

    def write(self, frame, batch_id):
        self.tries.append(batch_id)
        if len(self.tries) <= self.failures:
            raise SourceUnavailableError("kafka broker:9092: metadata of topic 't' failed")
        return "committed"


def _flaky(failures: int, grace: float) -> Flaky:
    writer = Flaky("kafka://t", None, None, {}, False, 1, 1, 1, grace, 0.0)
    object.__setattr__(writer, "tries", [])
    object.__setattr__(writer, "failures", failures)
    return writer


def test_a_micro_batch_is_tried_again_while_its_source_does_not_answer() -> None:
    writer = _flaky(failures=3, grace=60)
    assert writer(None, 7) == "committed"
    assert writer.tries == [7, 7, 7, 7]


def test_a_source_silent_past_the_grace_fails_the_micro_batch_naming_it() -> None:
    writer = _flaky(failures=99, grace=0)
    with pytest.raises(SourceUnavailableError, match=r"source_outage_grace .*broker:9092"):
        writer(None, 7)
    assert writer.tries == [7]
