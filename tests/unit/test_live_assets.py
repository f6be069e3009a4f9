"""The sink's live Asset: its watcher (``SinkProgressTrigger``) on real control tables and a
real sink, and a downstream reader taking exactly the rows of its events. The triggerer that
runs it under Airflow is in tests/airflow/test_scheduler_run.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pendulum
import pytest
from fault_tools import commit_to_sink

from modeswitch.airflow.assets import live_sink_asset, rows_of_events
from modeswitch.airflow.event_extras import event_extra, table_uri
from modeswitch.airflow.triggers import SinkProgressTrigger
from modeswitch.control.settings import PipelineSettings
from modeswitch.state import StateStore
from modeswitch.state.progress import ProgressTable

pytestmark = pytest.mark.unit

PIPELINE = "orders"


def _settings(tmp_path: Path, interval: str = "1h") -> PipelineSettings:
    return PipelineSettings.from_mapping(
        {
            "pipeline": PIPELINE,
            "source": str(tmp_path / "log"),
            "warehouse": str(tmp_path / "warehouse"),
            "asset_event_interval": interval,
        }
    )


def _commit(store: StateStore, epoch: int, sequence: int, start: dict, end: dict) -> None:
    """A sink commit (rows ``[start, end)`` per bucket) and its progress row, as a job does."""
    commit = commit_to_sink(
        store.tables.sink_table_uri, epoch, sequence, start, end, mode="stream", pipeline=PIPELINE
    )
    store.progress.record(commit)


def _look(trigger: SinkProgressTrigger):
    return asyncio.run(trigger._look())


def test_the_watcher_announces_each_commit_once_and_at_most_once_per_interval(
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path)
    store = StateStore.from_settings(settings)
    epoch = store.epochs.open("stream", "live", {0: 0, 1: 0})
    _commit(store, epoch, 0, {0: 0, 1: 0}, {0: 10, 1: 5})  # before the watcher: not announced
    trigger = SinkProgressTrigger(poll_interval=0.05, settings=settings.to_json())

    assert _look(trigger) is None  # the first look starts at the newest commit
    assert _look(trigger) is None  # nothing new
    _commit(store, epoch, 1, {0: 10, 1: 5}, {0: 20, 1: 5})
    _commit(store, epoch, 2, {0: 20, 1: 5}, {0: 25, 1: 12})
    event = _look(trigger)
    assert event is not None
    extra = event.payload
    assert extra["live"] is True and extra["status"] == "running"
    assert (extra["epoch"], extra["epochs"], extra["mode"]) == (epoch, [epoch], "stream")
    assert extra["records"] == 10 + 5 + 7
    assert (extra["first_version"], extra["last_version"]) == (1, 2)
    assert extra["start_offsets"] == {"0": 10, "1": 5}
    assert extra["end_offsets"] == {"0": 25, "1": 12}
    assert extra["table"] == table_uri(settings.sink)
    assert extra["max_event_time"] is not None

    # Another commit within the interval waits for it; then it alone is announced.
    _commit(store, epoch, 3, {0: 25, 1: 12}, {0: 30, 1: 12})
    assert _look(trigger) is None
    trigger._memory[SinkProgressTrigger.EMITTED_AT] = (
        pendulum.now("UTC").subtract(hours=2).isoformat()
    )
    later = _look(trigger).payload
    assert (later["first_version"], later["last_version"], later["records"]) == (3, 3, 5)
    assert later["start_offsets"] == {"0": 25, "1": 12}
    assert later["end_offsets"] == {"0": 30, "1": 12}

    # A reader of both events gets every row the watcher announced, each once.
    events = [
        SimpleNamespace(
            asset=SimpleNamespace(uri="modeswitch_pipeline.sink.live"),
            extra={"from_trigger": True, "payload": payload},
            timestamp=i,
        )
        for i, payload in enumerate([later, extra])
    ]
    assert event_extra(events[0]) == later
    read = rows_of_events(events)
    assert [(e["records"], e["rows"], e["live"]) for e in read["epochs"]] == [
        (22, 22, True),
        (5, 5, True),
    ]


def test_the_watcher_stays_up_through_a_failed_look_and_fires_repeatedly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path, interval="50ms")
    store = StateStore.from_settings(settings)
    epoch = store.epochs.open("stream", "live", {0: 0})
    trigger = SinkProgressTrigger(poll_interval=0.05, settings=settings.to_json())
    trigger._memory[SinkProgressTrigger.LAST_VERSION] = -1  # as if it had looked before
    real = ProgressTable.after_version
    failures = []

    def flaky(self, version):
        if not failures:
            failures.append(version)
            raise OSError("the table is out of reach")
        return real(self, version)

    monkeypatch.setattr(ProgressTable, "after_version", flaky)

    async def watch() -> list[dict]:
        events = []
        runner = trigger.run()
        await asyncio.sleep(0)
        for sequence in range(2):
            _commit(store, epoch, sequence, {0: 10 * sequence}, {0: 10 * sequence + 10})
            event = await asyncio.wait_for(anext(runner), timeout=20)
            events.append(event.payload)
        await runner.aclose()
        return events

    events = asyncio.run(watch())
    assert failures, "the failing look was not tried"
    assert [(e["first_version"], e["last_version"], e["records"]) for e in events] == [
        (0, 0, 10),
        (1, 1, 10),
    ]


def test_the_live_asset_is_watched_by_the_sink_trigger() -> None:
    asset = live_sink_asset("modeswitch_pipeline", poll_interval=5)
    assert (asset.name, asset.uri) == ("modeswitch_pipeline.sink.live",) * 2
    [watcher] = asset.watchers
    assert isinstance(watcher.trigger, SinkProgressTrigger)
    assert watcher.trigger.serialize() == (
        "modeswitch.airflow.triggers.SinkProgressTrigger",
        {"poll_interval": 5, "settings": None},
    )
    with pytest.raises(ValueError, match="poll_interval"):
        SinkProgressTrigger(poll_interval=0)
