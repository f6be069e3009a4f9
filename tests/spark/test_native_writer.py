"""Batch writes through Spark's own Parquet writer, committed by the sink's exactly-once commit
(modeswitch.sinks.native.write_batch), on real Spark queries and real Delta tables."""

from __future__ import annotations

import os
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.errors import PySparkException

from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import FencedError, OffsetsContinuityError
from modeswitch.offsets import offsets_to_json
from modeswitch.sinks.commits import committed_offsets, sink_commits
from modeswitch.sinks.delta import QUARANTINE_SCHEMA, vacuum
from modeswitch.sinks.native import write_batch
from modeswitch.sources.segments import SegmentLog
from modeswitch.transforms import parse_events

RECORDS = 30_000
TABLE_TYPES = {
    "bucket": pa.int32(),
    "offset": pa.int64(),
    "event_time": pa.timestamp("us", tz="UTC"),
    "key": pa.string(),
    "value": pa.string(),
}


@pytest.fixture
def log(tmp_path: Path) -> SegmentLog:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=3)
    produce_backlog(
        log,
        EventGenerator(seed=5, buckets=3, skew="zipf:1.1", malformed_fraction=0.01),
        records=RECORDS,
        chunk=5_000,
    )
    return log


def read(spark, log: SegmentLog, start: dict[int, int], end: dict[int, int]):
    return (
        spark.read.format("bucketlog")
        .option("startingOffsets", offsets_to_json(start))
        .option("endingOffsets", offsets_to_json(end))
        .option("maxRecordsPerPartition", "4000")
        .load(log.root)
    )


def wave(
    spark, log, sink: Path, *, epoch: int, sequence: int, start, end, writer="native", **extra
):
    return write_batch(
        read(spark, log, start, end),
        str(sink),
        writer=writer,
        pipeline="p",
        epoch=str(epoch),
        sequence=str(sequence),
        offsetsStart=offsets_to_json(start),
        offsetsEnd=offsets_to_json(end),
        **extra,
    )


def halves(log: SegmentLog) -> tuple[dict, dict, dict]:
    end = log.latest_offsets()
    return dict.fromkeys(end, 0), {b: o // 2 for b, o in end.items()}, end


def keys(table: DeltaTable) -> Counter:
    data = table.to_pyarrow_table(columns=["bucket", "offset"])
    return Counter(zip(data["bucket"].to_pylist(), data["offset"].to_pylist(), strict=True))


def attempt_folders(sink: Path) -> set[str]:
    return {p.name for p in sink.glob("native-*")}


def test_n_rows_in_gives_exactly_n_rows_with_statistics_and_the_python_paths_types(
    spark, log, tmp_path
) -> None:
    sink = tmp_path / "sink"
    zero, _, end = halves(log)
    outcome = wave(spark, log, sink, epoch=1, sequence=0, start=zero, end=end)
    assert outcome is not None and outcome.status == "committed"
    table = DeltaTable(str(sink))
    assert table.version() == 0
    data = table.to_pyarrow_table()
    assert {f.name: f.type for f in data.schema} == TABLE_TYPES
    assert data.num_rows == RECORDS
    assert set(keys(table).values()) == {1}
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    assert sum(actions["num_records"]) == RECORDS
    assert len(actions["path"]) > 3  # one file per Spark task
    assert all(p.startswith("native-") and p.endswith(".parquet") for p in actions["path"])
    for column in ("offset", "event_time", "bucket"):
        assert None not in actions[f"min.{column}"] + actions[f"max.{column}"]
    assert sum(actions["null_count.offset"]) == 0
    # Only the referenced data files are left: no _SUCCESS, checksums or _temporary.
    written = {str(p.relative_to(sink)) for p in sink.rglob("*") if p.is_file()}
    assert {w for w in written if not w.startswith("_delta_log/")} == set(actions["path"])
    commit = next(sink_commits(str(sink), "p"))
    assert commit.records == RECORDS
    assert committed_offsets(str(sink), "p") == end
    latest = data.group_by("bucket").aggregate([("event_time", "max")]).to_pylist()
    assert commit.max_event_time_us == {
        r["bucket"]: int(pa.scalar(r["event_time_max"]).cast(pa.int64()).as_py()) for r in latest
    }


def test_columns_that_never_repeat_are_written_without_a_dictionary(spark, log, tmp_path) -> None:
    import pyarrow.parquet as pq

    sink = tmp_path / "sink"
    zero, _, end = halves(log)
    wave(spark, log, sink, epoch=1, sequence=0, start=zero, end=end)
    for path in DeltaTable(str(sink)).file_uris():
        meta = pq.ParquetFile(path).metadata
        for i in range(meta.num_columns):
            column = meta.row_group(0).column(i)
            dictionary = any("DICTIONARY" in e for e in column.encodings)
            if column.path_in_schema in ("offset", "event_time", "key", "value"):
                assert not dictionary, f"{column.path_in_schema}: {column.encodings}"
            if column.path_in_schema in ("bucket", "action", "country"):
                assert dictionary, f"{column.path_in_schema}: {column.encodings}"


def test_native_and_python_commits_mix_on_one_table_in_any_order(spark, log, tmp_path) -> None:
    sink = tmp_path / "sink"
    end = log.latest_offsets()
    cuts = [{b: o * i // 4 for b, o in end.items()} for i in range(5)]
    for sequence, writer in enumerate(["python", "native", "python", "native"]):
        wave(
            spark,
            log,
            sink,
            epoch=2,
            sequence=sequence,
            start=cuts[sequence],
            end=cuts[sequence + 1],
            writer=writer,
        )
    table = DeltaTable(str(sink))
    assert table.version() == 3
    data = table.to_pyarrow_table()
    assert {f.name: f.type for f in data.schema} == TABLE_TYPES
    expected = {(b, o) for b in end for o in range(end[b])}
    assert keys(table) == Counter(expected)
    commits = list(sink_commits(str(sink), "p"))
    assert [c.sequence for c in commits] == [3, 2, 1, 0]
    assert all(c.records > 0 and c.max_event_time_us for c in commits)
    assert committed_offsets(str(sink), "p") == end
    try:
        import polars as pl
    except ImportError:
        return
    frame = pl.read_delta(str(sink))  # polars reads the native files' columns as the table's
    assert frame.height == sum(end.values())
    assert frame.columns == list(TABLE_TYPES)
    assert frame.schema["event_time"] == pl.Datetime("us", "UTC")
    assert frame.schema["bucket"] == pl.Int32


def test_malformed_records_go_to_the_quarantine_table_in_the_same_write(
    spark, log, tmp_path
) -> None:
    sink, quarantine = tmp_path / "sink", tmp_path / "quarantine"
    zero, _, end = halves(log)
    outcome = write_batch(
        parse_events(read(spark, log, zero, end)),
        str(sink),
        pipeline="p",
        epoch="1",
        sequence="0",
        offsetsStart=offsets_to_json(zero),
        offsetsEnd=offsets_to_json(end),
        quarantinePath=str(quarantine),
    )
    assert outcome is not None and outcome.status == "committed"
    good = DeltaTable(str(sink)).to_pyarrow_table()
    bad = DeltaTable(str(quarantine)).to_pyarrow_table()
    assert "_quarantine_reason" not in good.column_names
    assert 100 < bad.num_rows < 600  # 1 % of 30 000
    assert good.num_rows + bad.num_rows == RECORDS
    assert bad.schema == QUARANTINE_SCHEMA
    reasons = bad["reason"].to_pylist()
    assert None not in reasons and "value is not valid JSON" in reasons
    seen = Counter(zip(good["bucket"].to_pylist(), good["offset"].to_pylist(), strict=True))
    seen.update(zip(bad["bucket"].to_pylist(), bad["offset"].to_pylist(), strict=True))
    assert seen == Counter({(b, o) for b in end for o in range(end[b])})
    assert good["event_id"].null_count == 0
    assert not list(sink.rglob("*=quarantine*"))  # Spark's copies of the bad rows are gone
    assert DeltaTable(str(quarantine)).transaction_version("p") == outcome.commit.txn_version


def test_a_replay_is_skipped_a_zombie_and_an_overlap_refused_leaving_no_files(
    spark, log, tmp_path
) -> None:
    sink = tmp_path / "sink"
    zero, half, end = halves(log)
    wave(spark, log, sink, epoch=3, sequence=0, start=zero, end=half)
    wave(spark, log, sink, epoch=3, sequence=1, start=half, end=end)
    folders = attempt_folders(sink)
    assert len(folders) == 2

    replay = wave(spark, log, sink, epoch=3, sequence=1, start=half, end=end)
    assert replay is not None and replay.status == "replayed"
    with pytest.raises(FencedError, match="zombie"):
        wave(spark, log, sink, epoch=2, sequence=7, start=half, end=end)
    with pytest.raises(OffsetsContinuityError, match="an overlap"):
        wave(spark, log, sink, epoch=4, sequence=0, start=half, end=end)

    table = DeltaTable(str(sink))
    assert table.version() == 1
    assert set(keys(table).values()) == {1}
    assert sum(keys(table).values()) == RECORDS
    assert attempt_folders(sink) == folders  # the refused attempts deleted their folders


def test_a_failed_spark_write_leaves_nothing_and_vacuum_removes_a_killed_drivers_leftovers(
    spark, log, tmp_path
) -> None:
    from pyspark.sql import functions as F

    sink = tmp_path / "sink"
    zero, half, end = halves(log)
    wave(spark, log, sink, epoch=1, sequence=0, start=zero, end=half)
    folders = attempt_folders(sink)

    def fail_at(offset: int) -> int:
        if offset == half[0] + 100:
            raise ValueError("a bad record")
        return offset

    boom = F.udf(fail_at, "long")
    with pytest.raises(PySparkException):
        write_batch(
            read(spark, log, half, end).withColumn("offset", boom("offset")),
            str(sink),
            pipeline="p",
            epoch="1",
            sequence="1",
            offsetsStart=offsets_to_json(half),
            offsetsEnd=offsets_to_json(end),
        )
    assert DeltaTable(str(sink)).version() == 0
    assert attempt_folders(sink) == folders

    # A driver killed mid-write leaves Spark's attempt files and markers behind: vacuum
    # deletes them (the folder is not hidden from it), and keeps every committed file.
    dead = sink / "native-0123456789abcdef"
    for name in (
        "_temporary/0/_temporary/attempt_1/part-00000-x.c000.snappy.parquet",
        "_temporary/0/task_1/.part-00001-x.c000.snappy.parquet.crc",
        "part-00002-x.c000.snappy.parquet",
        "_SUCCESS",
    ):
        leftover = dead / name
        leftover.parent.mkdir(parents=True, exist_ok=True)
        leftover.write_bytes(b"PAR1")
        old = time.time() - 3600
        os.utime(leftover, (old, old))
    vacuum(str(sink), retention=timedelta(minutes=1))
    assert not [p for p in dead.rglob("*") if p.is_file()]
    assert DeltaTable(str(sink)).to_pyarrow_table().num_rows == sum(half.values())


def test_a_partitioned_table_is_written_by_the_data_source(spark, log, tmp_path) -> None:
    sink = tmp_path / "sink"
    zero, _, end = halves(log)
    outcome = wave(spark, log, sink, epoch=1, sequence=0, start=zero, end=end, partitionBy="bucket")
    assert outcome is None  # the Python data source wrote it
    table = DeltaTable(str(sink))
    assert table.metadata().partition_columns == ["bucket"]
    assert table.to_pyarrow_table().num_rows == RECORDS
    assert not attempt_folders(sink)
