"""The JVM class archive's naming and options (making one is exercised by `make install`
and checked against a real session in tests/spark/test_session.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeswitch.runners import jvm


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(jvm.ENV_CACHE, str(tmp_path))
    monkeypatch.delenv(jvm.ENV_SWITCH, raising=False)
    return tmp_path


def test_no_archive_no_option(cache: Path) -> None:
    path = jvm.archive_path()
    assert path is not None and path.parent == cache / "cds"
    assert not path.exists()
    assert jvm.java_options() == ""


def test_an_archive_is_mapped_unless_turned_off(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = jvm.archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    assert jvm.java_options() == f"-XX:SharedArchiveFile={path}"
    monkeypatch.setenv(jvm.ENV_SWITCH, "off")
    assert jvm.java_options() == ""


def test_the_archive_name_follows_the_spark_jars_and_the_java(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = jvm.archive_path()
    monkeypatch.setenv("MODESWITCH_DELTA_JARS", "/opt/delta-spark.jar")
    assert jvm.archive_path() != first


def test_options_are_added_once_to_what_is_there() -> None:
    assert jvm.with_java_options(None, "-XX:A") == "-XX:A"
    assert jvm.with_java_options("-Xss4m", "-XX:A") == "-Xss4m -XX:A"
    assert jvm.with_java_options("-Xss4m -XX:A", "-XX:A") == "-Xss4m -XX:A"
    assert jvm.with_java_options("-Xss4m", "") == "-Xss4m"
