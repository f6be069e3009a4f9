"""The embedded segment log: naming, contiguous offsets, atomic publish, retention."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from modeswitch.errors import (
    ModeswitchError,
    OffsetOutOfRangeError,
    SegmentConflictError,
    UnknownBucketError,
)
from modeswitch.sources.base import RECORD_SCHEMA, BucketedLog
from modeswitch.sources.segment_files import grown_groups, segment_name
from modeswitch.sources.segments import SegmentLog


def events(keys: list[str], *, at_us: int = 1_700_000_000_000_000) -> pa.Table:
    return pa.table(
        {
            "event_time": pa.array(
                [at_us + i for i in range(len(keys))], pa.timestamp("us", "UTC")
            ),
            "key": pa.array(keys, pa.string()),
            "value": pa.array([f'{{"k": "{k}"}}' for k in keys], pa.string()),
        }
    )


def read_all(log: SegmentLog, bucket: int, start: int, end: int) -> pa.Table:
    batches = list(log.read(bucket, start, end))
    return pa.Table.from_batches(batches, schema=RECORD_SCHEMA)


@pytest.fixture
def log(tmp_path: Path) -> SegmentLog:
    """A log that publishes every append as its own segment (no open segment)."""
    return SegmentLog.create(str(tmp_path / "log"), buckets=3, open_segment_seconds=0)


def test_segment_names_are_zero_padded_and_sort_by_offset() -> None:
    names = [segment_name(n) for n in (0, 7, 10, 123_456_789_012)]
    assert names[0] == "00000000000000000000.parquet"
    assert sorted(names) == names
    with pytest.raises(ValueError, match="negative"):
        segment_name(-1)


def test_a_new_log_is_empty_and_satisfies_the_protocol(log: SegmentLog) -> None:
    assert isinstance(log, BucketedLog)
    assert log.buckets() == [0, 1, 2]
    assert log.earliest_offsets() == {0: 0, 1: 0, 2: 0}
    assert log.latest_offsets() == {0: 0, 1: 0, 2: 0}
    assert list(log.read(0, 0, 0)) == []


def test_opening_a_missing_log_says_how_to_create_one(tmp_path: Path) -> None:
    with pytest.raises(ModeswitchError, match=r"no bucketed log at .*modeswitch produce"):
        SegmentLog(str(tmp_path / "nowhere"))


def test_recreating_with_another_bucket_count_is_refused(log: SegmentLog) -> None:
    assert SegmentLog.create(log.root, buckets=3).buckets() == [0, 1, 2]
    with pytest.raises(ModeswitchError, match="already has 3 buckets, not 4"):
        SegmentLog.create(log.root, buckets=4)


def test_appends_get_contiguous_offsets_and_read_back_exact_ranges(log: SegmentLog) -> None:
    assert log.append(1, events(["a", "b", "c"])) == (0, 3)
    assert log.append(1, events(["d"])) == (3, 4)
    assert log.append(1, events(["e", "f", "g", "h"])) == (4, 8)
    assert log.latest_offsets() == {0: 0, 1: 8, 2: 0}

    table = read_all(log, 1, 2, 6)  # crosses two segment boundaries
    assert table.schema.equals(RECORD_SCHEMA)
    assert table.column("offset").to_pylist() == [2, 3, 4, 5]
    assert table.column("key").to_pylist() == ["c", "d", "e", "f"]
    assert set(table.column("bucket").to_pylist()) == {1}
    assert read_all(log, 1, 0, 8).column("key").to_pylist() == list("abcdefgh")


def test_reads_slice_inside_row_groups(log: SegmentLog) -> None:
    keys = [f"k{i}" for i in range(10_000)]
    log.append(0, events(keys))
    path = log.segments(0)[0].path
    # Rewrite the segment with small row groups to exercise row-group skipping.
    table = pq.read_table(path)
    pq.write_table(table, path, row_group_size=1000)
    log = SegmentLog(log.root)
    got = read_all(log, 0, 2_500, 7_321)
    assert got.column("offset").to_pylist() == list(range(2_500, 7_321))
    assert got.column("key").to_pylist() == keys[2_500:7_321]


def test_latest_offsets_reads_only_the_newest_segment_of_each_bucket(
    log: SegmentLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(20):
        log.append(i % 3, events([f"k{i}"] * 5))
    opened: list[str] = []
    real = pq.ParquetFile

    def counting(path, *args, **kwargs):
        opened.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", counting)
    fresh = SegmentLog(log.root)
    assert fresh.latest_offsets() == {0: 35, 1: 35, 2: 30}
    # 20 segments exist; one footer per bucket is read, never a record.
    assert len(opened) == 3
    assert all(
        p.endswith(s.path)
        for p, s in zip(opened, [fresh.segments(b)[-1] for b in range(3)], strict=True)
    )


def test_unknown_bucket_is_named(log: SegmentLog) -> None:
    with pytest.raises(UnknownBucketError, match="bucket 3 does not exist"):
        log.append(3, events(["x"]))
    with pytest.raises(UnknownBucketError, match="bucket 7 does not exist"):
        list(log.read(7, 0, 0))


def test_reading_beyond_the_latest_offset_is_refused(log: SegmentLog) -> None:
    log.append(0, events(["a", "b"]))
    with pytest.raises(
        OffsetOutOfRangeError, match="bucket 0: end offset 3 is beyond the latest offset 2"
    ):
        list(log.read(0, 0, 3))
    with pytest.raises(OffsetOutOfRangeError, match="start offset 2 is after end offset 1"):
        list(log.read(0, 2, 1))


def test_retention_drops_whole_segments_and_reading_below_it_is_an_error(log: SegmentLog) -> None:
    for i in range(4):
        log.append(2, events([f"s{i}-{j}" for j in range(10)]))  # segments at 0, 10, 20, 30
    assert log.drop_before({2: 25}) == 2
    assert log.earliest_offsets()[2] == 20
    assert log.latest_offsets()[2] == 40
    assert read_all(log, 2, 20, 22).column("key").to_pylist() == ["s2-0", "s2-1"]
    with pytest.raises(OffsetOutOfRangeError) as err:
        list(log.read(2, 15, 30))
    message = str(err.value)
    assert (
        "bucket 2" in message
        and "offset 15" in message
        and "earliest retained offset 20" in message
    )


def test_retention_always_keeps_the_newest_segment(log: SegmentLog) -> None:
    log.append(0, events(["a", "b"]))
    log.append(0, events(["c"]))
    log.drop_before({0: 1_000})
    assert log.earliest_offsets()[0] == 2
    assert log.latest_offsets()[0] == 3
    assert log.append(0, events(["d"])) == (3, 4)


def test_half_written_segments_are_invisible(log: SegmentLog) -> None:
    log.append(0, events(["a"]))
    folder = Path(log.root) / "0"
    # What an appender leaves while writing aside (or after a crash mid-write).
    (folder / ".0123abcd.parquet.tmp").write_bytes(b"PAR1 half a file")
    assert log.latest_offsets()[0] == 1
    assert read_all(log, 0, 0, 1).column("key").to_pylist() == ["a"]
    assert log.append(0, events(["b"])) == (1, 2)


def test_a_publish_onto_an_existing_segment_is_refused(log: SegmentLog) -> None:
    log.append(0, events(["a", "b"]))
    table = read_all(log, 0, 0, 2)
    # An appender that did not take the lock and computed the same start offset.
    with pytest.raises(SegmentConflictError, match="segment at offset 0 already exists"):
        log._publish(0, 0, table)
    assert read_all(log, 0, 0, 2).column("key").to_pylist() == ["a", "b"]
    assert sorted(p.name for p in (Path(log.root) / "0").iterdir() if p.name != ".lock") == [
        segment_name(0)
    ]


def _assert_contiguous_and_complete(log: SegmentLog, bucket: int, expected_keys: set[str]) -> None:
    table = read_all(log, bucket, 0, log.latest_offsets()[bucket])
    offsets = table.column("offset").to_pylist()
    keys = table.column("key").to_pylist()
    assert offsets == list(range(len(offsets)))
    assert len(keys) == len(set(keys)), "a record was written twice"
    assert set(keys) == expected_keys


def test_concurrent_thread_appenders_keep_offsets_contiguous(log: SegmentLog) -> None:
    def appender(worker: int) -> None:
        own = SegmentLog(log.root)
        for i in range(25):
            own.append(0, events([f"w{worker}-{i}-{j}" for j in range(3)]))
            own.append(1 + worker % 2, events([f"w{worker}-{i}"]))

    threads = [threading.Thread(target=appender, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _assert_contiguous_and_complete(
        log, 0, {f"w{w}-{i}-{j}" for w in range(6) for i in range(25) for j in range(3)}
    )
    _assert_contiguous_and_complete(log, 1, {f"w{w}-{i}" for w in (0, 2, 4) for i in range(25)})
    _assert_contiguous_and_complete(log, 2, {f"w{w}-{i}" for w in (1, 3, 5) for i in range(25)})


def _process_appender(root: str, worker: int) -> None:
    own = SegmentLog(root)
    for i in range(20):
        own.append(0, events([f"p{worker}-{i}-{j}" for j in range(2)]))


def test_concurrent_process_appenders_keep_offsets_contiguous(log: SegmentLog) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_process_appender, args=(log.root, w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    _assert_contiguous_and_complete(
        log, 0, {f"p{w}-{i}-{j}" for w in range(4) for i in range(20) for j in range(2)}
    )


def test_many_small_segments_read_back_in_order(log: SegmentLog) -> None:
    # What a live producer leaves: one small segment per flush.
    for i in range(300):
        log.append(1, events([f"s{i}-{j}" for j in range(i % 5 + 1)]))
    latest = log.latest_offsets()[1]
    whole = read_all(log, 1, 0, latest)
    assert whole.column("offset").to_pylist() == list(range(latest))
    keys = whole.column("key").to_pylist()
    assert keys[:4] == ["s0-0", "s1-0", "s1-1", "s2-0"]
    part = read_all(log, 1, 7, latest - 3)  # partial first and last segments
    assert part.column("offset").to_pylist() == list(range(7, latest - 3))
    assert part.column("key").to_pylist() == keys[7 : latest - 3]


# -- the open segment: a live producer's small appends grow one segment ------------------------
@pytest.fixture
def live_log(tmp_path: Path) -> SegmentLog:
    return SegmentLog.create(
        str(tmp_path / "live"), buckets=2, open_segment_seconds=60, open_segment_records=100
    )


def test_small_appends_grow_the_open_segment(live_log: SegmentLog) -> None:
    for i in range(10):
        assert live_log.append(0, events([f"a{i}-{j}" for j in range(3)])) == (3 * i, 3 * i + 3)
    assert [s.base for s in live_log.segments(0)] == [0]
    reader = SegmentLog(live_log.root)
    assert reader.latest_offsets() == {0: 30, 1: 0}
    keys = read_all(reader, 0, 0, 30).column("key").to_pylist()
    assert keys == [f"a{i}-{j}" for i in range(10) for j in range(3)]
    assert read_all(reader, 0, 4, 11).column("offset").to_pylist() == list(range(4, 11))


def test_the_open_segment_rolls_at_its_record_limit(live_log: SegmentLog) -> None:
    for i in range(7):
        live_log.append(1, events([f"b{i}-{j}" for j in range(30)]))  # 210 records, limit 100
    assert [s.base for s in live_log.segments(1)] == [0, 90, 180]
    assert read_all(live_log, 1, 0, 210).column("offset").to_pylist() == list(range(210))


def test_the_open_segment_closes_after_its_time(
    live_log: SegmentLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    import modeswitch.sources.segments as segments

    now = [1000.0]
    monkeypatch.setattr(segments.time, "monotonic", lambda: now[0])
    live_log.append(0, events(["a"]))
    now[0] += 59
    live_log.append(0, events(["b"]))
    now[0] += 1.5  # 60.5 s after the segment opened
    live_log.append(0, events(["c"]))
    assert [s.base for s in live_log.segments(0)] == [0, 2]


def test_a_reader_that_saw_the_open_segment_smaller_reads_exactly_what_it_saw(
    live_log: SegmentLog,
) -> None:
    live_log.append(0, events(["a", "b"]))
    reader = SegmentLog(live_log.root)
    assert reader.latest_offsets()[0] == 2  # cached for this file
    batches = reader.read(0, 0, 2)
    live_log.append(0, events(["c", "d"]))  # rewrites the segment between plan and read
    got = pa.Table.from_batches(list(batches), schema=RECORD_SCHEMA)
    assert got.column("key").to_pylist() == ["a", "b"]
    # The grown file is a new file: its row count is read again, not taken from the cache.
    assert reader.latest_offsets()[0] == 4
    assert read_all(reader, 0, 1, 4).column("key").to_pylist() == ["b", "c", "d"]


def test_another_appender_never_rewrites_a_segment_it_did_not_write_last(
    live_log: SegmentLog,
) -> None:
    other = SegmentLog(live_log.root, open_segment_seconds=60, open_segment_records=100)
    live_log.append(0, events(["a"]))
    other.append(0, events(["b"]))  # opens its own segment at 1
    live_log.append(0, events(["c"]))  # its open segment is no longer the newest
    other.append(0, events(["d"]))  # its segment was followed by another: closed too
    assert [s.base for s in live_log.segments(0)] == [0, 1, 2, 3]
    assert read_all(live_log, 0, 0, 4).column("key").to_pylist() == ["a", "b", "c", "d"]


def test_readers_racing_a_growing_open_segment_always_see_contiguous_records(
    live_log: SegmentLog,
) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        own = SegmentLog(live_log.root)
        while not stop.is_set():
            try:
                latest = own.latest_offsets()[0]
                got = read_all(own, 0, 0, latest).column("offset").to_pylist()
                assert got == list(range(latest))
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(150):
            live_log.append(0, events([f"r{i}-{j}" for j in range(i % 4 + 1)]))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[0]
    assert len(live_log.segments(0)) < 150 // 10


def test_an_append_joins_the_last_row_group_only_while_it_is_small() -> None:
    assert grown_groups((), 5, joined_below=10) == (5,)
    assert grown_groups((5,), 4, joined_below=10) == (9,)
    assert grown_groups((9,), 4, joined_below=10) == (13,)  # 9 < 10: joined
    assert grown_groups((13,), 4, joined_below=10) == (13, 4)
    assert grown_groups((20, 13), 1, joined_below=10) == (20, 13, 1)


def test_a_read_of_the_open_segments_tail_decodes_only_its_last_row_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer's bulk append, then its live flushes into the same open segment: a reader
    of the flushes (a stream's first micro-batch after a batch) does not decode the bulk."""
    log = SegmentLog.create(str(tmp_path / "log"), buckets=1, open_segment_seconds=60)
    log.append(0, events([f"bulk{i}" for i in range(10_000)]))
    for i in range(5):
        log.append(0, events([f"small{i}-{j}" for j in range(100)]))
    for i in range(5):
        log.append(0, events([f"flush{i}-{j}" for j in range(2_000)]))
    (segment,) = log.segments(0)
    meta = pq.ParquetFile(segment.path).metadata
    groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    assert groups == [10_000, 8_500, 2_000]

    decoded: list[int] = []
    read_row_group = pq.ParquetFile.read_row_group

    def counted(self: pq.ParquetFile, group: int, *args: object, **kwargs: object) -> pa.Table:
        decoded.append(group)
        return read_row_group(self, group, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counted)
    reader = SegmentLog(log.root)
    tail = read_all(reader, 0, 10_000, 10_600)
    assert tail.column("key").to_pylist() == [
        f"small{i}-{j}" for i in range(5) for j in range(100)
    ] + [f"flush0-{j}" for j in range(100)]
    assert decoded == [1]
    assert read_all(reader, 0, 0, 20_500).column("offset").to_pylist() == list(range(20_500))


def test_a_closed_append_is_a_segment_of_its_own(live_log: SegmentLog) -> None:
    live_log.append(0, events(["a"]))
    live_log.append(0, events(["b", "c"]), close=True)
    live_log.append(0, events(["d"]))
    live_log.append(0, events(["e"]))
    assert [s.base for s in live_log.segments(0)] == [0, 1, 3]
    assert read_all(live_log, 0, 0, 5).column("key").to_pylist() == list("abcde")


def test_reading_many_small_segments_streams_them_in_bounded_memory(tmp_path: Path) -> None:
    """A backlog of small segments is read in scans of at most a batch's records, each
    streamed in offset order (never sorted), so a reader's memory does not grow with the
    backlog. Measured in a fresh interpreter: pyarrow's peak allocation there is this read's
    alone."""
    log = SegmentLog.create(str(tmp_path / "log"), buckets=1, open_segment_seconds=0)
    count, per_segment = 200, 1_000
    for i in range(count):
        keys = [f"k{i}-{j}" for j in range(per_segment)]
        table = events(keys).set_column(
            2, "value", pa.array([f"{k}:{'x' * 200}" for k in keys], pa.string())
        )
        log.append(0, table, close=True)
    program = (
        "import sys, pyarrow as pa\n"
        "from modeswitch.sources import segments\n"
        "log = segments.SegmentLog(sys.argv[1])\n"
        "offsets = [o for b in log.read(0, 0, log.latest_offsets()[0])"
        " for o in b.column('offset').to_pylist()]\n"
        "assert offsets == list(range(len(offsets))), 'offsets out of order'\n"
        "print(len(offsets), pa.default_memory_pool().max_memory())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program, log.root], capture_output=True, text=True, check=True
    )
    records, peak = map(int, result.stdout.split())
    assert records == count * per_segment
    # The whole backlog is ~45 MB in Arrow; a scan of 65 segments ~15 MB. Held and sorted
    # whole in scans of 262 144 records, it took 134 MB.
    assert peak < 30 * 2**20, f"reading held {peak / 2**20:.0f} MB at its peak"


def test_a_run_of_small_segments_that_skips_offsets_is_refused(tmp_path: Path) -> None:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=1, open_segment_seconds=0)
    for i in range(12):
        log.append(0, events([f"k{i}-{j}" for j in range(10)]), close=True)
    middle = log.segments(0)[5]
    table = pq.read_table(middle.path)
    pq.write_table(  # the same rows, one offset shifted: a gap inside the run
        table.set_column(
            table.schema.get_field_index("offset"),
            "offset",
            pa.array([o + (o == middle.base + 9) for o in table.column("offset").to_pylist()]),
        ),
        middle.path,
    )
    assert [b.num_rows for b in log.read(0, 0, 50)]  # before the segment: read as usual
    with pytest.raises(ModeswitchError, match=r"bucket 0: segments from offset 0 to 110 do not"):
        read_all(log, 0, 0, 120)


def test_segments_keep_a_dictionary_only_for_the_bucket(log: SegmentLog) -> None:
    log.append(0, events([f"k{i}" for i in range(100)]))
    meta = pq.ParquetFile(log.segments(0)[0].path).metadata.row_group(0)
    encodings = {
        meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)
    }
    with_dictionary = {c for c, e in encodings.items() if any("DICTIONARY" in x for x in e)}
    assert with_dictionary == {"bucket"}, encodings


def test_stable_paths_snapshot_the_growing_newest_segment_by_hard_link(
    live_log: SegmentLog, tmp_path: Path
) -> None:
    live_log.append(0, events([f"a{j}" for j in range(40)]))
    live_log.append(0, events([f"b{j}" for j in range(20)]))  # the same, open, segment
    scratch = tmp_path / "scratch"
    [snapshot] = live_log.stable_paths(0, 10, 60, scratch=str(scratch))
    newest = live_log.segments(0)[-1].path
    assert Path(snapshot).parent == scratch
    assert Path(snapshot).stat().st_ino == Path(newest).stat().st_ino  # a link, not a copy
    live_log.append(0, events([f"c{j}" for j in range(30)]))  # rewritten: a new file
    assert Path(newest).stat().st_ino != Path(snapshot).stat().st_ino
    assert pq.read_table(snapshot).column("offset").to_pylist() == list(range(60))
    assert live_log.latest_offsets()[0] == 90


def test_a_shared_snapshot_that_misses_a_later_range_is_refused(
    live_log: SegmentLog, tmp_path: Path
) -> None:
    live_log.append(0, events([f"a{j}" for j in range(40)]))
    scratch = str(tmp_path / "scratch")
    live_log.stable_paths(0, 0, 40, scratch=scratch)
    live_log.append(0, events([f"b{j}" for j in range(20)]))  # planned after the snapshot
    with pytest.raises(ModeswitchError, match=r"snapshot holds offsets up to 40 of bucket 0") as e:
        live_log.stable_paths(0, 40, 60, scratch=scratch)
    assert isinstance(e.value.__cause__, FileExistsError)  # the snapshot that was there


def test_stable_paths_copy_the_range_where_no_hard_link_can_be_made(
    live_log: SegmentLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scratch on another filesystem than the log: link() fails with EXDEV (simulated here,
    this machine has one filesystem), and the range is copied instead."""
    import errno
    import os

    import modeswitch.sources.segment_files as segment_files

    def cross_device(src: str, dst: str) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), src)

    live_log.append(0, events([f"a{j}" for j in range(40)]))
    live_log.append(0, events([f"b{j}" for j in range(20)]))
    monkeypatch.setattr(segment_files.os, "link", cross_device)
    [copy] = live_log.stable_paths(0, 10, 45, scratch=str(tmp_path / "scratch"))
    assert pq.read_table(copy).column("offset").to_pylist() == list(range(10, 45))


def _timed(seconds: list[int], *, at_us: int = 1_700_000_000_000_000) -> pa.Table:
    """Events whose event times are ``at_us`` plus the given seconds (late ones go back)."""
    table = events([f"k{i}" for i in range(len(seconds))])
    times = pa.array([at_us + s * 1_000_000 for s in seconds], pa.timestamp("us", "UTC"))
    return table.set_column(0, "event_time", times)


def test_offset_at_finds_the_first_record_at_or_after_an_event_time(log: SegmentLog) -> None:
    import pendulum

    t0 = pendulum.from_timestamp(1_700_000_000, tz="UTC")
    log.append(0, _timed([0, 1, 2]))  # offsets 0-2: all before t0 + 5 s (statistics skip it)
    log.append(0, _timed([3, 9, 4, 10]))  # offsets 3-6: 4 is a late record after the 9
    log.append(1, _timed([20, 21]))
    found = log.offset_at(t0.add(seconds=5))
    assert found == {0: 4, 1: 0, 2: 0}  # bucket 2 is empty: its latest offset
    assert log.offset_at(t0.add(seconds=10)) == {0: 6, 1: 0, 2: 0}
    assert log.offset_at(t0.add(seconds=30)) == log.latest_offsets()  # none is that late
    assert log.offset_at(t0) == {0: 0, 1: 0, 2: 0}
    log.drop_before({0: 3})  # retention: the search starts at the earliest retained offset
    assert log.offset_at(t0) == {0: 3, 1: 0, 2: 0}
