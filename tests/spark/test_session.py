"""The session's JVM maps the class archive that `make install` made (modeswitch.runners.jvm)."""

from __future__ import annotations

import pytest

from modeswitch.runners import jvm


def test_the_driver_jvm_maps_the_class_archive(spark) -> None:
    path = jvm.archive_path()
    if path is None or not path.is_file() or not jvm.enabled():
        pytest.skip("no JVM class archive here: `make install` makes one")
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())
    assert f"-XX:SharedArchiveFile={path}" in arguments
    # "sharing": the JVM runs with class data sharing on (a file it could not map is dropped).
    assert "sharing" in spark.sparkContext._jvm.java.lang.System.getProperty("java.vm.info")
