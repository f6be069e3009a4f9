"""The planner: backlog boundaries, exact coverage, balance under skew, waves, recovery."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modeswitch.control.planning import (
    BacklogBoundary,
    BatchPlan,
    Split,
    newly_finished_buckets,
    plan_batch,
    plan_splits,
)
from modeswitch.errors import ConfigError, OffsetOutOfRangeError, UnknownBucketError

pytestmark = pytest.mark.unit

SIZES = {"max_split_records": 100, "wave_records": 1_000, "parallelism": 4}


def assert_covers_exactly(
    splits: Iterable[Split], start: Mapping[int, int], boundary: Mapping[int, int]
) -> None:
    """The splits tile ``[start, boundary)`` of every bucket: no gap, no overlap, nothing else."""
    by_bucket: dict[int, list[Split]] = defaultdict(list)
    for split in splits:
        by_bucket[split.bucket].append(split)
    assert set(by_bucket) <= set(boundary), "a split in a bucket the boundary lacks"
    for bucket, end in boundary.items():
        position = start.get(bucket, 0)
        for split in sorted(by_bucket.get(bucket, [])):
            assert split.start == position, f"bucket {bucket}: gap or overlap at {position}"
            position = split.end
        assert position == end, f"bucket {bucket}: stops at {position}, boundary {end}"


def assert_waves_advance_contiguously(plan: BatchPlan) -> None:
    """After any prefix of waves is committed, each bucket's committed range is contiguous:
    wave k of a bucket lies before wave k+1 of the same bucket."""
    committed = dict(plan.start)
    indices = [wave.index for wave in plan.waves]
    checked = set(indices[:3] + indices[-3:])  # committed_after is O(waves): sample it
    for wave in plan.waves:
        by_bucket: dict[int, list[Split]] = defaultdict(list)
        for split in wave.splits:
            by_bucket[split.bucket].append(split)
        for bucket, splits in by_bucket.items():
            position = committed[bucket]
            for split in sorted(splits):
                assert split.start == position, f"wave {wave.index} bucket {bucket} not contiguous"
                position = split.end
            committed[bucket] = position
        if wave.index in checked:
            assert committed == plan.committed_after(wave.index)


# --- boundaries and coverage -----------------------------------------------------------------


def test_boundary_is_the_latest_offsets_and_splits_cover_exactly_the_backlog():
    committed = {0: 100, 1: 0, 2: 50}
    latest = {0: 1_350, 1: 420, 2: 50, 3: 7}
    plan = plan_batch(committed, latest, **SIZES)

    assert plan.boundary.offsets == latest
    assert plan.start == {0: 100, 1: 0, 2: 50, 3: 0}
    assert plan.total_records == 1_250 + 420 + 7
    assert_covers_exactly(plan.splits, plan.start, latest)
    assert plan.finished_buckets == frozenset({2}), "bucket 2 has nothing to read"
    assert all(split.records <= 100 for split in plan.splits)
    assert all(wave.records <= 1_000 for wave in plan.waves)
    assert all(len(wave.partitions) <= 4 for wave in plan.waves)
    assert [wave.index for wave in plan.waves] == [0, 1]


def test_string_keyed_wire_offsets_are_accepted():
    plan = plan_batch({"0": 5}, {"0": 25, "1": 10}, **SIZES)
    assert plan.start == {0: 5, 1: 0}
    assert_covers_exactly(plan.splits, {0: 5}, {0: 25, 1: 10})


def test_nothing_to_read_gives_no_waves_and_every_bucket_finished():
    plan = plan_batch({0: 10, 1: 20}, {0: 10, 1: 20}, **SIZES)
    assert plan.waves == ()
    assert plan.finished_buckets == frozenset({0, 1})
    assert plan.makespan == 0


def test_buckets_missing_from_committed_start_at_earliest_if_given():
    plan = plan_batch({0: 30}, {0: 40, 1: 90, 2: 60}, earliest={1: 80}, **SIZES)
    assert plan.start == {0: 30, 1: 80, 2: 0}
    assert_covers_exactly(plan.splits, plan.start, plan.boundary.offsets)


def test_committed_above_boundary_is_an_error_naming_the_bucket():
    with pytest.raises(
        OffsetOutOfRangeError, match=r"bucket 1: committed offset 500 .*above.* 400"
    ):
        plan_batch({0: 0, 1: 500}, {0: 10, 1: 400}, **SIZES)


def test_committed_bucket_the_log_lacks_is_an_error_naming_it():
    with pytest.raises(UnknownBucketError, match="bucket 9"):
        plan_batch({0: 0, 9: 5}, {0: 10, 1: 10}, **SIZES)


def test_committed_below_retention_is_an_error_naming_the_bucket():
    with pytest.raises(OffsetOutOfRangeError, match=r"bucket 0: committed offset 5 .*earliest.* 8"):
        plan_batch({0: 5}, {0: 10}, earliest={0: 8}, **SIZES)


@pytest.mark.parametrize("name", ["max_split_records", "wave_records", "parallelism"])
def test_sizes_must_be_positive(name):
    with pytest.raises(ConfigError, match=f"{name}: 0 must be greater than 0"):
        plan_batch({}, {0: 10}, **{**SIZES, name: 0})


def test_plan_splits_cuts_large_ranges_into_near_equal_splits():
    splits = plan_splits({0: 0, 1: 10}, {0: 250, 1: 30, 2: 0}, max_split_records=100)
    assert splits == (
        Split(0, 0, 84),
        Split(0, 84, 167),
        Split(0, 167, 250),
        Split(1, 10, 30),
    )


def test_a_split_must_not_be_empty():
    with pytest.raises(OffsetOutOfRangeError, match="bucket 3"):
        Split(3, 10, 10)


def test_boundary_remaining_and_reached():
    boundary = BacklogBoundary({"0": 100, "1": 50})
    assert boundary.remaining({0: 40}) == {0: 60, 1: 50}
    assert boundary.remaining({0: 100, 1: 50}) == {0: 0, 1: 0}
    assert boundary.to_dict() == {"0": 100, "1": 50}
    with pytest.raises(OffsetOutOfRangeError, match="bucket 1"):
        boundary.remaining({1: 51})


# --- balance under skew ----------------------------------------------------------------------


def skewed_log() -> dict[int, int]:
    """64 buckets, 1 000 000 records; bucket 0 holds half of them."""
    latest = {0: 500_000}
    latest.update({bucket: 500_000 // 63 for bucket in range(1, 64)})
    latest[63] += 500_000 - sum(latest.values()) + 500_000
    assert sum(latest.values()) == 1_000_000
    return latest


def test_skewed_backlog_is_balanced_within_ten_percent_of_ideal_and_naive_is_not():
    """One bucket holds half the backlog, parallelism 8.

    ideal = 1 000 000 / 8 = 125 000 records per task slot.
    balanced plan (5 waves of 200 000, each cut into 8 partitions of 25 000): makespan 125 000.
    naive plan (one split per bucket, even with LPT): the task that reads bucket 0 alone reads
    500 000 records, makespan 500 000 = 4.0 x ideal.
    """
    latest = skewed_log()
    plan = plan_batch({}, latest, max_split_records=50_000, wave_records=200_000, parallelism=8)
    assert plan.ideal_makespan == 125_000
    assert plan.makespan == 125_000
    assert plan.makespan <= 1.10 * plan.ideal_makespan
    assert [wave.makespan for wave in plan.waves] == [25_000] * 5

    # One split per bucket: whatever the assignment, one task reads the largest bucket.
    naive = plan_splits({}, latest, max_split_records=10**12)
    assert len(naive) == 64
    assert max(s.records for s in naive) == 500_000
    assert max(s.records for s in naive) / plan.ideal_makespan == 4.0


def test_skew_balance_holds_when_splits_are_large_relative_to_waves():
    """Even when max_split_records allows one task to take a whole wave, the wave is cut into
    parallelism equal partitions."""
    latest = skewed_log()
    plan = plan_batch({}, latest, max_split_records=10**9, wave_records=300_000, parallelism=8)
    # waves of 300k, 300k, 300k, 100k -> 37 500 * 3 + 12 500
    assert plan.makespan == 125_000 == plan.ideal_makespan


def test_waves_commit_each_bucket_contiguously():
    plan = plan_batch({0: 0, 1: 10, 2: 0}, {0: 2_500, 1: 1_210, 2: 300}, **SIZES)
    assert len(plan.waves) == 4
    assert_waves_advance_contiguously(plan)
    assert plan.committed_after(plan.waves[-1].index) == plan.boundary.offsets


# --- recovery --------------------------------------------------------------------------------


def test_global_restore_replans_only_uncommitted_ranges_rebalanced():
    """FLIP-537 case 1: the batch job failed after committing two waves; the new run, on a
    different parallelism, plans only the rest, up to the epoch's original boundary."""
    latest = skewed_log()
    first = plan_batch({}, latest, max_split_records=50_000, wave_records=200_000, parallelism=8)
    committed = first.committed_after(1)

    # As plan_remaining plans the new run: from the committed offsets, waves numbered on.
    second = plan_batch(
        committed,
        latest,
        max_split_records=50_000,
        wave_records=200_000,
        parallelism=4,
        first_wave_index=first.waves[-1].index + 1,
    )

    assert second.boundary == first.boundary
    assert second.start == committed
    assert second.total_records == 600_000
    assert_covers_exactly(second.splits, committed, latest)
    assert [wave.index for wave in second.waves] == [5, 6, 7], "wave numbers never repeat"
    assert second.parallelism == 4
    assert second.makespan == second.ideal_makespan == 150_000
    committed_ranges = {(s.bucket, s.start, s.end) for w in first.waves[:2] for s in w.splits}
    for split in second.splits:
        assert split.start >= committed[split.bucket]
        assert (split.bucket, split.start, split.end) not in committed_ranges


def test_task_retry_reads_the_same_split():
    """FLIP-537 case 2: Spark retries a failed task with the same split; planning is
    deterministic, so re-planning from the same committed offsets gives identical splits and
    the sink's idempotency makes the retry harmless."""
    latest = skewed_log()
    committed = {0: 123_456, 7: 1_000}
    one = plan_batch(
        committed, latest, max_split_records=50_000, wave_records=200_000, parallelism=8
    )
    two = plan_batch(
        committed, latest, max_split_records=50_000, wave_records=200_000, parallelism=8
    )
    assert one == two
    again = {"max_split_records": 50_000, "wave_records": 200_000, "parallelism": 8}
    assert plan_batch(one.committed_after(1), latest, **again) == plan_batch(
        two.committed_after(1), latest, **again
    )


def test_wave_committed_to_sink_but_not_in_ledger_is_never_processed_again():
    """FLIP-537 case 3: the sink committed wave 2, then the driver died before the ledger
    recorded it. The new run plans from the sink's committed offsets (the truth), so only what
    follows wave 2 is planned (the ledger's splits are marked committed by
    modeswitch.state.reconcile, tested with the store)."""
    plan = plan_batch({0: 0, 1: 0, 2: 0}, {0: 2_500, 1: 1_200, 2: 300}, **SIZES)
    sink_committed = plan.committed_after(2)  # the ledger only knows waves 0 and 1

    replan = plan_batch(
        sink_committed, plan.boundary.offsets, **SIZES, first_wave_index=plan.waves[-1].index + 1
    )

    wave_2 = set(plan.waves[2].splits)
    for split in replan.splits:
        assert split.start >= sink_committed[split.bucket]
        assert all(split.bucket != done.bucket or split.start >= done.end for done in wave_2), (
            "a committed range is planned again"
        )
    assert_covers_exactly(replan.splits, sink_committed, plan.boundary.offsets)
    assert replan.waves[0].index == plan.waves[-1].index + 1


def test_reconcile_when_sink_is_mid_split_replans_from_the_sink_offset():
    sizes = {"max_split_records": 100, "wave_records": 1_000, "parallelism": 1}
    replan = plan_batch({0: 150}, {0: 1_000}, **sizes)
    assert_covers_exactly(replan.splits, {0: 150}, {0: 1_000})
    assert replan.splits[0].start == 150


def test_replan_refuses_committed_offsets_beyond_the_boundary():
    plan = plan_batch({0: 500}, {0: 1_000}, **SIZES)
    with pytest.raises(OffsetOutOfRangeError, match="bucket 0"):
        plan_batch({0: 1_200}, plan.boundary.offsets, **SIZES)
    with pytest.raises(UnknownBucketError, match="bucket 4"):
        plan_batch({4: 1}, plan.boundary.offsets, **SIZES)


# --- backlog finished ------------------------------------------------------------------------


def test_each_bucket_is_reported_finished_once_per_epoch():
    boundary = BacklogBoundary({0: 100, 1: 50, 2: 0})
    reported: set[int] = set()

    first = newly_finished_buckets(boundary, {0: 60, 1: 50}, reported)
    assert first == {1, 2}
    reported |= first
    assert newly_finished_buckets(boundary, {0: 99, 1: 50}, reported) == set()
    second = newly_finished_buckets(boundary, {0: 100, 1: 50}, reported)
    assert second == {0}
    reported |= second
    assert newly_finished_buckets(boundary, {0: 100, 1: 50}, reported) == set()


def test_finished_above_boundary_is_an_error_naming_the_bucket():
    with pytest.raises(OffsetOutOfRangeError, match="bucket 0"):
        newly_finished_buckets({0: 100}, {0: 101})


# --- properties ------------------------------------------------------------------------------

offsets_pairs = st.dictionaries(
    st.integers(0, 40),
    st.tuples(st.integers(0, 5_000), st.integers(0, 5_000)).map(sorted),
    max_size=25,
)
sizes = st.fixed_dictionaries(
    {
        "max_split_records": st.integers(1, 2_000),
        "wave_records": st.integers(20, 6_000),
        "parallelism": st.integers(1, 16),
    }
)


@settings(max_examples=150, deadline=None)
@given(pairs=offsets_pairs, sizes=sizes)
def test_property_splits_cover_exactly_committed_to_boundary(pairs, sizes):
    committed = {b: lo for b, (lo, _) in pairs.items()}
    latest = {b: hi for b, (_, hi) in pairs.items()}
    plan = plan_batch(committed, latest, **sizes)

    assert_covers_exactly(plan.splits, committed, latest)
    assert_waves_advance_contiguously(plan)
    assert plan.finished_buckets == {b for b in latest if committed[b] == latest[b]}
    assert all(split.records <= sizes["max_split_records"] for split in plan.splits)
    for wave in plan.waves:
        assert 0 < wave.records <= sizes["wave_records"]
        assert len(wave.partitions) <= sizes["parallelism"]
        loads = [sum(s.records for s in p) for p in wave.partitions]
        assert max(loads) - min(loads) <= 1, "partitions of a wave differ by at most a record"
    assert plan.makespan <= plan.ideal_makespan + len(plan.waves)
    assert plan == plan_batch(committed, latest, **sizes), "deterministic"


@settings(max_examples=100, deadline=None)
@given(pairs=offsets_pairs, sizes=sizes, data=st.data())
def test_property_reconcile_never_replans_committed_records(pairs, sizes, data):
    committed = {b: lo for b, (lo, _) in pairs.items()}
    latest = {b: hi for b, (_, hi) in pairs.items()}
    plan = plan_batch(committed, latest, **sizes)
    done = data.draw(st.integers(-1, len(plan.waves) - 1), label="last committed wave")
    sink = plan.committed_after(plan.waves[done].index) if done >= 0 else dict(plan.start)

    again = {**sizes, "parallelism": data.draw(st.integers(1, 8))}
    replan = plan_batch(sink, latest, **again)

    done_splits = [s for w in plan.waves[: done + 1] for s in w.splits]
    assert_covers_exactly(replan.splits, sink, latest)
    assert_covers_exactly([*done_splits, *replan.splits], committed, latest)
