"""Warm Spark's Python workers while a stream job starts, so its first micro-batch finds them.

Spark runs every Python step of a Python data source in a worker process of its own kind, and
starts one ``pyspark.daemon`` per kind, the first time a step of that kind runs: planning the
read (``plan_data_source_read``), creating the writer (``write_into_data_source``), the read and
write tasks (``pyspark.worker``) and the streaming commit (``python_streaming_sink_runner``).
A cold stream's first micro-batch starts them one after the other, each a new Python that
imports pyspark, pyarrow and this package: about 7 s of a 12 s first micro-batch on this
project's 2-core machine (measured; see docs/BENCHMARKS.md).

:func:`start_worker_warmup` runs, on a thread of its own, a tiny ``availableNow`` stream
through the same ``bucketlog`` source and ``modeswitch_delta`` sink, on a scratch log and a
scratch table (one record per task slot), while the job's main thread checks the handoff and
starts its query. Its workers stay in Spark's pool (``spark.python.worker.reuse``) with the
package imported, and the real query's first micro-batch takes them over. The scratch data is
deleted afterwards; nothing touches the pipeline's source, sink or control tables.

The warm-up only saves time: if it fails, the stream goes on with cold workers (a warning says
why). ``MODESWITCH_WARM_WORKERS=off`` turns it off.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from typing import Any

log = logging.getLogger(__name__)

ENV_SWITCH = "MODESWITCH_WARM_WORKERS"
QUERY_NAME = "modeswitch-worker-warmup"
WARMUP_TIMEOUT_SECONDS = 120.0


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "on").lower() not in {"off", "0", "false", "no"}


class WorkerWarmup:
    """A warm-up running on its own thread; :meth:`stop` ends it and removes its scratch."""

    def __init__(self, spark: Any, scratch: str, *, tasks: int) -> None:
        self.spark = spark
        self.scratch = scratch.rstrip("/")
        self.tasks = max(1, tasks)
        self.query: Any = None
        self.seconds: float | None = None
        self.error: BaseException | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=QUERY_NAME, daemon=True)

    def start(self) -> WorkerWarmup:
        self._thread.start()
        return self

    def _run(self) -> None:
        began = time.perf_counter()
        try:
            self._warm()
            self.seconds = time.perf_counter() - began
            log.info("python workers warmed in %.2f s (%d tasks)", self.seconds, self.tasks)
        except Exception as exc:  # an optimisation only: the stream runs without it
            self.error = exc
            if not self._stopped.is_set():
                log.warning(
                    "python worker warm-up failed (the first micro-batch starts its workers "
                    "itself): %s",
                    exc,
                )
        finally:
            _remove(self.scratch)

    def _warm(self) -> None:
        import pyarrow as pa

        from modeswitch.sources.segments import SegmentLog

        source = SegmentLog.create(f"{self.scratch}/log", buckets=self.tasks)
        record = pa.table(
            {
                "event_time": pa.array([0], pa.timestamp("us", "UTC")),
                "key": ["warmup"],
                "value": ["{}"],
            }
        )
        for bucket in range(self.tasks):
            source.append(bucket, record, close=True)
        start = json.dumps({str(b): 0 for b in range(self.tasks)})
        if self._stopped.is_set():
            return
        # Spark looks Python data sources up in the thread's active session; this thread's
        # JVM side has none, and the lookup of modeswitch_delta failed (DATA_SOURCE_NOT_FOUND).
        jvm = self.spark.sparkContext._jvm
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(self.spark._jsparkSession)
        self.query = (
            self.spark.readStream.format("bucketlog")
            .option("startingOffsets", start)
            .option("numPartitions", str(self.tasks))
            .load(source.root)
            .writeStream.format("modeswitch_delta")
            .option("checkpointLocation", f"{self.scratch}/checkpoint")
            .queryName(f"{QUERY_NAME}-{uuid.uuid4().hex[:8]}")
            .trigger(availableNow=True)
            .start(f"{self.scratch}/table")
        )
        if self._stopped.is_set():
            self.query.stop()
            return
        if not self.query.awaitTermination(WARMUP_TIMEOUT_SECONDS):
            self.query.stop()
            raise TimeoutError(f"not done after {WARMUP_TIMEOUT_SECONDS:.0f} s")
        error = self.query.exception()
        if error is not None:
            raise RuntimeError(str(error))

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the warm-up to end; whether it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the warm-up query if it still runs, and wait for the thread to clean up."""
        self._stopped.set()
        if self.query is not None and self.query.isActive:
            self.query.stop()
        self._thread.join(timeout)


def start_worker_warmup(
    spark: Any, scratch: str, *, tasks: int | None = None
) -> WorkerWarmup | None:
    """Start warming the Python workers of ``spark`` (see the module docstring); None when
    turned off. ``scratch``: a folder (path or URI) the executors can reach, removed after.
    ``tasks``: how many read and write tasks to warm at once, by default as many as the
    ``bucketlog`` source plans for a micro-batch (this machine's cores)."""
    if not enabled():
        return None
    return WorkerWarmup(spark, scratch, tasks=tasks or os.cpu_count() or 2).start()


def _remove(scratch: str) -> None:
    import pyarrow.fs as pafs

    try:
        fs, base = pafs.FileSystem.from_uri(
            scratch if "://" in scratch else os.path.abspath(scratch)
        )
        fs.delete_dir(base)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("python worker warm-up: could not remove %s: %s", scratch, exc)
