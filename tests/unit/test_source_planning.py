"""The bucketlog source's driver-side logic: ranges, read limits, option checks (no JVM)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modeswitch.errors import InvalidOffsetsError, OffsetOutOfRangeError, UnknownBucketError
from modeswitch.sources.spark import MIN_PARTITION_RECORDS, limit_by_rows, plan_partitions
from modeswitch.sources.spark_options import BucketLogOptions, resolve_offsets

EARLIEST = {0: 10, 1: 0, 2: 0}
LATEST = {0: 100, 1: 50, 2: 0}


def ranges_of(parts) -> dict[int, list[tuple[int, int]]]:
    by_bucket: dict[int, list[tuple[int, int]]] = {}
    for part in parts:
        for bucket, lo, hi in part.ranges:
            by_bucket.setdefault(bucket, []).append((lo, hi))
    return by_bucket


def test_partitions_cut_skewed_buckets_and_keep_offset_order() -> None:
    parts = plan_partitions(
        {0: 0, 1: 5, 2: 7}, {0: 10, 1: 105, 2: 7}, max_records=30, parallelism=2
    )
    records = [sum(hi - lo for _, lo, hi in p.ranges) for p in parts]
    assert max(records) <= 30
    assert max(records) - min(records) <= 1  # balanced: 110 records in 4 parts of 27-28
    by_bucket = ranges_of(parts)
    assert by_bucket[1][0][0] == 5
    assert 2 not in by_bucket  # empty range, nothing to read


def test_a_small_micro_batch_over_many_buckets_is_one_task() -> None:
    start = dict.fromkeys(range(16), 0)
    end = {b: 250 for b in range(16)}  # 4 000 records
    parts = plan_partitions(start, end, max_records=1_000_000, parallelism=2)
    assert len(parts) == 1
    assert sorted(ranges_of(parts)) == list(range(16))


@pytest.mark.parametrize(
    ("records", "tasks"),
    [
        (MIN_PARTITION_RECORDS * 2 - 16, 1),  # not enough for two of at least the minimum
        (MIN_PARTITION_RECORDS * 2, 2),
        (MIN_PARTITION_RECORDS * 10, 4),  # parallelism
        (4_000_000, 4),
        (4_000_016, 5),  # a partition would exceed max_records
    ],
)
def test_a_read_is_cut_in_parallelism_tasks_once_each_gets_enough(records, tasks) -> None:
    start = dict.fromkeys(range(16), 0)
    end = {b: records // 16 for b in range(16)}
    parts = plan_partitions(start, end, max_records=1_000_000, parallelism=4)
    assert len(parts) == tasks


@given(
    st.dictionaries(st.integers(0, 20), st.tuples(st.integers(0, 1000), st.integers(0, 5000))),
    st.integers(1, 700),
    st.integers(1, 8),
)
def test_partitions_cover_every_range_exactly(ranges: dict, max_records: int, parallelism) -> None:
    start = {b: lo for b, (lo, n) in ranges.items()}
    end = {b: lo + n for b, (lo, n) in ranges.items()}
    parts = plan_partitions(start, end, max_records=max_records, parallelism=parallelism)
    by_bucket = ranges_of(parts)
    for bucket in end:
        covered = [o for lo, hi in by_bucket.get(bucket, []) for o in range(lo, hi)]
        assert covered == list(range(start[bucket], end[bucket]))  # in order, no gap or overlap
    assert all(sum(hi - lo for _, lo, hi in p.ranges) <= max_records for p in parts)


@given(
    st.dictionaries(st.integers(0, 15), st.tuples(st.integers(0, 100), st.integers(0, 10_000))),
    st.integers(1, 20_000),
)
def test_read_limit_is_never_exceeded_and_never_stalls(ranges: dict, max_rows: int) -> None:
    start = {b: lo for b, (lo, n) in ranges.items()}
    latest = {b: lo + n for b, (lo, n) in ranges.items()}
    end = limit_by_rows(start, latest, max_rows)
    available = sum(latest[b] - start[b] for b in latest)
    taken = sum(end[b] - start[b] for b in latest)
    assert taken == min(max_rows, available)
    assert all(start[b] <= end[b] <= latest[b] for b in latest)


def test_read_limit_is_shared_in_proportion_to_lag() -> None:
    end = limit_by_rows({0: 0, 1: 0, 2: 0}, {0: 9000, 1: 900, 2: 100}, 1000)
    assert end == {0: 900, 1: 90, 2: 10}


def resolve(value: str | None, *, fill=EARLIEST):
    return resolve_offsets(
        "startingOffsets", value, default="earliest", earliest=EARLIEST, latest=LATEST, fill=fill
    )


def test_resolve_offsets_keywords_and_maps() -> None:
    assert resolve("earliest") == EARLIEST
    assert resolve("latest") == LATEST
    assert resolve(None) == EARLIEST
    assert resolve('{"0": 20}') == {0: 20, 1: 0, 2: 0}


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        ('{"7": 1}', UnknownBucketError, "bucket 7 does not exist"),
        ('{"0": 5}', OffsetOutOfRangeError, "below the earliest retained offset 10"),
        ('{"1": 51}', OffsetOutOfRangeError, "beyond the latest offset 50"),
        ("{0: 1}", InvalidOffsetsError, "not valid JSON"),
        ("soonest", InvalidOffsetsError, "expected 'earliest', 'latest'"),
    ],
)
def test_resolve_offsets_errors_name_the_option_and_value(value, error, words) -> None:
    with pytest.raises(error) as err:
        resolve(value)
    assert f"option startingOffsets={value!r}" in str(err.value)
    assert words in str(err.value)


def test_options_need_a_path_and_positive_limits(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="option path"):
        BucketLogOptions.parse({})
    with pytest.raises(ValueError, match="option maxRecordsPerTrigger='0'"):
        BucketLogOptions.parse({"path": "x", "maxRecordsPerTrigger": "0"})
    with pytest.raises(ValueError, match="option maxRecordsPerPartition='many'"):
        BucketLogOptions.parse({"path": "x", "maxrecordsperpartition": "many"})
    with pytest.raises(ValueError, match="option source='kafka'"):
        BucketLogOptions.parse({"path": "x", "source": "kafka"})
    parsed = BucketLogOptions.parse({"path": "rel/log", "maxRecordsPerTrigger": "10"})
    assert Path(parsed.path).is_absolute()
    assert parsed.max_records_per_trigger == 10


def test_a_micro_batch_scans_the_log_once_and_reads_only_changed_footers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark asks the stream reader for the latest offsets, then to report them: one scan of
    the log per micro-batch, by one log object whose footer cache survives micro-batches."""
    import pyarrow.parquet as pq
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from modeswitch.devtools.produce import EventGenerator, produce_backlog
    from modeswitch.sources.segments import SegmentLog
    from modeswitch.sources.spark import BucketLogStreamReader
    from modeswitch.sources.spark_options import BucketLogOptions

    log = SegmentLog.create(str(tmp_path / "log"), buckets=4, open_segment_seconds=0)
    produce_backlog(log, EventGenerator(seed=1, buckets=4), records=4_000)
    reader = BucketLogStreamReader(BucketLogOptions.parse({"path": log.root}))
    scans, footers = [0], [0]
    latest_offsets, parquet_file = SegmentLog.latest_offsets, pq.ParquetFile

    def counting_scan(self):
        scans[0] += 1
        return latest_offsets(self)

    def counting_footer(*args, **kwargs):
        footers[0] += 1
        return parquet_file(*args, **kwargs)

    monkeypatch.setattr(SegmentLog, "latest_offsets", counting_scan)
    monkeypatch.setattr(pq, "ParquetFile", counting_footer)
    start = {str(b): 0 for b in range(4)}
    end = reader.latestOffset(start, ReadMaxRows(1_000))
    assert reader.reportLatestOffset() == {str(b): o for b, o in log.latest_offsets().items()}
    assert scans == [2]  # latestOffset's, and the check above: the report took none
    first_footers = footers[0]
    assert first_footers >= 4
    reader.latestOffset(end, ReadMaxRows(1_000))
    reader.reportLatestOffset()
    assert footers[0] == first_footers  # nothing changed: the reader's cache answered
