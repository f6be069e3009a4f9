"""How often a live stream records its policy's decision: every second while what it sees
moves, every DECISION_IDLE_EVERY while it does not (an idle pipeline's cost), at once on a
switch or on any movement."""

from __future__ import annotations

from datetime import timedelta

import pendulum
import pytest
from test_status import layers  # noqa: F401 (a fixture)

from modeswitch.control.settings_layers import layer_settings
from modeswitch.modes.stream import DECISION_IDLE_EVERY, StreamSupervisor
from modeswitch.runners.lifecycle import decide
from modeswitch.state import StateStore

pytestmark = pytest.mark.unit


class StillLog:
    """A log whose latest offsets are what the test says."""

    def __init__(self, latest: dict[int, int]) -> None:
        self.latest = latest

    def latest_offsets(self) -> dict[int, int]:
        return dict(self.latest)


def test_an_idle_stream_records_its_decision_seldom_and_any_movement_at_once(
    layers: list,  # noqa: F811
) -> None:
    settings = layer_settings(*layers, ("run params", {"enter_threshold": "1h"}))
    plan = decide(settings, force_mode="stream")
    store = StateStore.from_settings(settings)
    started = pendulum.datetime(2026, 11, 29, tz="UTC")
    now = [started]
    supervisor = StreamSupervisor(settings, store, plan.epoch, started, lambda: now[0])
    supervisor.committed = {0: 5, 1: 7}
    supervisor.log = StillLog({0: 5, 1: 7})

    def recorded() -> int:
        return sum(1 for d in store.decisions.list(limit=500) if d.decided_by == "stream")

    supervisor.evaluate()  # the first is always recorded
    assert recorded() == 1
    for second in range(1, 14):  # nothing moves: not again within DECISION_IDLE_EVERY
        now[0] = started + timedelta(seconds=second)
        supervisor.evaluate()
    assert recorded() == 1
    now[0] = started + DECISION_IDLE_EVERY
    supervisor.evaluate()
    assert recorded() == 2
    # A record arrives: recorded at the next second, and every second while it moves.
    supervisor.log.latest = {0: 6, 1: 7}
    now[0] += timedelta(seconds=1)
    supervisor.evaluate()
    assert recorded() == 3
    supervisor.committed = {0: 6, 1: 7}
    now[0] += timedelta(seconds=1)
    supervisor.evaluate()
    assert recorded() == 4


class Reported:
    """A query's recent progress reports, as pyspark gives them."""

    def __init__(self, reports: list[dict]) -> None:
        self.recentProgress = reports


def test_the_first_micro_batch_s_time_is_said_longest_first() -> None:
    from modeswitch.modes.stream import first_progress

    first = {"durationMs": {"walCommit": 9, "addBatch": 1644, "triggerExecution": 1698}}
    later = {"durationMs": {"addBatch": 90}}
    assert first_progress(Reported([first, later])) == (
        "triggerExecution 1698 ms, addBatch 1644 ms, walCommit 9 ms"
    )
    assert first_progress(Reported([])) == "no progress report yet"
