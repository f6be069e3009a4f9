"""The stream's policy while the source cannot tell its latest offsets (a Kafka broker
restarting): it decides on what it saw last, or on what the sink holds before it saw anything,
for ``source_outage_grace``; past that the job fails, naming the source's error."""

from __future__ import annotations

from datetime import timedelta

import pendulum
import pytest
from test_status import layers  # noqa: F401 (a fixture)

from modeswitch.control.settings_layers import layer_settings
from modeswitch.errors import ModeswitchError
from modeswitch.modes.stream import StreamSupervisor
from modeswitch.runners.lifecycle import decide
from modeswitch.state import StateStore

pytestmark = pytest.mark.unit


class FlakyLog:
    """A log whose latest offsets are ``answers``, one a call; None: the broker is down."""

    def __init__(self, *answers: dict | None) -> None:
        self.answers = list(answers)

    def latest_offsets(self) -> dict[int, int]:
        answer = self.answers.pop(0)
        if answer is None:
            raise ModeswitchError("kafka 127.0.0.1:9: metadata of topic 't' failed within 10 s")
        return answer


def test_the_grace_covers_an_outage_from_the_start_and_then_fails_naming_the_source(
    layers: list,  # noqa: F811
) -> None:
    settings = layer_settings(*layers, ("run params", {"source_outage_grace": "30s"}))
    plan = decide(settings, force_mode="stream")
    started = pendulum.datetime(2026, 11, 27, tz="UTC")
    supervisor = StreamSupervisor(
        settings, StateStore.from_settings(settings), plan.epoch, started, lambda: started
    )
    supervisor.committed = {0: 5, 1: 7}
    supervisor.log = FlakyLog(None, {0: 9, 1: 7}, None, None, None)
    # Down before anything was seen: what the sink holds.
    assert supervisor.observe(started + timedelta(seconds=10)).latest == {0: 5, 1: 7}
    seen = started + timedelta(seconds=20)
    assert supervisor.observe(seen).latest == {0: 9, 1: 7}
    # Down again: what it saw last, for the grace from then.
    assert supervisor.observe(seen + timedelta(seconds=25)).latest == {0: 9, 1: 7}
    assert supervisor.observe(seen + timedelta(seconds=30)).latest == {0: 9, 1: 7}
    with pytest.raises(
        ModeswitchError,
        match=r"not answered for 31 s \(source_outage_grace 0:00:30\): kafka 127\.0\.0\.1:9",
    ):
        supervisor.observe(seen + timedelta(seconds=31))
