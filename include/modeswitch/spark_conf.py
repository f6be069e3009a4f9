"""Spark SQL settings set for a block of code: :func:`session_conf`.

A session's SQL settings are the session's, not a thread's: where several epochs run at once in
one session (a shared engine's pipelines, :mod:`modeswitch.runners.engine_server`), one block's
restore must not undo a setting another block still runs with. So the blocks that set a key
share it: the first sets it and remembers what was there, the last one out puts that back
(blocks that ask one key for different values at once: the latest value holds until the last
one leaves; pipelines that share an engine share their storage kinds, so the values they ask
for are the same).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

_LOCK = threading.Lock()
_HELD: dict[tuple[int, str], tuple[int, str | None]] = {}
"""``(id(session), key) -> (blocks holding it, the value before the first)``."""


@contextlib.contextmanager
def session_conf(spark: Any, conf: Mapping[str, str]) -> Iterator[None]:
    """Set Spark SQL settings for the duration of a block, then put back what was there once
    no other block of this process holds them."""
    session = id(spark)
    with _LOCK:
        for key, value in conf.items():
            held, before = _HELD.get((session, key), (0, None))
            if held == 0:
                before = spark.conf.get(key, None)
            _HELD[(session, key)] = (held + 1, before)
            spark.conf.set(key, value)
    try:
        yield
    finally:
        with _LOCK:
            for key in conf:
                held, before = _HELD.pop((session, key))
                if held > 1:
                    _HELD[(session, key)] = (held - 1, before)
                elif before is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, before)
