"""Native batch reads of the embedded log: Spark's own Parquet reader on the segment files.

What a batch wave reads with ``batch_reader = native`` (not the default, ``arrow``:
:mod:`modeswitch.sinks.arrow_wave`): no Python worker between the files and the JVM. Only the
embedded segment log has files Spark can read this way; the ``bucketlog`` data source
(:mod:`modeswitch.sources.spark`) reads any log.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from modeswitch.sources.base import SPARK_RECORD_DDL
from modeswitch.sources.segments import SegmentLog
from modeswitch.spark_conf import session_conf
from modeswitch.storage import is_local


def read_segments(
    spark: Any, root: str, splits: Sequence[tuple[int, int, int]], *, scratch: str
) -> Any:
    """The records of ``splits`` (``(bucket, start, end)``) of the embedded log at ``root``,
    read by Spark's own Parquet reader: the segment files that hold them, filtered to exactly
    those offsets. What a batch wave reads with ``batch_reader = native``: no Python worker
    between the files and the JVM. Out-of-range splits are refused as ``bucketlog``
    refuses them.

    A bucket's newest segment may still grow while Spark reads it (an appender rewrites it
    for up to ``open_segment_seconds``), and Spark then silently reads none of its rows (the
    file no longer matches the split Spark planned: measured). So a newest segment is first
    snapshotted under ``scratch`` (:meth:`SegmentLog.stable_paths`: a hard link to the file as
    it is, which its appender replaces but never changes; a copy of the range elsewhere), and
    Spark reads the snapshot, filtered to the splits' offsets. The caller deletes ``scratch``
    once the data is written, and checks the count it wrote.
    """
    from pyspark.sql import functions as F

    log_ = SegmentLog(root)
    files: list[str] = []
    condition = None
    for bucket, start, end in splits:
        paths = log_.stable_paths(bucket, start, end, scratch=scratch)  # refuses bad ranges
        if not paths:
            continue
        files.extend(paths)
        match = (F.col("bucket") == bucket) & (F.col("offset") >= start) & (F.col("offset") < end)
        condition = match if condition is None else condition | match
    if condition is None:
        return spark.createDataFrame([], SPARK_RECORD_DDL)
    paths = list(dict.fromkeys(files))
    conf = {}
    if all(is_local(path) for path in paths):
        conf[PARALLEL_LISTING_THRESHOLD] = str(2**31 - 1)
    with session_conf(spark, conf):
        frame = spark.read.schema(SPARK_RECORD_DDL).parquet(*paths)
    return frame.where(condition)


PARALLEL_LISTING_THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"
"""Above this many paths (32) Spark lists files with a Spark job. A wave names 50-100 local
segment files: listed by that job in 0.3-0.4 s (1.3 s the first time), on the driver in
0.08-0.1 s (warm session, 60 files, alternating; docs/BENCHMARKS.md). Remote paths keep it."""
