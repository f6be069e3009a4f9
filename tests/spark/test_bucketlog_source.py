"""The bucketlog data source through a real local Spark session: batch and streaming."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException, PySparkException, StreamingQueryException

from modeswitch.devtools.produce import EventGenerator, append_events, produce_backlog
from modeswitch.sources.segments import SegmentLog

BUCKETS = 4


@pytest.fixture
def log(tmp_path: Path) -> SegmentLog:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=BUCKETS)
    generator = EventGenerator(seed=11, buckets=BUCKETS, skew="zipf:1.1", late_fraction=0.01)
    produce_backlog(log, generator, records=40_000, segment_records=3_000)
    return log


def produced(log: SegmentLog, start: dict[int, int], end: dict[int, int]) -> list[tuple]:
    rows = []
    for bucket in sorted(end):
        for batch in log.read(bucket, start[bucket], end[bucket]):
            rows.extend(
                zip(
                    batch.column("bucket").to_pylist(),
                    batch.column("offset").to_pylist(),
                    # Spark hands timestamps back naive, in the session time zone (UTC).
                    [t.replace(tzinfo=None) for t in batch.column("event_time").to_pylist()],
                    batch.column("key").to_pylist(),
                    batch.column("value").to_pylist(),
                    strict=True,
                )
            )
    return rows


def test_batch_read_of_exact_ranges_equals_what_was_produced(spark, log: SegmentLog) -> None:
    latest = log.latest_offsets()
    start = {0: 123, 1: 0, 2: 7, 3: latest[3]}  # bucket 3: an empty range
    end = {0: latest[0] - 5, 1: latest[1], 2: 2_000, 3: latest[3]}
    df = (
        spark.read.format("bucketlog")
        .option("startingOffsets", f'{{"0": 123, "1": 0, "2": 7, "3": {latest[3]}}}')
        .option("endingOffsets", f'{{"0": {latest[0] - 5}, "2": 2000}}')
        .option("maxRecordsPerPartition", "2500")
        .load(log.root)
    )
    assert df.schema.simpleString() == (
        "struct<bucket:int,offset:bigint,event_time:timestamp,key:string,value:string>"
    )
    # The skewed bucket 0 is cut into several partitions of at most 2 500 records.
    assert df.rdd.getNumPartitions() >= (end[0] - start[0]) // 2500
    rows = [tuple(r) for r in df.collect()]
    expected = produced(log, start, end)
    assert len(rows) == len(expected)
    assert sorted(rows) == sorted(expected)
    # Order within each bucket is the log's order.
    for bucket in range(BUCKETS):
        got = [r[1] for r in rows if r[0] == bucket]
        assert got == list(range(start[bucket], end[bucket]))


def test_batch_read_defaults_to_earliest_through_latest(spark, log: SegmentLog) -> None:
    counts = {
        r["bucket"]: r["count"]
        for r in spark.read.format("bucketlog").load(log.root).groupBy("bucket").count().collect()
    }
    assert counts == log.latest_offsets()


def test_a_batch_read_of_nothing_is_empty(spark, log: SegmentLog, tmp_path: Path) -> None:
    # No partitions to read: Spark still calls read() once, with a partition of its own.
    empty = SegmentLog.create(str(tmp_path / "empty"), buckets=2)
    assert spark.read.format("bucketlog").load(empty.root).count() == 0
    latest = json.dumps({str(b): o for b, o in log.latest_offsets().items()})
    frame = spark.read.format("bucketlog").option("startingOffsets", latest).load(log.root)
    assert frame.count() == 0


def error_text(exc: BaseException) -> str:
    return " ".join(str(exc).split())


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (
            {"startingOffsets": '{"9": 0}'},
            "option startingOffsets='{\"9\": 0}': bucket 9 does not exist",
        ),
        ({"endingOffsets": '{"1": 99999999}'}, "beyond the latest offset"),
        ({"startingOffsets": '{"0": [1]}'}, "option startingOffsets='{\"0\": [1]}'"),
        ({"startingOffsets": "{oops"}, "not valid JSON"),
        ({"maxRecordsPerPartition": "-5"}, "option maxRecordsPerPartition='-5'"),
    ],
)
def test_bad_batch_options_give_a_named_error(spark, log: SegmentLog, options, words) -> None:
    reader = spark.read.format("bucketlog")
    for key, value in options.items():
        reader = reader.option(key, value)
    with pytest.raises((AnalysisException, PySparkException)) as err:
        reader.load(log.root).count()
    assert words in error_text(err.value)


def test_reading_below_retention_is_an_error_naming_the_bucket(spark, log: SegmentLog) -> None:
    log.drop_before({0: 6_000})
    earliest = log.earliest_offsets()[0]
    assert earliest == 6_000
    with pytest.raises((AnalysisException, PySparkException)) as err:
        spark.read.format("bucketlog").option("startingOffsets", '{"0": 10}').load(log.root).count()
    text = error_text(err.value)
    assert "option startingOffsets" in text
    assert "bucket 0: offset 10 is below the earliest retained offset 6000" in text


def test_streaming_receives_every_record_of_a_growing_log_exactly_once(
    spark, log: SegmentLog, tmp_path: Path
) -> None:
    limit = 4_000
    batch_sizes: list[int] = []
    seen: list[tuple[int, int, str]] = []

    def collect(batch_df, batch_id: int) -> None:
        rows = batch_df.select("bucket", "offset", "key").collect()
        batch_sizes.append(len(rows))
        seen.extend(tuple(r) for r in rows)

    generator = EventGenerator(seed=12, buckets=BUCKETS, skew="zipf:1.1")
    stop_growing = threading.Event()

    def grow() -> None:
        first = 40_000
        while not stop_growing.is_set() and first < 40_000 + 15_000:
            now_us = int(time.time() * 1e6)
            events = generator.generate(first, 1_500, pa.array([now_us] * 1_500).to_numpy())
            append_events(log, events)
            first += 1_500
            time.sleep(0.1)

    query = (
        spark.readStream.format("bucketlog")
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", str(limit))
        .load(log.root)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    producer = threading.Thread(target=grow)
    try:
        producer.start()
        producer.join(timeout=60)
        total = sum(log.latest_offsets().values())
        assert total == 55_000
        deadline = time.monotonic() + 180
        while len(seen) < total and time.monotonic() < deadline:
            assert query.exception() is None
            time.sleep(0.2)
    finally:
        stop_growing.set()
        query.stop()
    assert query.exception() is None
    expected = {
        (r[0], r[1], r[3])
        for r in produced(log, dict.fromkeys(range(BUCKETS), 0), log.latest_offsets())
    }
    assert len(seen) == len(set(seen)), "a record was delivered twice"
    assert set(seen) == expected
    # The read limit held in every micro-batch (Spark also reports it per batch).
    assert max(batch_sizes) <= limit
    assert len(batch_sizes) >= 55_000 // limit
    reported = [p["numInputRows"] for p in query.recentProgress]
    assert reported and max(reported) <= limit


def run_available_now(spark, log: SegmentLog, collect, checkpoint: Path) -> None:
    """A stream of the whole log, 15 000 records a micro-batch at most, to ``collect``
    (``foreachBatch``) with availableNow; it ends without an exception."""
    query = (
        spark.readStream.format("bucketlog")
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "15000")
        .load(log.root)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert query.exception() is None


def test_available_now_stops_at_the_offsets_present_when_it_started(
    spark, log: SegmentLog, tmp_path: Path
) -> None:
    at_start = sum(log.latest_offsets().values())
    seen: list[int] = []
    generator = EventGenerator(seed=13, buckets=BUCKETS)

    def collect(batch_df, batch_id: int) -> None:
        seen.append(batch_df.count())
        if batch_id == 0:  # the log grows while the query runs
            now_us = int(time.time() * 1e6)
            append_events(log, generator.generate(10**6, 500, pa.array([now_us] * 500).to_numpy()))

    run_available_now(spark, log, collect, tmp_path / "checkpoint")
    assert sum(seen) == at_start
    assert max(seen) <= 15_000
    assert sum(log.latest_offsets().values()) == at_start + 500


def test_streaming_start_below_retention_fails_with_a_named_error(
    spark, log: SegmentLog, tmp_path: Path
) -> None:
    log.drop_before({1: 3_000})
    stream = (
        spark.readStream.format("bucketlog").option("startingOffsets", '{"1": 0}').load(log.root)
    )
    with pytest.raises((AnalysisException, PySparkException, StreamingQueryException)) as err:
        start_and_wait(stream, tmp_path / "checkpoint")
    assert "bucket 1: offset 0 is below the earliest retained offset 3000" in error_text(err.value)


def start_and_wait(stream, checkpoint: Path) -> None:
    query = stream.writeStream.format("noop").option("checkpointLocation", str(checkpoint)).start()
    try:
        query.awaitTermination(60)
    finally:
        query.stop()


def test_the_arrow_form_option_runs_the_arrow_form_in_the_reader(spark, tmp_path: Path) -> None:
    """With ``arrowForm`` and ``arrowSchema``, the source gives the transform's columns and
    rows, as the transform applied to the DataFrame does, in batch and streaming reads; an
    option that holds no pickled function, or one without the other, is refused naming it."""
    from modeswitch.sources.spark_options import arrow_form_options
    from modeswitch.transforms.arrow import parse_events_arrow

    form = parse_events_arrow.arrow_form()
    assert form is not None
    options = arrow_form_options(form.function, form.schema)

    log = SegmentLog.create(str(tmp_path / "log"), buckets=2)
    generator = EventGenerator(seed=3, buckets=2, malformed_fraction=0.02)
    produce_backlog(log, generator, records=5_000)
    plain = spark.read.format("bucketlog").load(log.root)
    fused = spark.read.format("bucketlog").options(**options).load(log.root)
    expected = parse_events_arrow(plain)
    assert fused.schema == expected.schema
    assert sorted(fused.collect()) == sorted(expected.collect())
    assert 0 < fused.where("_quarantine_reason IS NOT NULL").count() < 250

    streamed = (
        spark.readStream.format("bucketlog")
        .option("startingOffsets", "earliest")
        .options(**options)
        .load(log.root)
    )
    query = (
        streamed.writeStream.format("memory")
        .queryName("fused_transform")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        query.awaitTermination(120)
        got = spark.table("fused_transform")
        assert got.schema == expected.schema
        assert sorted(got.collect()) == sorted(expected.collect())
    finally:
        query.stop()

    bad = spark.read.format("bucketlog").options(**{**options, "arrowForm": "bm90IGEgcGlja2xl"})
    with pytest.raises(PySparkException, match=r"option arrowForm=.*not a pickled function"):
        bad.load(log.root).schema  # noqa: B018 (the schema is what asks the source)
    half = spark.read.format("bucketlog").option("arrowForm", options["arrowForm"])
    with pytest.raises(PySparkException, match=r"option arrowForm: needs arrowSchema too"):
        half.load(log.root).schema  # noqa: B018


def test_a_stream_query_reads_through_a_source_runner_forked_by_its_jvms_server(
    spark, log: SegmentLog, tmp_path: Path
) -> None:
    """With the driver's fork server listening, Spark's source runner for the query is a
    child of the server (no imports of its own), and the query reads what it reads without."""
    import psutil

    from modeswitch.runners.fork_server import SourceRunnerForks
    from modeswitch.runners.worker_python import worker_python

    runners: list[list[str]] = []
    seen: list[int] = []
    with SourceRunnerForks(spark, worker_python()) as forks:
        assert forks.wait_ready()
        server = psutil.Process(forks.process.pid)
        server_cmdline = server.cmdline()

        def collect(batch_df, batch_id: int) -> None:
            seen.append(batch_df.count())
            runners.extend(child.cmdline() for child in server.children())

        run_available_now(spark, log, collect, tmp_path / "checkpoint")
        deadline = time.monotonic() + 30
        while server.children() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not server.children()  # the runner ended with its query
    assert sum(seen) == sum(log.latest_offsets().values())
    assert runners and all(cmdline == server_cmdline for cmdline in runners)
    assert not forks.path.exists()
    assert not server.is_running()
