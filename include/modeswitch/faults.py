"""Fault-injection points, for the tests that kill processes at exact moments.

Production code calls :func:`pause_point` at a few places where a crash matters (between the
sink's fencing check and its commit, after a sink commit before the state write, ...). It does
nothing unless ``MODESWITCH_FAULTS`` names that point, as ``name=seconds[@hit][,...]``; then it
writes ``<name>.<pid>`` into ``$MODESWITCH_FAULT_MARKERS`` (a folder) and sleeps, so a test
can SIGKILL the process at that moment or let another writer act in that window. With
``@hit`` it pauses only at the point's ``hit``-th call (counted from 1 across every process that
shares the markers folder: each call leaves a file in its ``hits`` subfolder), so a test can
stop a stream at its third micro-batch's commit, say.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path

from modeswitch.environment import FAULT_MARKERS, FAULTS, env_value

log = logging.getLogger(__name__)

ENV_FAULTS = FAULTS.name
ENV_MARKERS = FAULT_MARKERS.name


def _count_hit(markers: Path | None, name: str) -> int:
    """Record one call of point ``name``; returns how many calls there have been so far."""
    if not markers:
        return 1
    hits = Path(markers) / "hits"
    hits.mkdir(parents=True, exist_ok=True)
    (hits / f"{name}.{os.getpid()}.{uuid.uuid4().hex}").touch()
    return sum(1 for entry in hits.iterdir() if entry.name.startswith(f"{name}."))


def pause_point(name: str) -> None:
    """Pause here if the environment asks for it; otherwise return at once."""
    seconds, hit = env_value(FAULTS).get(name, (None, None))
    if seconds is None:
        return
    markers = env_value(FAULT_MARKERS)
    if hit is not None and _count_hit(markers, name) != hit:
        return
    if markers:
        Path(markers).mkdir(parents=True, exist_ok=True)
        (Path(markers) / f"{name}.{os.getpid()}").write_text(str(time.time()))
    log.warning("fault point %s: pausing %.1f s (pid %d)", name, seconds, os.getpid())
    time.sleep(seconds)
