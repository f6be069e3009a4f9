"""Fault-injection points, for the tests that kill processes at exact moments.

Production code calls :func:`pause_point` at a few places where a crash matters (between the
sink's fencing check and its commit, after a sink commit before the state write, ...). It does
nothing unless ``MODESWITCH_FAULTS`` names that point, as ``name=seconds[,name=seconds]``;
then it writes ``<name>`` into ``$MODESWITCH_FAULT_MARKERS`` (a folder) and sleeps, so a test
can SIGKILL the process at that moment or let another writer act in that window.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

ENV_FAULTS = "MODESWITCH_FAULTS"
ENV_MARKERS = "MODESWITCH_FAULT_MARKERS"


def _configured() -> dict[str, float]:
    spec = os.environ.get(ENV_FAULTS, "")
    points: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, seconds = item.partition("=")
        points[name.strip()] = float(seconds or 0)
    return points


def pause_point(name: str) -> None:
    """Pause here if the environment asks for it; otherwise return at once."""
    seconds = _configured().get(name)
    if seconds is None:
        return
    markers = os.environ.get(ENV_MARKERS)
    if markers:
        Path(markers).mkdir(parents=True, exist_ok=True)
        (Path(markers) / f"{name}.{os.getpid()}").write_text(str(time.time()))
    log.warning("fault point %s: pausing %.1f s (pid %d)", name, seconds, os.getpid())
    time.sleep(seconds)
