"""The ``arrow`` stream writer (``stream_writer = auto``, the default for a transform with an
Arrow form): each micro-batch committed as an Arrow wave in ``foreachBatch``, in the driver when
small and in Spark tasks when large, keeps every guarantee of the other writers: each record
once in the sink or the quarantine, the offsets of every micro-batch in its commit, a replay
found and its files removed, a zombie refused, an empty range's offsets committed."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import FencedError
from modeswitch.modes.batch import run_batch_epoch
from modeswitch.modes.job import resolve_job
from modeswitch.modes.stream import run_stream_epoch
from modeswitch.modes.stream_waves import MicroBatchWaves, ReadAhead, discard_untaken
from modeswitch.offsets import offsets_to_json
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.sinks import arrow_wave
from modeswitch.sinks.commits import committed_offsets, sink_commits
from modeswitch.sources.segments import SegmentLog
from modeswitch.transforms.payload import EVENT_VALUE_SCHEMA

GENERATOR = EventGenerator(seed=5, buckets=2, malformed_fraction=0.03)
BACKLOG = 1_000
LIVE = 1_200


def _settings(root: Path, **extra: str) -> PipelineSettings:
    return PipelineSettings.from_mapping(
        {
            "pipeline": "waves",
            "source": str(root / "log"),
            "warehouse": str(root / "wh"),
            "value_schema": EVENT_VALUE_SCHEMA,  # the demo's events, parsed: some quarantined
            "stream_trigger": "available_now",
            "watermark_lag_threshold": "1h",
            "enter_threshold": "1h",
            "exit_threshold": "1h",
            **extra,
        }
    )


@pytest.fixture(scope="module")
def streamed(spark, tmp_path_factory: pytest.TempPathFactory):
    """A batch epoch, then a stream epoch of micro-batches of 500 (in Spark tasks: above the
    driver's 400) and a last one of 200 (in the driver); each wave's place is noted."""
    settings = _settings(
        tmp_path_factory.mktemp("arrow-stream-writer"),
        max_records_per_trigger="500",
        stream_driver_records="400",
    )
    log = SegmentLog.create(settings.source, buckets=2)
    produce_backlog(log, GENERATOR, records=BACKLOG)
    batch = decide(settings, force_mode="batch")
    run_batch_epoch(spark, resolve_job(settings, "batch"), batch.epoch)
    assert close_epoch(settings, batch.epoch)[0] == "completed"
    produce_backlog(log, GENERATOR, records=LIVE, first=BACKLOG)
    stream = decide(settings, force_mode="stream")
    job = resolve_job(settings, "stream")
    assert (job.stream.transform, job.stream.writer) == ("wave", "arrow")
    places: list[str] = []
    runners = dict(arrow_wave.TASK_RUNNERS)
    noted = {
        name: (lambda *args, name=name, run=run: places.append(name) or run(*args))
        for name, run in runners.items()
    }
    arrow_wave.TASK_RUNNERS.update(noted)
    try:
        report = run_stream_epoch(spark, job, stream.epoch)
    finally:
        arrow_wave.TASK_RUNNERS.update(runners)
    close_epoch(settings, stream.epoch)
    return settings, stream.epoch, report, places


def test_every_record_is_once_in_the_sink_or_the_quarantine(streamed) -> None:
    settings, epoch, _, places = streamed
    report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
    assert report.ok, report
    assert report.totals.expected == BACKLOG + LIVE
    commits = sorted(
        (c for c in sink_commits(settings.sink, settings.pipeline) if c.epoch == epoch),
        key=lambda c: c.sequence,
    )
    assert sum(c.quarantined for c in commits) > 0
    # 1 200 records at 500 a micro-batch: two in Spark tasks, the last (200) in the driver.
    assert places == ["spark", "spark", "driver"]
    assert [c.records + c.quarantined for c in commits] == [500, 500, 200]
    assert [c.sequence for c in commits] == [0, 1, 2]
    for before, after in itertools.pairwise(commits):
        assert after.start == before.end


def test_the_tables_stay_readable_by_delta_spark(spark, streamed) -> None:
    settings = streamed[0]
    assert spark.read.format("delta").load(settings.sink).count() == sum(
        c.records for c in sink_commits(settings.sink, settings.pipeline)
    )


# -- the writer alone, micro-batch by micro-batch ---------------------------------------------
def _offsets_log(checkpoint: Path, batch_id: int, end: dict[int, int]) -> None:
    """What Spark writes to ``<checkpoint>/offsets/<id>`` before running a micro-batch."""
    folder = checkpoint / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})
    (folder / str(batch_id)).write_text(f"v1\n{body}\n{offsets_to_json(end)}\n")


@pytest.fixture
def writer_setup(spark, tmp_path: Path):
    """A running stream epoch (2) after a batch epoch that ended at offset 200 of each bucket
    (committed by the same writer, as sequence 0 of epoch 1), and its writer over a fake
    offsets log."""
    settings = _settings(tmp_path)
    log = SegmentLog.create(settings.source, buckets=2)
    produce_backlog(log, EventGenerator(seed=3, buckets=2), records=1_000)
    job = resolve_job(settings, "stream")
    checkpoint = tmp_path / "checkpoint"

    def writer_of(
        epoch: int,
        start: dict[int, int],
        sequence: int = 0,
        *,
        ahead_from: dict[int, int] | None = None,
    ) -> MicroBatchWaves:
        """The writer of ``epoch``'s query started at ``start``; with ``ahead_from``, its
        first micro-batch read ahead from there (waited for)."""
        options = {
            "path": settings.sink,
            "pipeline": settings.pipeline,
            "epoch": str(epoch),
            "mode": "stream",
            "sequence": str(sequence),
            "offsetsStart": offsets_to_json(start),
            "checkpointLocation": str(checkpoint / str(epoch)),
            "quarantinePath": settings.quarantine,
        }
        ahead = ReadAhead.nothing()
        if ahead_from is not None:
            ahead = ReadAhead.begin(
                settings.source,
                ahead_from,
                job.arrow.function,
                job.arrow.schema,
                options,
                contiguous=True,
                most=50_000,
            )
            ahead.wait()
        return MicroBatchWaves(
            source=settings.source,
            transform=job.arrow.function,
            output=job.arrow.schema,
            options=options,
            count_checked=True,
            max_split_records=1_000_000,
            parallelism=2,
            driver_records=50_000,
            ahead=ahead,
        )

    _offsets_log(checkpoint / "1", 0, {0: 200, 1: 200})
    frame = SimpleNamespace(sparkSession=spark)  # the micro-batch's frame is never read
    assert writer_of(1, {0: 0, 1: 0})(frame, 0).status == "committed"
    return settings, checkpoint / "2", writer_of(2, {0: 200, 1: 200}), writer_of, frame, log


def _attempt_folders(table: str) -> list[str]:
    return sorted(p.name for p in Path(table).iterdir() if p.name.startswith("native-"))


def test_a_replayed_micro_batch_is_found_and_its_files_removed(writer_setup) -> None:
    settings, checkpoint, writer, _, frame, _ = writer_setup
    _offsets_log(checkpoint, 0, {0: 260, 1: 250})
    committed = writer(frame, 0)
    assert committed.status == "committed"
    folders = _attempt_folders(settings.sink)
    assert writer(frame, 0).status == "replayed"
    assert _attempt_folders(settings.sink) == folders  # the replay's files are gone
    assert committed_offsets(settings.sink, settings.pipeline) == {0: 260, 1: 250}
    assert sum(c.records + c.quarantined for c in sink_commits(settings.sink, "waves")) == 510


def test_a_zombie_of_an_ended_epoch_is_refused(writer_setup) -> None:
    settings, checkpoint, writer, writer_of, frame, _ = writer_setup
    _offsets_log(checkpoint, 0, {0: 260, 1: 250})
    assert writer(frame, 0).status == "committed"
    zombie = writer_of(1, {0: 0, 1: 0}, sequence=0)
    _offsets_log(checkpoint.parent / "1", 1, {0: 300, 1: 300})
    with pytest.raises(FencedError, match="zombie"):
        zombie(frame, 1)
    assert committed_offsets(settings.sink, settings.pipeline) == {0: 260, 1: 250}


def test_an_empty_micro_batch_still_commits_its_offsets(writer_setup) -> None:
    """A range with no record to read (here: offsets that did not move in one bucket and moved
    in none in the other) still commits, so the offsets move on."""
    settings, checkpoint, writer, _, frame, _ = writer_setup
    _offsets_log(checkpoint, 0, {0: 200, 1: 200})
    outcome = writer(frame, 0)
    assert outcome.status == "committed" and outcome.commit.records == 0
    assert committed_offsets(settings.sink, settings.pipeline) == {0: 200, 1: 200}


# -- the first micro-batch, read ahead while its query starts ----------------------------------
def _sink_offsets(settings: PipelineSettings) -> list[tuple[int, int]]:
    """Every (bucket, offset) in the sink and the quarantine, sorted, repeats kept."""
    from deltalake import DeltaTable

    found: list[tuple[int, int]] = []
    for table in filter(DeltaTable.is_deltatable, (settings.sink, settings.quarantine)):
        rows = DeltaTable(table).to_pyarrow_table(columns=["bucket", "offset"]).to_pylist()
        found += [(row["bucket"], row["offset"]) for row in rows]
    return sorted(found)


def test_the_first_micro_batch_commits_what_was_read_ahead_with_what_came_after(
    writer_setup,
) -> None:
    """Read ahead from the query's start to the log's latest (500 a bucket), then 200 more
    records arrive: the first micro-batch writes only those, and commits both in one commit;
    every record of the range once, in the sink or the quarantine."""
    settings, checkpoint, _, writer_of, frame, log = writer_setup
    writer = writer_of(2, {0: 200, 1: 200}, ahead_from={0: 200, 1: 200})
    produce_backlog(log, EventGenerator(seed=4, buckets=2), records=200, first=1_000)
    end = log.latest_offsets()
    _offsets_log(checkpoint, 0, end)
    outcome = writer(frame, 0)
    assert outcome.status == "committed"
    assert outcome.commit.records + outcome.commit.quarantined == sum(e - 200 for e in end.values())
    assert len(_attempt_folders(settings.sink)) == 3  # epoch 1's, the read ahead's, the rest's
    assert _sink_offsets(settings) == sorted((b, o) for b, e in end.items() for o in range(e))
    # Given once: the next micro-batch reads its own range.
    _offsets_log(checkpoint, 1, end)
    assert writer(frame, 1).commit.records == 0


@pytest.mark.parametrize(
    ("ahead_from", "end", "why"),
    [
        ({0: 150, 1: 200}, None, "begins before the micro-batch"),
        ({0: 200, 1: 200}, {0: 300, 1: 300}, "ends past it (the log holds ~500 a bucket)"),
    ],
)
def test_a_read_ahead_that_does_not_fit_the_first_micro_batch_is_deleted(
    writer_setup, ahead_from: dict[int, int], end: dict[int, int] | None, why: str
) -> None:
    settings, checkpoint, _, writer_of, frame, log = writer_setup
    folders = _attempt_folders(settings.sink)
    writer = writer_of(2, {0: 200, 1: 200}, ahead_from=ahead_from)
    assert len(_attempt_folders(settings.sink)) == len(folders) + 1, "written ahead"
    produce_backlog(log, EventGenerator(seed=4, buckets=2), records=200, first=1_000)
    end = end or log.latest_offsets()
    _offsets_log(checkpoint, 0, end)
    outcome = writer(frame, 0)
    assert outcome.status == "committed", why
    assert len(_attempt_folders(settings.sink)) == len(folders) + 1  # the micro-batch's own
    assert _sink_offsets(settings) == sorted((b, o) for b, e in end.items() for o in range(e))


def test_what_a_query_that_stopped_before_its_first_micro_batch_read_ahead_is_deleted(
    writer_setup,
) -> None:
    settings, checkpoint, _, writer_of, _, _ = writer_setup
    folders = _attempt_folders(settings.sink)
    writer_of(2, {0: 200, 1: 200}, ahead_from={0: 200, 1: 200})
    assert len(_attempt_folders(settings.sink)) == len(folders) + 1, "written ahead"
    discard_untaken(str(checkpoint))  # what the stream epoch's end does
    assert _attempt_folders(settings.sink) == folders
