"""Delta's own Spark connector (delta-spark, on every session's class path: jvm/pom.xml) reads
the sink's tables as the pipeline writes them: the rows, the history with our offsets in each
commit, and every earlier version by time travel."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from pyspark.sql import functions as F

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.modes.batch import run_batch_epoch
from modeswitch.modes.job import resolve_job
from modeswitch.runners.jvm import fetched_jars
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.sinks.commits import METADATA_KEY, SinkCommit, committed_offsets, sink_commits
from modeswitch.sources.segments import SegmentLog

RECORDS = 3_000
WAVE = 1_000


@pytest.fixture(scope="module")
def sink(spark, tmp_path_factory: pytest.TempPathFactory) -> PipelineSettings:
    """A batch epoch drained into the sink by the pipeline's own path, one commit a wave."""
    root = tmp_path_factory.mktemp("delta-spark")
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "orders",
            "source": str(root / "log"),
            "warehouse": str(root / "warehouse"),
            "wave_records": str(WAVE),
            "watermark_lag_threshold": "1h",
            "enter_threshold": "1h",
            "exit_threshold": "1h",
        }
    )
    log = SegmentLog.create(settings.source, buckets=2)
    produce_backlog(log, EventGenerator(seed=7, buckets=2), records=RECORDS, chunk=WAVE)
    plan = decide(settings, force_mode="batch")
    run_batch_epoch(spark, resolve_job(settings, "batch"), plan.epoch)
    assert close_epoch(settings, plan.epoch)[0] == "completed"
    return settings


def test_the_session_has_the_fetched_jars_and_deltas_extension_and_catalog(spark) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.jars") == ",".join(fetched_jars())
    assert spark.conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"
    catalog = spark.conf.get("spark.sql.catalog.spark_catalog")
    assert catalog == "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def test_spark_reads_every_committed_record_once(spark, sink: PipelineSettings) -> None:
    rows = spark.read.format("delta").load(sink.sink).select("bucket", "offset").collect()
    keys = Counter((row.bucket, row.offset) for row in rows)
    committed = committed_offsets(sink.sink, sink.pipeline)
    assert sum(committed.values()) == RECORDS
    assert set(keys) == {(b, o) for b, end in committed.items() for o in range(end)}
    assert max(keys.values()) == 1


def _history_with_offsets(spark, table: str) -> list[tuple[int, str, SinkCommit]]:
    """DESCRIBE HISTORY's versions and operations, each with the offsets our commit carries.

    The sink's full offsets are a ``modeswitch`` field of the commit's ``commitInfo``, which
    Delta's history (its CommitInfo columns) does not show: Spark reads them from the commit
    file. The history's ``userMetadata`` column has a summary (the next test)."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").select("version", "operation")
    infos = (
        spark.read.json(f"{table}/_delta_log/*.json")
        .where(F.col("commitInfo").isNotNull())
        .select(
            F.regexp_extract("_metadata.file_name", r"^(\d+)\.json$", 1)
            .cast("long")
            .alias("version"),
            F.col(f"commitInfo.{METADATA_KEY}").alias("offsets"),
        )
    )
    rows = history.join(infos, "version", "left").orderBy("version").collect()
    return [
        (row.version, row.operation, SinkCommit.from_commit_info({METADATA_KEY: row.offsets}))
        for row in rows
    ]


def test_describe_history_lists_our_commits_with_their_offsets(
    spark, sink: PipelineSettings
) -> None:
    history = _history_with_offsets(spark, sink.sink)
    waves = -(-RECORDS // WAVE)
    assert [version for version, _, _ in history] == list(range(waves))
    assert [operation for _, operation, _ in history] == ["CREATE TABLE"] + ["WRITE"] * (waves - 1)
    committed: dict[int, int] = {}
    for version, _, commit in history:
        assert commit is not None, f"version {version} carries no offsets"
        assert (commit.pipeline, commit.epoch, commit.mode) == (sink.pipeline, 1, "batch")
        assert commit.sequence == version
        # Each commit starts where the one before it ended (exact handoff between waves).
        assert all(committed.get(b, 0) == start for b, start in commit.start.items())
        committed.update(commit.end)
        assert sum(committed.values()) == (version + 1) * WAVE
    assert committed == committed_offsets(sink.sink, sink.pipeline)


def test_describe_history_shows_each_commits_summary_as_its_user_metadata(
    spark, sink: PipelineSettings
) -> None:
    rows = (
        spark.sql(f"DESCRIBE HISTORY delta.`{sink.sink}`")
        .select("version", "userMetadata")
        .orderBy("version")
        .collect()
    )
    commits = {c.table_version: c for c in sink_commits(sink.sink, sink.pipeline)}
    assert [row.version for row in rows] == sorted(commits)
    for row in rows:
        commit = commits[row.version]
        assert json.loads(row.userMetadata) == {
            "writer": "modeswitch",
            "pipeline": sink.pipeline,
            "kind": "batch",
            "epoch": 1,
            "sequence": commit.sequence,
            "records": commit.records,
            "end": {str(b): o for b, o in sorted(commit.end.items())},
        }


def test_time_travel_reads_each_version_as_its_commit_left_it(
    spark, sink: PipelineSettings
) -> None:
    committed: dict[int, int] = {}
    for version, _, commit in _history_with_offsets(spark, sink.sink):
        assert commit is not None
        committed.update(commit.end)
        read = (
            spark.read.format("delta")
            .option("versionAsOf", version)
            .load(sink.sink)
            .groupBy("bucket")
            .agg(
                F.count("*").alias("records"),
                F.countDistinct("offset").alias("distinct"),
                F.max("offset").alias("last"),
            )
            .collect()
        )
        seen = {row.bucket: (row.records, row.distinct, row.last) for row in read}
        # Version k holds exactly the records below its commit's offsets, once each.
        expected = {b: (end, end, end - 1) for b, end in committed.items() if end}
        assert seen == expected, f"version {version}: {json.dumps(seen)}"
