"""The standby's warm-up: a throwaway stream through the real source, transform and sink.

It must really run (every record it made committed by the sink), leave nothing behind (its
folder, its query, any listener, the session settings it changed) and, when it fails, only
warn: the epoch that follows starts cold but runs.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.modes.stream_query import LOCAL_CHECKPOINT_CONF
from modeswitch.modes.warmup import warm_up

CHECKPOINT_MANAGER = next(iter(LOCAL_CHECKPOINT_CONF))


@pytest.fixture
def own_tempdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def listeners(spark) -> int:
    return len(spark.streams._jsqm.listListeners())


def test_a_warm_up_runs_a_stream_through_the_sink_and_leaves_nothing(
    spark, own_tempdir, tmp_path: Path
) -> None:
    spark.conf.unset(CHECKPOINT_MANAGER)
    before = listeners(spark)
    settings = PipelineSettings(warehouse=str(tmp_path / "warehouse"))
    done = warm_up(spark, settings, records=500)
    assert done is not None
    assert done.records == 500  # committed by the sink: data and quarantine
    assert done.seconds > 0
    # Its folder was beside the pipeline's state (where a cluster's executors reach it), not
    # on the driver's disk, and is gone.
    assert list(own_tempdir.iterdir()) == []
    warm_ups = Path(settings.state_root) / "warm-up"  # a job that cannot resolve makes none
    assert not warm_ups.exists() or list(warm_ups.iterdir()) == []
    assert spark.streams.active == []
    assert listeners(spark) == before
    assert spark.conf.get(CHECKPOINT_MANAGER, None) is None


@pytest.mark.parametrize(
    ("value_schema", "quarantined"),
    [
        ("", 0),  # raw: the warm-up's events land as they are
        ("id BIGINT NOT NULL, name STRING NOT NULL, ok BOOLEAN", 50),  # every tenth malformed
    ],
)
def test_a_warm_up_writes_events_the_pipelines_own_transform_takes(
    spark, tmp_path: Path, value_schema: str, quarantined: int
) -> None:
    settings = PipelineSettings(warehouse=str(tmp_path / "warehouse"), value_schema=value_schema)
    done = warm_up(spark, settings, records=500)
    assert done is not None
    assert (done.records, done.quarantined) == (500, quarantined)


def test_a_failed_warm_up_warns_and_leaves_nothing(
    spark, own_tempdir, caplog, tmp_path: Path
) -> None:
    settings = PipelineSettings(
        warehouse=str(tmp_path / "warehouse"), transform="modeswitch.transforms:no_such_transform"
    )
    before = listeners(spark)
    with caplog.at_level(logging.WARNING, logger="modeswitch.modes.stream"):
        assert warm_up(spark, settings, records=100) is None
    assert "stream warm-up failed; the epoch will start cold" in caplog.text
    assert "no_such_transform" in caplog.text
    assert list(own_tempdir.iterdir()) == []
    warm_ups = Path(settings.state_root) / "warm-up"  # a job that cannot resolve makes none
    assert not warm_ups.exists() or list(warm_ups.iterdir()) == []
    assert spark.streams.active == []
    assert listeners(spark) == before
