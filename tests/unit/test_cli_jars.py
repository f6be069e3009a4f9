"""`modeswitch jars`: the class path every session of ours adds, as one line for spark-submit's
--jars."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeswitch.cli import main
from modeswitch.runners import jvm


def test_it_prints_the_fetched_jars_on_one_comma_separated_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Long paths: the line must not be wrapped at the terminal's width.
    folder = tmp_path / ("deep" * 30) / ".jars"
    folder.mkdir(parents=True)
    names = ["delta-storage-4.4.0.jar", "delta-spark_4.2_2.13-4.4.0.jar", "a-1.0.jar"]
    for name in [*names, ".fetched", "notes.txt"]:
        (folder / name).write_bytes(b"")
    monkeypatch.setenv(jvm.ENV_JARS, str(folder))
    assert main(["jars"]) == 0
    out = capsys.readouterr().out
    assert out == ",".join(str(folder / name) for name in sorted(names)) + "\n"


def test_without_fetched_jars_it_says_to_run_make_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(jvm.ENV_JARS, str(tmp_path / "missing"))
    assert main(["jars"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "make install" in " ".join(captured.err.split())
