"""Storage credentials: only from the environment, never from settings, code or a command line.

``MODESWITCH_STORAGE_OPTIONS`` holds a JSON object of deltalake / object-store options (for
example ``{"AWS_ACCESS_KEY_ID": "...", "AWS_SECRET_ACCESS_KEY": "...", "AWS_REGION": "..."}``)
used for the sink, the quarantine and the control tables: by the control state and by the
sink's commits on the Spark driver, each reading it from its own environment (never from a
data source option: Spark prints those in its plans). The Parquet files the executors write
take their credentials from the store's standard variables (``AWS_*``, ...), as pyarrow does.
Under Airflow, the ``storage_connection`` setting names a Connection whose extras become this
variable for the tasks and for the Spark jobs they submit
(:func:`modeswitch.airflow.settings.storage_environment`); the settings carry only the
Connection's id.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from modeswitch.environment import STORAGE_OPTIONS, env_value
from modeswitch.errors import ModeswitchError

log = logging.getLogger(__name__)
T = TypeVar("T")

ENV_STORAGE_OPTIONS = STORAGE_OPTIONS.name


def storage_options(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The storage options in ``MODESWITCH_STORAGE_OPTIONS`` (``{}`` when unset).

    A malformed value is refused with :class:`~modeswitch.errors.ConfigError` naming the
    variable; the value itself is never repeated (it holds secrets).
    """
    return env_value(STORAGE_OPTIONS, environ)


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


def delta_dataset(table: Any) -> Any:
    """``table.to_pyarrow_dataset()`` of a deltalake ``DeltaTable``, read through pyarrow's own
    filesystem where the table is local.

    Through deltalake's filesystem handler (a Python filesystem that pyarrow's I/O threads call
    back into), a process that had read a table aborted at exit ("terminate called without an
    active exception", status -6) in 11 of 30 runs of a three-line script here (deltalake 1.x,
    pyarrow 26); through pyarrow's local filesystem in 0 of 30. Tables elsewhere (object
    stores) are still read through deltalake's handler, which has their credentials.
    """
    uri = table.table_uri
    if not is_local(uri):
        return table.to_pyarrow_dataset()
    import pyarrow.fs as pafs

    fs, path = filesystem(uri)
    return table.to_pyarrow_dataset(filesystem=pafs.SubTreeFileSystem(path, fs))


def remove_tree(location: str) -> None:
    """Delete a folder (a path or URI) and everything in it; nothing if it is not there."""
    fs, path = filesystem(location)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_dir(path)


def local_path(location: str) -> str:
    """The absolute path of a local location: a path, or a ``file:`` URI
    (``file:///data/t``, ``file:/data/t``); for :func:`is_local` locations only."""
    path = location[len("file:") :] if location.lower().startswith("file:") else location
    if path.startswith("//"):
        path = path[2:]
    return absolute_location(path)


def is_local(location: str) -> bool:
    """Whether a path or URI is on the local filesystem (no scheme, or ``file:``)."""
    return "://" not in location or location.lower().startswith("file:")


class CommitRaceLost(ModeswitchError):
    """An attempt's commit lost to another writer in a way deltalake does not report as
    ``CommitFailedError`` (e.g. two writers creating the same table): the attempt is made again
    from a fresh snapshot."""


def retry_commit_races(
    attempt: Callable[[int], T],
    *,
    attempts: int,
    what: str,
    error: type[Exception] = ModeswitchError,
    backoff: float = 0.01,
    max_backoff: float = 0.5,
) -> T:
    """The optimistic commit loop every Delta writer here uses: ``attempt(n)`` (n from 1)
    checks a fresh snapshot and commits on top of it with no automatic retry (deltalake's
    ``max_commit_retries=0``). If another commit landed in between, deltalake refuses it
    (``CommitFailedError``) or the attempt raises :class:`CommitRaceLost`; then, after a random
    exponential wait (up to ``backoff * 2**n``, at most ``max_backoff`` seconds), the check and
    the commit are made again. After ``attempts`` lost races ``error`` is raised, naming
    ``what``. Any other exception propagates at once."""
    from deltalake.exceptions import CommitFailedError
    from tenacity import (
        RetryError,
        Retrying,
        retry_if_exception_type,
        stop_after_attempt,
        wait_random_exponential,
    )

    retrying = Retrying(
        stop=stop_after_attempt(attempts),
        wait=wait_random_exponential(multiplier=backoff, max=max_backoff),
        retry=retry_if_exception_type((CommitFailedError, CommitRaceLost)),
        before_sleep=lambda state: log.info(
            "%s: raced another commit (attempt %d of %d); checking again",
            what,
            state.attempt_number,
            attempts,
        ),
    )
    try:
        for state in retrying:
            with state:
                return attempt(state.retry_state.attempt_number)
    except RetryError as exc:
        raise error(
            f"{what}: gave up after {attempts} commit attempts, each raced by another commit"
        ) from exc.last_attempt.exception()
    raise AssertionError("unreachable: tenacity either returns or raises")
