"""Storage credentials: only from the environment, never from settings, code or a command line.

``MODESWITCH_STORAGE_OPTIONS`` holds a JSON object of deltalake / object-store options (for
example ``{"AWS_ACCESS_KEY_ID": "...", "AWS_SECRET_ACCESS_KEY": "...", "AWS_REGION": "..."}``)
used for the sink, the quarantine and the control tables: by the control state, by the sink's
commits on the Spark driver and, through the sink's ``storage.<key>`` options, by its writers.
Under Airflow, the ``storage_connection`` setting names a Connection whose extras become this
variable for the tasks and for the Spark jobs they submit
(:func:`modeswitch.airflow.settings.storage_environment`); the settings carry only the
Connection's id.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from modeswitch.errors import ConfigError

ENV_STORAGE_OPTIONS = "MODESWITCH_STORAGE_OPTIONS"


def storage_options(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The storage options in ``MODESWITCH_STORAGE_OPTIONS`` (``{}`` when unset).

    A malformed value is refused with :class:`ConfigError` naming the variable; the value
    itself is never repeated (it holds secrets).
    """
    raw = (os.environ if environ is None else environ).get(ENV_STORAGE_OPTIONS, "")
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise ConfigError(
            f"environment variable {ENV_STORAGE_OPTIONS}: not valid JSON (value not shown: it "
            "may hold secrets)"
        ) from None
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ConfigError(
            f"environment variable {ENV_STORAGE_OPTIONS}: expected a JSON object of option "
            "names to values"
        )
    return {key: str(item) for key, item in value.items()}


def storage_environment(options: Mapping[str, str]) -> dict[str, str]:
    """The environment entry that hands ``options`` to :func:`storage_options` in another
    process (``{}`` for no options)."""
    if not options:
        return {}
    return {ENV_STORAGE_OPTIONS: json.dumps(dict(options), sort_keys=True)}


def absolute_location(location: str) -> str:
    """A location every process means the same by: a URI (``s3://...``, ``file:///...``) as it
    is, a local path made absolute; without a trailing ``/`` either way."""
    location = str(location).rstrip("/") or "/"
    return location if "://" in location else os.path.abspath(location)


def filesystem(location: str) -> tuple[Any, str]:
    """The pyarrow filesystem of a location (a path or URI) and the path on it."""
    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(absolute_location(location))
    return fs, path.rstrip("/") or "/"


def is_local(location: str) -> bool:
    """Whether a path or URI is on the local filesystem (no scheme, or ``file:``)."""
    return "://" not in location or location.lower().startswith("file:")
