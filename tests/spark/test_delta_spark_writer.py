"""The ``delta_spark`` stream writer (``stream_writer = delta_spark``): a stream epoch whose
micro-batches delta-spark appends in ``foreachBatch`` with ``txnAppId``/``txnVersion`` keeps
every guarantee of the default writer: each record once in the sink or the quarantine, the
offsets in every commit (in ``userMetadata``, which is all delta-spark lets a writer set), a
replay skipped, a zombie refused, and a write Delta skipped on its own never taken for a
commit."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import FencedError, OffsetsContinuityError
from modeswitch.modes.batch import run_batch_epoch
from modeswitch.modes.job import resolve_job
from modeswitch.modes.stream import run_stream_epoch
from modeswitch.offsets import offsets_to_json
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.sinks import delta_spark, fencing
from modeswitch.sinks.commits import committed_offsets, sink_commits, split_txn_version
from modeswitch.sinks.delta_spark import stream_writer, write_micro_batch
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore
from modeswitch.transforms.payload import EVENT_VALUE_SCHEMA

GENERATOR = EventGenerator(seed=5, buckets=2, malformed_fraction=0.03)
BACKLOG = 1_000
LIVE = 1_200


def _settings(root: Path, pipeline: str) -> PipelineSettings:
    return PipelineSettings.from_mapping(
        {
            "pipeline": pipeline,
            "source": str(root / "log"),
            "warehouse": str(root / "wh"),
            "value_schema": EVENT_VALUE_SCHEMA,  # the demo's events, parsed: some quarantined
            "stream_writer": "delta_spark",
            "stream_trigger": "available_now",
            "max_records_per_trigger": "250",
            "watermark_lag_threshold": "1h",
            "enter_threshold": "1h",
            "exit_threshold": "1h",
        }
    )


@pytest.fixture(scope="module")
def streamed(spark, tmp_path_factory: pytest.TempPathFactory) -> PipelineSettings:
    """A batch epoch (the default path), then a stream epoch written by delta-spark."""
    settings = _settings(tmp_path_factory.mktemp("delta-spark-writer"), "ledger")
    log = SegmentLog.create(settings.source, buckets=2)
    produce_backlog(log, GENERATOR, records=BACKLOG)
    batch = decide(settings, force_mode="batch")
    run_batch_epoch(spark, resolve_job(settings, "batch"), batch.epoch)
    assert close_epoch(settings, batch.epoch)[0] == "completed"
    produce_backlog(log, GENERATOR, records=LIVE, first=BACKLOG)
    stream = decide(settings, force_mode="stream")
    report = run_stream_epoch(spark, resolve_job(settings, "stream"), stream.epoch)
    assert report.micro_batches >= 4
    close_epoch(settings, stream.epoch)
    return settings


def test_every_record_is_once_in_the_sink_or_the_quarantine(streamed: PipelineSettings) -> None:
    report = audit(streamed.source, streamed.sink, streamed.quarantine, streamed.pipeline)
    assert report.ok, report
    assert report.totals.expected == BACKLOG + LIVE
    assert report.totals.in_quarantine > 0  # malformed records of the stream's range too
    stream_commits = [c for c in sink_commits(streamed.sink, streamed.pipeline) if c.epoch == 2]
    assert sum(c.quarantined for c in stream_commits) > 0


def test_delta_spark_made_the_stream_commits_with_the_offsets_in_user_metadata(
    spark, streamed: PipelineSettings
) -> None:
    history = spark.sql(f"DESCRIBE HISTORY delta.`{streamed.sink}`").collect()
    stream = [h for h in history if h.userMetadata and '"kind":"stream"' in h.userMetadata]
    assert len(stream) >= 4
    for entry in stream:
        assert entry.engineInfo.startswith("Apache-Spark")  # delta-spark's commit, not delta-rs
        record = json.loads(entry.userMetadata)
        assert record["writer"] == "modeswitch" and record["epoch"] == 2
        assert record["modeswitch"]["end"] == record["end"]
    # Our reader takes the commits back from the log: contiguous ranges, one per micro-batch.
    commits = sorted(
        (c for c in sink_commits(streamed.sink, streamed.pipeline) if c.epoch == 2),
        key=lambda c: c.sequence,
    )
    assert [c.sequence for c in commits] == list(range(len(commits)))
    for before, after in itertools.pairwise(commits):
        assert after.start == {b: before.end[b] for b in after.start}
    assert commits[-1].end == committed_offsets(streamed.sink, streamed.pipeline)
    # The app transaction is the pipeline's fenced (epoch, sequence).
    from deltalake import DeltaTable

    held = DeltaTable(streamed.sink).transaction_version(streamed.pipeline)
    assert split_txn_version(held) == (2, commits[-1].sequence)


def test_the_tables_stay_readable_by_delta_rs_and_spark_alike(
    spark, streamed: PipelineSettings
) -> None:
    from deltalake import DeltaTable

    by_rs = DeltaTable(streamed.sink).to_pyarrow_table(columns=["bucket", "offset", "event_time"])
    by_spark = spark.read.format("delta").load(streamed.sink)
    assert by_spark.count() == by_rs.num_rows
    # Timestamps as int64 microseconds (as our other writers), not Spark's INT96.
    assert str(by_rs.schema.field("event_time").type) == "timestamp[us, tz=UTC]"


# -- the writer alone, micro-batch by micro-batch ---------------------------------------------
def _offsets_log(checkpoint: Path, batch_id: int, end: dict[int, int]) -> None:
    """What Spark writes to ``<checkpoint>/offsets/<id>`` before running a micro-batch."""
    folder = checkpoint / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})
    (folder / str(batch_id)).write_text(f"v1\n{body}\n{offsets_to_json(end)}\n")


def _micro_batch(spark, source: str, start: dict[int, int], end: dict[int, int]):
    return (
        spark.read.format("bucketlog")
        .option("startingOffsets", offsets_to_json(start))
        .option("endingOffsets", offsets_to_json(end))
        .load(source)
    )


@pytest.fixture
def writer_setup(spark, tmp_path: Path):
    """A pipeline whose sink holds a batch epoch up to offset 200 of each bucket, and a
    running stream epoch's writer over a fake offsets log."""
    settings = _settings(tmp_path, "alone")
    log = SegmentLog.create(settings.source, buckets=2)
    produce_backlog(log, EventGenerator(seed=3, buckets=2), records=1_000)
    store = StateStore.from_settings(settings)
    from modeswitch.sinks.native import write_batch

    first = store.epochs.open("batch", "backlog", {0: 0, 1: 0}, {0: 200, 1: 200})
    write_batch(
        _micro_batch(spark, settings.source, {0: 0, 1: 0}, {0: 200, 1: 200}),
        settings.sink,
        pipeline=settings.pipeline,
        epoch=str(first),
        mode="batch",
        offsetsEnd=offsets_to_json({0: 200, 1: 200}),
    )
    store.epochs.close(first, {0: 200, 1: 200})
    epoch = store.epochs.open("stream", "live", {0: 200, 1: 200}, None)
    checkpoint = tmp_path / "checkpoint"

    def writer_of(epoch_id: int):
        return stream_writer(
            {
                "path": settings.sink,
                "pipeline": settings.pipeline,
                "epoch": str(epoch_id),
                "mode": "stream",
                "offsetsStart": offsets_to_json({0: 200, 1: 200}),
                "checkpointLocation": str(checkpoint),
                "quarantinePath": settings.quarantine,
            }
        ).options

    return settings, checkpoint, epoch, writer_of


def test_a_replayed_micro_batch_is_skipped_and_a_zombie_is_refused(spark, writer_setup) -> None:
    settings, checkpoint, epoch, writer_of = writer_setup
    options = writer_of(epoch)
    _offsets_log(checkpoint, 0, {0: 260, 1: 250})
    frame = _micro_batch(spark, settings.source, {0: 200, 1: 200}, {0: 260, 1: 250})
    assert write_micro_batch(frame, 0, options).status == "committed"
    assert write_micro_batch(frame, 0, options).status == "replayed"
    assert committed_offsets(settings.sink, settings.pipeline) == {0: 260, 1: 250}
    # A replay of micro-batch 0 that planned other offsets cannot pass for it.
    _offsets_log(checkpoint, 0, {0: 270, 1: 250})
    with pytest.raises(OffsetsContinuityError):
        write_micro_batch(frame, 0, options)
    # A job of the ended batch epoch (epoch 1 < 2) is a zombie.
    _offsets_log(checkpoint, 1, {0: 300, 1: 300})
    later = _micro_batch(spark, settings.source, {0: 260, 1: 250}, {0: 300, 1: 300})
    with pytest.raises(FencedError, match="zombie"):
        write_micro_batch(later, 1, writer_of(epoch - 1))
    # Nothing more landed: 60 + 50 records after the batch's 400.
    assert spark.read.format("delta").load(settings.sink).count() == 510


def test_an_empty_micro_batch_still_commits_its_offsets(spark, writer_setup) -> None:
    """A range with no record (Kafka's transaction markers, compaction) moves the offsets on."""
    settings, checkpoint, epoch, writer_of = writer_setup
    _offsets_log(checkpoint, 0, {0: 230, 1: 200})
    empty = _micro_batch(spark, settings.source, {0: 200, 1: 200}, {0: 230, 1: 200}).limit(0)
    outcome = write_micro_batch(empty, 0, writer_of(epoch))
    assert outcome.status == "committed" and outcome.commit.records == 0
    assert committed_offsets(settings.sink, settings.pipeline) == {0: 230, 1: 200}


def test_a_write_delta_skipped_on_its_own_fails_loudly(spark, writer_setup, monkeypatch) -> None:
    """The race the check leaves open: a newer commit for the pipeline lands between this
    writer's check and its write. Delta then skips the write silently (the version is below
    the recorded one); the writer must not take that for a commit."""
    settings, checkpoint, epoch, writer_of = writer_setup
    _offsets_log(checkpoint, 0, {0: 260, 1: 250})
    frame = _micro_batch(spark, settings.source, {0: 200, 1: 200}, {0: 260, 1: 250})
    newer = writer_of(epoch + 1)
    checked = fencing.check_fencing

    raced = []

    def check_then_lose_the_race(table, options, sequence):
        previous = checked(table, options, sequence)
        if not raced:
            raced.append(options.epoch)
            write_micro_batch(frame, 0, newer)  # the next epoch's writer commits first
        return previous

    monkeypatch.setattr(delta_spark, "check_fencing", check_then_lose_the_race)
    with pytest.raises(FencedError, match="skipped the write"):
        write_micro_batch(frame, 0, writer_of(epoch))
    monkeypatch.undo()
    # Only the newer epoch's commit landed.
    held = [c for c in sink_commits(settings.sink, settings.pipeline) if c.mode == "stream"]
    assert [(c.epoch, c.sequence) for c in held] == [(epoch + 1, 0)]
    assert spark.read.format("delta").load(settings.sink).count() == 510
