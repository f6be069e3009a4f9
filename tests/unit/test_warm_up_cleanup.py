"""A warm-up's folder removed when its query stopped mid-micro-batch (modeswitch.modes.warmup):
an interrupted task may still be writing into it for a moment, so the delete is tried again,
and a folder that cannot go is left and logged, never failing the standby it warmed."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from modeswitch.modes import warmup
from modeswitch.modes.warmup import WarmingUp

pytestmark = pytest.mark.unit


class StoppedQuery:
    isActive = False

    def stop(self) -> None:
        pass

    def exception(self) -> None:
        return None


def _remover(failures: int, calls: list[str]):
    def remove(location: str) -> None:
        calls.append(location)
        if len(calls) <= failures:
            raise OSError(39, f"Cannot delete directory entry in {location}")

    return remove


def test_a_folder_still_written_into_is_removed_on_a_later_try(monkeypatch, tmp_path: Path):
    calls: list[str] = []
    monkeypatch.setattr(warmup, "remove_tree", _remover(2, calls))
    WarmingUp(StoppedQuery(), str(tmp_path), 0.0, {})._remove_work(pause=0)
    assert calls == [str(tmp_path)] * 3


def test_a_folder_that_cannot_go_is_left_and_the_warm_up_still_reports(
    monkeypatch, tmp_path: Path, caplog
):
    calls: list[str] = []
    monkeypatch.setattr(warmup, "remove_tree", _remover(99, calls))
    monkeypatch.setattr(warmup.time, "sleep", lambda seconds: None)
    with caplog.at_level(logging.WARNING, logger="modeswitch.modes.warmup"):
        done = WarmingUp(StoppedQuery(), str(tmp_path), 0.0, {}).finish()
    assert done is not None and done.records == 0  # no sink in the folder: nothing went through
    assert len(calls) == 5
    assert "stays" in caplog.text
