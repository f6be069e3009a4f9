"""A team's own Delta commands on the sink, through delta-spark's SQL, while the pipeline's
stream job runs: OPTIMIZE ... ZORDER BY, a property change that enables the change data feed,
VACUUM with Delta's retention and our own maintenance between its commits; an erasure
(DELETE) and an UPDATE once it has caught up (Delta refuses them against every append that may
hold their rows), after which it commits again.

The pipeline goes on: every micro-batch is committed and recorded once; the audit finds
nothing missing or doubled and counts the rows the DELETE removed as erased by that commit;
delta-spark and delta-rs read the same table. Once the stream has ended, a VACUUM that keeps
nothing (the user turned Delta's retention check off) takes the files the DELETE removed: the
erasure is still told from a loss (maintenance kept it), the next epoch resumes exactly where
the sink ends, and a zombie of the ended epoch is still fenced out.

Not tried beside a running job: VACUUM with a retention shorter than a micro-batch or a wave.
It deletes any file not in the table, and the files a job has written but not yet committed
are such files (docs/SINK.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from deltalake import DeltaTable
from fault_tools import wait_for

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import FencedError
from modeswitch.modes.batch import run_batch_epoch
from modeswitch.modes.job import resolve_job
from modeswitch.offsets import offsets_to_json
from modeswitch.ops.maintenance import maintain
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import run_job_process
from modeswitch.sinks.commits import committed_offsets, sink_commits
from modeswitch.sinks.native import write_batch
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore
from modeswitch.transforms.payload import EVENT_VALUE_SCHEMA

PIPELINE = "shared"
GENERATOR = EventGenerator(seed=21, buckets=2, malformed_fraction=0.02)


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 240) -> None:
    wait_for(condition, what, timeout=timeout, poll=0.3)


def _as_a_user_would(spark, statement: str) -> list:
    """Run a user's SQL statement, again when Delta refuses it for a concurrent commit (the
    stream's): the user's command may lose a race, the pipeline's commits may not."""
    for _ in range(5):
        try:
            began = time.monotonic()
            rows = spark.sql(statement).collect()
            print(f"{statement[:40]!r}: {time.monotonic() - began:.1f} s")
            return rows
        except Exception as exc:  # delta-spark's Concurrent*Exception, through Py4J
            if "Concurrent" not in str(exc) and "CONCURRENT" not in str(exc):
                raise
            time.sleep(0.5)
    raise AssertionError(f"{statement!r} lost every race to the stream's commits")


def _stream_commits(settings: PipelineSettings, epoch: int) -> int:
    return sum(c.epoch == epoch for c in sink_commits(settings.sink, PIPELINE))


def test_the_pipeline_goes_on_beside_a_teams_own_delta_commands(spark, tmp_path: Path) -> None:
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": PIPELINE,
            "value_schema": EVENT_VALUE_SCHEMA,
            "source": str(tmp_path / "log"),
            "warehouse": str(tmp_path / "wh"),
            "trigger_interval": "1s",
            "max_records_per_trigger": "300",
            "max_stream_runtime": "10m",
            "min_time_in_stream": "0s",
            "exit_threshold": "1h",
            "enter_threshold": "2h",
            "watermark_lag_threshold": "2h",
        }
    )
    log = SegmentLog.create(settings.source, buckets=2)
    produce_backlog(log, GENERATOR, records=3_000)
    store = StateStore.from_settings(settings)
    batch = decide(settings, force_mode="batch")
    run_batch_epoch(spark, resolve_job(settings, "batch"), batch.epoch)
    assert close_epoch(settings, batch.epoch)[0] == "completed"
    live = decide(settings, force_mode="stream")
    sink = f"delta.`{settings.sink}`"
    # A user present in the backlog: their rows, and those the stream adds, go.
    erased_user = spark.read.format("delta").load(settings.sink).first().user_id

    stop_feeding = threading.Event()
    feeding = threading.Event()
    feeding.set()

    def feed() -> None:
        first = 3_000
        while not stop_feeding.wait(0.5):
            if feeding.is_set():
                produce_backlog(log, GENERATOR, records=60, first=first)
                first += 60

    def caught_up() -> bool:
        return committed_offsets(settings.sink, PIPELINE) == log.latest_offsets()

    stream = threading.Thread(
        target=run_job_process, args=("stream", settings, live.epoch), kwargs={"timeout": 600}
    )
    feeder = threading.Thread(target=feed, daemon=True)
    stream.start()
    feeder.start()
    try:
        _wait_for(lambda: _stream_commits(settings, live.epoch) >= 3, "stream commits")
        # Beside the stream's commits: none of these reads the files an append adds.
        _as_a_user_would(spark, f"OPTIMIZE {sink} ZORDER BY (user_id)")
        _as_a_user_would(
            spark,
            f"ALTER TABLE {sink} SET TBLPROPERTIES "
            "('delta.enableChangeDataFeed' = 'true', 'team.owner' = 'growth')",
        )
        cdf_from = DeltaTable(settings.sink).version()
        maintain(settings, store=store)
        # Delta's retention (seven days); LITE: the removed files the log names, no listing
        # (a full listing took 87 s here beside the stream).
        _as_a_user_would(spark, f"VACUUM {sink} LITE")
        # A DELETE or an UPDATE reads every file that may hold its rows, and each append may:
        # Delta refuses it while the stream appends (ConcurrentAppendException, every time at
        # a micro-batch a second). With no new records the stream commits nothing; the job
        # goes on running, and commits again once records come.
        feeding.clear()
        _wait_for(caught_up, "the stream to catch up")
        _as_a_user_would(spark, f"DELETE FROM {sink} WHERE user_id = {erased_user}")
        _as_a_user_would(spark, f"UPDATE {sink} SET country = 'ZZ' WHERE user_id % 7 = 0")
        feeding.set()
        maintain(settings, store=store)  # keeps the erasure: the files it removed go below
        seen = _stream_commits(settings, live.epoch)
        _wait_for(lambda: _stream_commits(settings, live.epoch) >= seen + 3, "more commits")
    finally:
        stop_feeding.set()
        feeder.join(timeout=10)
        _wait_for(caught_up, "the stream to catch up")
        store.commands.submit("pause", {"note": "test over"}, issuer="test")
        stream.join(timeout=300)
    assert not stream.is_alive()
    assert close_epoch(settings, live.epoch)[0] == "completed"

    # Every micro-batch committed once and recorded once, in order, around the commands.
    progress = store.progress.list(live.epoch)
    assert [p.sequence for p in progress] == list(range(len(progress)))
    assert _stream_commits(settings, live.epoch) == len(progress)
    history = {h["version"]: h for h in DeltaTable(settings.sink).history()}
    [delete] = [h for h in history.values() if h["operation"] == "DELETE"]
    deleted = int(delete["operationMetrics"]["numDeletedRows"])
    assert deleted > 0
    # Our appends after the change data feed was enabled are its inserts.
    inserts = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", cdf_from + 1)
        .load(settings.sink)
        .where("_change_type = 'insert'")
        .count()
    )
    assert inserts > 0

    # The user keeps nothing older than now; the erasure's removed files go with it.
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        _as_a_user_would(spark, f"VACUUM {sink} LITE RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    produce_backlog(log, GENERATOR, records=500, first=1_000_000)
    drain = PipelineSettings.from_mapping(
        {**settings.to_mapping(), "stream_trigger": "available_now"}
    )
    store.commands.submit("resume", {"note": "go on"}, issuer="test")  # the pause holds until it
    after = decide(drain)
    assert after.start == committed_offsets(settings.sink, PIPELINE)
    run_job_process(after.mode, drain, after.epoch, timeout=600)
    assert close_epoch(drain, after.epoch)[0] == "completed"

    report = audit(
        settings.source,
        settings.sink,
        settings.quarantine,
        PIPELINE,
        summaries=store.commands.log_summaries(),
    )
    assert report.ok, report
    assert (report.totals.missing, report.totals.duplicated) == (0, 0)
    assert report.totals.expected == sum(log.latest_offsets().values())
    [erasure] = report.erasures
    assert (erasure.operation, erasure.version) == ("DELETE", delete["version"])
    assert report.totals.erased == erasure.records == deleted
    held = DeltaTable(settings.sink).to_pyarrow_table(columns=["bucket", "offset"])
    columns = (held.column("bucket").to_pylist(), held.column("offset").to_pylist())
    present = set(zip(*columns, strict=True))
    assert not any((b, o) in present for b, offs in erasure.offsets.items() for o in offs.tolist())
    assert spark.read.format("delta").load(settings.sink).count() == held.num_rows

    # A zombie of the ended stream epoch: refused, after the user's commands and vacuum.
    end = committed_offsets(settings.sink, PIPELINE)
    with pytest.raises(FencedError):
        write_batch(
            spark.read.format("bucketlog")
            .option("startingOffsets", offsets_to_json(end))
            .option("endingOffsets", offsets_to_json(end))
            .load(settings.source),
            settings.sink,
            pipeline=PIPELINE,
            epoch=str(live.epoch),
            sequence="0",
            offsetsStart=offsets_to_json(end),
            offsetsEnd=offsets_to_json(end),
        )
