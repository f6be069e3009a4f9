"""The stream job's checkpoint on a local folder is written through Hadoop's FileSystem API
(modeswitch.modes.stream.checkpoint_conf): no forked chmod per offsets or commit log entry."""

from __future__ import annotations

from pathlib import Path

from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.modes.stream_query import checkpoint_conf
from modeswitch.offsets import offsets_to_json
from modeswitch.sources.segments import SegmentLog
from modeswitch.spark_conf import session_conf


def test_a_local_checkpoint_is_written_through_the_filesystem_api_and_resumes(
    spark, tmp_path: Path
) -> None:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=2)
    produce_backlog(log, EventGenerator(seed=8, buckets=2), records=1_000)
    checkpoint = str(tmp_path / "checkpoint")
    conf = checkpoint_conf(checkpoint)
    assert conf

    def run() -> object:
        query = (
            spark.readStream.format("bucketlog")
            .option("startingOffsets", offsets_to_json({0: 0, 1: 0}))
            .option("maxRecordsPerTrigger", "400")
            .load(log.root)
            .writeStream.format("modeswitch_delta")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start(str(tmp_path / "sink"))
        )
        try:
            assert query.awaitTermination(120)
        finally:
            query.stop()
        assert query.exception() is None
        return query

    with session_conf(spark, conf):
        first = run()
        manager = first._jsq.streamingQuery().offsetLog().fileManager()
        assert manager.getClass().getSimpleName() == "FileSystemBasedCheckpointFileManager"
        produce_backlog(log, EventGenerator(seed=9, buckets=2), records=500)
        second = run()  # resumes from the entries the first run wrote
        assert sum(p["numInputRows"] for p in first.recentProgress) == 1_000
        assert sum(p["numInputRows"] for p in second.recentProgress) == 500
    assert sorted(
        p.name for p in (tmp_path / "checkpoint" / "commits").iterdir() if p.name[0] != "."
    ) == [str(i) for i in range(5)]
