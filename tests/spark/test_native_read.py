"""Batch waves read the embedded log's segment files with Spark's own Parquet reader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from deltalake import DeltaTable

from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import ModeswitchError
from modeswitch.sinks.native import write_batch
from modeswitch.sources.native import read_segments
from modeswitch.sources.segments import SegmentLog


@pytest.fixture
def log(tmp_path: Path) -> SegmentLog:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=3)
    produce_backlog(log, EventGenerator(seed=4, buckets=3), records=9_000, segment_records=700)
    return log


def test_exactly_the_split_ranges_are_read(spark, log: SegmentLog, tmp_path: Path) -> None:
    latest = log.latest_offsets()
    splits = [(0, 650, 1_710), (1, 0, 3), (2, latest[2] - 5, latest[2]), (1, 10, 10)]
    rows = (
        read_segments(spark, log.root, splits, scratch=str(tmp_path / "scratch"))
        .select("bucket", "offset", "key")
        .collect()
    )
    expected = set()
    for bucket, start, end in splits:
        for batch in log.read(bucket, start, end):
            expected |= set(
                zip(
                    batch.column("bucket").to_pylist(),
                    batch.column("offset").to_pylist(),
                    batch.column("key").to_pylist(),
                    strict=True,
                )
            )
    assert len(rows) == len(expected) == 1_060 + 3 + 5
    assert {tuple(r) for r in rows} == expected


def test_a_split_beyond_the_log_is_refused(spark, log: SegmentLog, tmp_path: Path) -> None:
    latest = log.latest_offsets()[0]
    with pytest.raises(ModeswitchError, match=f"bucket 0.*{latest + 1}"):
        read_segments(spark, log.root, [(0, 0, latest + 1)], scratch=str(tmp_path))


def test_a_newest_segment_that_grows_after_planning_is_read_exactly(spark, tmp_path) -> None:
    """An appender rewrites a bucket's open segment; Spark, reading such a file directly,
    returned no row of it. The wave reads a copy of the range it needs instead."""
    live = SegmentLog.create(
        str(tmp_path / "live"), buckets=1, open_segment_seconds=60, open_segment_records=10**6
    )
    generator = EventGenerator(seed=9, buckets=1)

    def events(first: int, count: int):
        times = np.arange(count, dtype=np.int64) + 1_700_000_000_000_000
        return generator.generate(first, count, times).select(["event_time", "key", "value"])

    live.append(0, events(0, 5_000))
    live.append(0, events(5_000, 5_000))  # the same, open, segment
    assert len(live.segments(0)) == 1
    scratch = tmp_path / "scratch"
    df = read_segments(spark, live.root, [(0, 1_000, 10_000)], scratch=str(scratch))
    live.append(0, events(10_000, 50_000))  # grows while the wave is planned
    assert len(live.segments(0)) == 1
    offsets = sorted(r.offset for r in df.select("offset").collect())
    assert offsets == list(range(1_000, 10_000))


def test_two_splits_in_one_growing_segment_read_each_record_once(spark, tmp_path) -> None:
    """Both splits of a bucket lie in its newest segment: they share one snapshot of it."""
    live = SegmentLog.create(
        str(tmp_path / "live"), buckets=1, open_segment_seconds=60, open_segment_records=10**6
    )
    times = np.arange(10_000, dtype=np.int64) + 1_700_000_000_000_000
    batch = EventGenerator(seed=4, buckets=1).generate(0, 10_000, times)
    live.append(0, batch.select(["event_time", "key", "value"]))
    splits = [(0, 1_000, 4_000), (0, 4_000, 9_000)]
    df = read_segments(spark, live.root, splits, scratch=str(tmp_path / "scratch"))
    offsets = sorted(r.offset for r in df.select("offset").collect())
    assert offsets == list(range(1_000, 9_000))


def test_a_wave_that_read_another_count_than_planned_commits_nothing(
    spark, log: SegmentLog, tmp_path: Path
) -> None:
    sink = str(tmp_path / "sink")
    df = read_segments(spark, log.root, [(0, 0, 100)], scratch=str(tmp_path / "scratch"))
    options = {
        "pipeline": "p",
        "epoch": "1",
        "sequence": "0",
        "offsetsStart": json.dumps({"0": 0}),
        "offsetsEnd": json.dumps({"0": 100}),
    }
    with pytest.raises(ModeswitchError, match=r"holds 100 records .* cover 101"):
        write_batch(df, sink, **options, expectedRecords="101")
    assert not Path(sink, "_delta_log").exists()
    assert not list(Path(sink).glob("native-*"))  # the attempt's files are gone
    write_batch(df, sink, **options, expectedRecords="100")
    assert DeltaTable(sink).to_pyarrow_table().num_rows == 100


def test_a_wave_of_many_local_segments_is_listed_without_a_spark_job(spark, tmp_path: Path) -> None:
    """Above 32 paths Spark lists them with a job of its own (0.3-0.4 s a wave here); for
    local segment files the driver lists them, and the setting is put back afterwards."""
    from modeswitch.sources.native import PARALLEL_LISTING_THRESHOLD

    log = SegmentLog.create(str(tmp_path / "log"), buckets=2)
    produce_backlog(log, EventGenerator(seed=4, buckets=2), records=4_000, segment_records=100)
    latest = log.latest_offsets()
    splits = [(b, 0, latest[b]) for b in latest]
    assert len(log.segments(0)) + len(log.segments(1)) > 32
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("wave-listing", "listing a wave's files")
    try:
        df = read_segments(spark, log.root, splits, scratch=str(tmp_path / "scratch"))
        assert tracker.getJobIdsForGroup("wave-listing") == []
    finally:
        spark.sparkContext.setJobGroup("", "")
    assert spark.conf.get(PARALLEL_LISTING_THRESHOLD) == "32"
    assert df.count() == sum(latest.values())
