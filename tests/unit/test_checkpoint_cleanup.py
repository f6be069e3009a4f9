"""Closing a stream epoch deletes the Spark checkpoint folders of older ended epochs, keeping
``stream_checkpoints_kept`` of them and never touching a running epoch's
(modeswitch.runners.lifecycle.clean_checkpoints)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError
from modeswitch.runners.lifecycle import clean_checkpoints
from modeswitch.state import StateStore


def test_only_the_newest_ended_epochs_keep_their_checkpoints(tmp_path: Path) -> None:
    settings = PipelineSettings.from_mapping(
        {"pipeline": "ck", "source": str(tmp_path / "log"), "warehouse": str(tmp_path / "wh")}
    )
    store = StateStore.from_settings(settings)
    for _ in range(3):
        epoch = store.epochs.open("stream", "live", {0: 0})
        store.epochs.close(epoch, {0: 0}, "completed", "stopped")
    running = store.epochs.open("stream", "live", {0: 0})
    root = Path(settings.checkpoint_root)
    names = ["epoch-1", "epoch-2", "epoch-2-from-7", "epoch-3", f"epoch-{running}", "notes"]
    for name in names:
        (root / name / "offsets").mkdir(parents=True)

    assert sorted(clean_checkpoints(settings, store, keep=1)) == [
        "epoch-1",
        "epoch-2",
        "epoch-2-from-7",
    ]
    assert sorted(p.name for p in root.iterdir()) == ["epoch-3", f"epoch-{running}", "notes"]
    assert clean_checkpoints(settings, store, keep=1) == []


def test_the_setting_is_checked() -> None:
    with pytest.raises(ConfigError, match="stream_checkpoints_kept: '0' must be greater than 0"):
        PipelineSettings.from_mapping({"stream_checkpoints_kept": "0"})
    with pytest.raises(ConfigError, match="stream_checkpoints_kept"):
        PipelineSettings.from_mapping({"stream_checkpoints_kept": "many"})
