"""The modeswitch_delta sink through real Spark queries: batch, streaming, restarts, crashes."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.errors import PySparkException

from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.faults import ENV_FAULTS, ENV_MARKERS
from modeswitch.offsets import offsets_to_json
from modeswitch.sinks.commits import committed_offsets, sink_commits
from modeswitch.sources.segments import SegmentLog

PROGRAM = Path(__file__).parent / "programs" / "stream_to_sink.py"


@pytest.fixture
def log(tmp_path: Path) -> SegmentLog:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=3)
    produce_backlog(
        log, EventGenerator(seed=21, buckets=3, skew="zipf:1.1"), records=30_000, chunk=5_000
    )
    return log


def sink_keys(sink: Path) -> Counter:
    table = DeltaTable(str(sink)).to_pyarrow_table(columns=["bucket", "offset"])
    return Counter(zip(table["bucket"].to_pylist(), table["offset"].to_pylist(), strict=True))


def assert_exactly_once(sink: Path, log: SegmentLog, pipeline: str) -> None:
    latest = log.latest_offsets()
    keys = sink_keys(sink)
    duplicated = [k for k, n in keys.items() if n > 1]
    expected = {(b, o) for b in latest for o in range(latest[b])}
    assert not duplicated, f"{len(duplicated)} records twice, e.g. {duplicated[:3]}"
    assert set(keys) == expected, f"{len(expected - set(keys))} records missing"
    assert committed_offsets(str(sink), pipeline) == latest


def test_a_batch_write_of_n_rows_gives_n_rows_with_statistics(spark, log, tmp_path) -> None:
    sink = tmp_path / "sink"
    end = log.latest_offsets()
    (
        spark.read.format("bucketlog")
        .option("maxRecordsPerPartition", "4000")
        .load(log.root)
        .write.format("modeswitch_delta")
        .mode("append")
        .option("pipeline", "p")
        .option("epoch", "1")
        .option("offsetsStart", offsets_to_json(dict.fromkeys(end, 0)))
        .option("offsetsEnd", offsets_to_json(end))
        .save(str(sink))
    )
    table = DeltaTable(str(sink))
    assert table.version() == 0
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    assert sum(actions["num_records"]) == 30_000 == table.to_pyarrow_table().num_rows
    assert len(actions["path"]) > 3  # written in parallel by several tasks
    assert all(v is not None for v in actions["min.offset"] + actions["max.event_time"])
    assert_exactly_once(sink, log, "p")


def test_a_failed_write_leaves_no_visible_data_and_vacuum_removes_its_files(
    spark, log, tmp_path
) -> None:
    from datetime import timedelta

    from pyspark.sql import functions as F

    from modeswitch.sinks.delta import vacuum

    sink = tmp_path / "sink"
    df = spark.read.format("bucketlog").option("maxRecordsPerPartition", "2000").load(log.root)
    df.where("offset < 1000").write.format("modeswitch_delta").mode("append").save(str(sink))
    committed = {p.name for p in sink.rglob("*.parquet")}

    def fail_at_9500(offset: int) -> int:
        if offset == 9_500:  # one task of bucket 0 fails; the others finish and wrote files
            raise ValueError("a bad record")
        return offset

    boom = F.udf(fail_at_9500, "long")
    with pytest.raises(PySparkException):
        (
            df.where("offset >= 1000")
            .withColumn("offset", boom("offset"))
            .write.format("modeswitch_delta")
            .mode("append")
            .save(str(sink))
        )
    table = DeltaTable(str(sink))
    assert table.version() == 0  # nothing was committed
    assert table.to_pyarrow_table().num_rows == 3_000
    # abort() leaves the files the finished tasks reported (a commit Spark lost may still
    # land: modeswitch.sinks.delta.leave_to_vacuum), and a task cancelled mid-write can leave
    # one behind (as a crashed executor would): vacuum removes what no version references.
    vacuum(str(sink), retention=timedelta(0))
    assert {p.name for p in sink.rglob("*.parquet")} == committed
    assert DeltaTable(str(sink)).to_pyarrow_table().num_rows == 3_000


def start_stream(spark, log: SegmentLog, sink: Path, checkpoint: Path, *, limit: str):
    start = offsets_to_json(dict.fromkeys(log.buckets(), 0))
    return (
        spark.readStream.format("bucketlog")
        .option("startingOffsets", start)
        .option("maxRecordsPerTrigger", limit)
        .load(log.root)
        .writeStream.format("modeswitch_delta")
        .option("checkpointLocation", str(checkpoint))
        .option("pipeline", "live")
        .option("epoch", "4")
        .option("mode", "stream")
        .option("offsetsStart", start)
        .trigger(processingTime="100 milliseconds")
        .start(str(sink))
    )


def test_a_stream_stopped_and_restarted_from_its_checkpoint_loses_and_repeats_nothing(
    spark, log, tmp_path
) -> None:
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    query = start_stream(spark, log, sink, checkpoint, limit="4000")
    try:
        deadline = time.monotonic() + 120
        while not (sink / "_delta_log").exists() or DeltaTable(str(sink)).version() < 2:
            assert time.monotonic() < deadline
            assert query.exception() is None
            time.sleep(0.1)
    finally:
        query.stop()
    assert query.exception() is None
    stopped_at = committed_offsets(str(sink), "live")
    assert 0 < sum(stopped_at.values()) < 30_000

    query = start_stream(spark, log, sink, checkpoint, limit="4000")
    try:
        deadline = time.monotonic() + 120
        while committed_offsets(str(sink), "live") != log.latest_offsets():
            assert time.monotonic() < deadline
            assert query.exception() is None
            time.sleep(0.2)
    finally:
        query.stop()
    assert query.exception() is None
    assert_exactly_once(sink, log, "live")
    commits = list(sink_commits(str(sink), "live"))
    assert [c.sequence for c in commits] == sorted((c.sequence for c in commits), reverse=True)
    for newer, older in itertools.pairwise(commits):
        assert newer.start == {b: older.end[b] for b in newer.start}


def run_program(
    tmp_path: Path, log: SegmentLog, *, fault: str | None, markers: Path | None = None
) -> subprocess.Popen:
    env = dict(os.environ)
    if fault:
        env[ENV_FAULTS] = f"{fault}=60"
        env[ENV_MARKERS] = str(markers or tmp_path / "markers")
    return subprocess.Popen(
        [
            sys.executable,
            str(PROGRAM),
            "--log",
            log.root,
            "--sink",
            str(tmp_path / "sink"),
            "--checkpoint",
            str(tmp_path / "checkpoint"),
        ],
        env=env,
        start_new_session=True,  # its own process group: the driver and its JVM
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)


def test_a_stream_driver_killed_mid_batch_twice_and_restarted_converges_exactly_once(
    log, tmp_path
) -> None:
    """SIGKILL the driver (and its JVM) while a micro-batch is in flight: first with its files
    written but not committed; then, in the restart, once it is committed to Delta but not yet
    to Spark's own commit log, so that the next restart runs it again and the sink must skip
    it."""
    sink = tmp_path / "sink"
    for fault in ("sink.between_check_and_commit", "sink.after_commit"):
        markers = tmp_path / f"markers-{fault}"
        run = run_program(tmp_path, log, fault=fault, markers=markers)
        try:
            deadline = time.monotonic() + 180
            while not (markers.exists() and any(markers.iterdir())):
                if run.poll() is not None:
                    pytest.fail(f"job exited early: {run.stderr.read().decode()[-2000:]}")
                assert time.monotonic() < deadline, f"the job never reached {fault}"
                time.sleep(0.1)
        finally:
            kill_group(run)
        assert run.returncode == -signal.SIGKILL
        before = committed_offsets(str(sink), "faults")
        assert sum(before.values()) < 30_000

    last = run_program(tmp_path, log, fault=None)
    try:
        _, err = last.communicate(timeout=300)
    finally:
        kill_group(last)
    assert last.returncode == 0, err.decode()[-3000:]
    assert_exactly_once(sink, log, "faults")
