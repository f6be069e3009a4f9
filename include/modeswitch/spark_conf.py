"""Spark SQL settings set for a block of code: :func:`session_conf`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any


@contextlib.contextmanager
def session_conf(spark: Any, conf: Mapping[str, str]) -> Iterator[None]:
    """Set Spark SQL settings for the duration of a block, then put back what was there."""
    previous = {key: spark.conf.get(key, None) for key in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
