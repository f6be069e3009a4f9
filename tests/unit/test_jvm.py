"""The JVM class archive's naming and options (making one is exercised by `make install`
and checked against a real session in tests/spark/test_session.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeswitch.errors import ModeswitchError
from modeswitch.runners import jvm


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(jvm.ENV_CACHE, str(tmp_path))
    monkeypatch.delenv(jvm.ENV_SWITCH, raising=False)
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "delta-spark_4.2_2.13-4.4.0.jar").write_bytes(b"jar")
    monkeypatch.setenv(jvm.ENV_JARS, str(jars))
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


def test_the_archive_name_follows_the_fetched_jars(cache: Path) -> None:
    first = jvm.archive_path()
    (cache / "jars" / "delta-storage-4.4.0.jar").write_bytes(b"jar")
    assert jvm.archive_path() != first


def test_the_fetched_jars_are_absolute_and_sorted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("delta-storage-4.4.0.jar", "delta-spark_4.2_2.13-4.4.0.jar", "README"):
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setenv(jvm.ENV_JARS, str(tmp_path))
    assert jvm.fetched_jars() == [
        str(tmp_path / "delta-spark_4.2_2.13-4.4.0.jar"),
        str(tmp_path / "delta-storage-4.4.0.jar"),
    ]


@pytest.mark.parametrize("made", [False, True], ids=["no folder", "empty folder"])
def test_without_fetched_jars_the_error_says_make_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, made: bool
) -> None:
    folder = tmp_path / ".jars"
    if made:
        folder.mkdir()
    monkeypatch.setenv(jvm.ENV_JARS, str(folder))
    with pytest.raises(ModeswitchError, match=r"no jars in .*\.jars: run `make install`"):
        jvm.fetched_jars()


def test_options_are_added_once_to_what_is_there() -> None:
    assert jvm.with_java_options(None, "-XX:A") == "-XX:A"
    assert jvm.with_java_options("-Xss4m", "-XX:A") == "-Xss4m -XX:A"
    assert jvm.with_java_options("-Xss4m -XX:A", "-XX:A") == "-Xss4m -XX:A"
    assert jvm.with_java_options("-Xss4m", "") == "-Xss4m"
