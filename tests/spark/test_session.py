"""The session's JVM maps the class archive that `make install` made (modeswitch.runners.jvm);
its Python workers allocate Arrow memory with jemalloc."""

from __future__ import annotations

import pytest

from modeswitch.runners import jvm
from modeswitch.runners.session import WORKER_MEMORY_POOL


def test_the_driver_jvm_maps_the_class_archive(spark) -> None:
    path = jvm.archive_path()
    if path is None or not path.is_file() or not jvm.enabled():
        pytest.skip("no JVM class archive here: `make install` makes one")
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())
    assert f"-XX:SharedArchiveFile={path}" in arguments
    # "sharing": the JVM runs with class data sharing on (a file it could not map is dropped).
    assert "sharing" in spark.sparkContext._jvm.java.lang.System.getProperty("java.vm.info")


def test_the_python_workers_allocate_with_the_chosen_pool(spark) -> None:
    def pool(batches):
        import pyarrow as pa

        for _ in batches:
            name = pa.default_memory_pool().backend_name
            yield pa.RecordBatch.from_pydict({"pool": [name]})

    [row] = spark.range(1, numPartitions=1).mapInArrow(pool, "pool string").collect()
    assert WORKER_MEMORY_POOL == "jemalloc"
    assert row.pool == WORKER_MEMORY_POOL
