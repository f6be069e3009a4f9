"""Which stream checkpoints the stream job writes through Hadoop's FileSystem API."""

from __future__ import annotations

from modeswitch.modes.stream_query import checkpoint_conf


def test_only_a_local_checkpoint_changes_how_spark_writes_it() -> None:
    assert checkpoint_conf("/data/checkpoints/epoch-3")
    assert checkpoint_conf("file:///data/checkpoints/epoch-3")
    assert checkpoint_conf("s3://bucket/checkpoints/epoch-3") == {}
    assert checkpoint_conf("hdfs://nn/checkpoints/epoch-3") == {}
