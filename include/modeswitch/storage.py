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
import threading
from collections import OrderedDict
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


def open_delta_table(location: str, storage_options: Mapping[str, str]) -> Any:
    """The Delta table at ``location``'s current snapshot, None before its first commit.

    Each thread keeps the tables it opened (:data:`OPEN_TABLES_KEPT`, the least recently
    used dropped first) and brings one up to date with ``update_incremental()``, only when a
    newer log entry may be there (:func:`may_have_entry_after`). A fresh load reads the
    table's checkpoint and up to 99 log entries (15 ms on average for a sink on a quiet
    machine, 60 ms under load), and a hand-off from batch to stream made 41 of them: the
    control tables, the sink and its quarantine, each several times (``close_epoch``,
    ``decide``; docs/BENCHMARKS.md). A lane's thread runs every ``decide`` of its pipeline,
    and a stream commits every micro-batch from one thread. The snapshot is as current as a
    fresh load's, so a compare-and-swap made from it is unchanged: a commit that raced
    another still fails, and the next open reads that commit.

    Per thread, not per process: an update changes the table object's snapshot, and one
    thread's update must not come under another's read or commit (a lane's ``decide``, a
    stream's callback thread committing, its command poll). A local
    table deleted or made again since is noticed by the file of the log entry it was held at
    (:func:`log_entry_mark`) and loaded afresh; one in an object store is loaded afresh only
    when the update fails.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    held = _held_tables()
    key = (location, tuple(sorted(storage_options.items())))
    entry = held.pop(key, None)
    if entry is not None:
        table, version, mark = entry
        try:
            if log_entry_mark(table.table_uri, version) == mark:
                if not may_have_entry_after(table.table_uri, version):
                    held[key] = entry  # as current as it gets: kept as it was
                    return table
                table.update_incremental()
                return _hold(held, key, table)
            log.info("table %s: changed under its open snapshot; loading it afresh", location)
        except Exception as exc:  # deleted or replaced under us: load it afresh below
            log.info("table %s: loading it afresh (%s)", location, exc)
    try:
        table = DeltaTable(location, storage_options=dict(storage_options))
    except TableNotFoundError:
        return None
    return _hold(held, key, table)


OPEN_TABLES_KEPT = 16
"""Tables :func:`open_delta_table` keeps open per thread at most: a pipeline has five control
tables, its sink and its quarantine."""
_OPEN_TABLES = threading.local()


def log_entry_mark(uri: str, version: int) -> tuple[int, int, int] | None:
    """What tells the file of a local table's log entry ``version`` from any other (inode,
    modification time, size): a table deleted, or deleted and made again, no longer has that
    file. None for a table elsewhere, or when the file cannot be read."""
    if not is_local(uri):
        return None
    try:
        stat = os.stat(_log_entry_path(uri, version))
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def may_have_entry_after(uri: str, version: int) -> bool:
    """Whether a table may have a log entry after ``version``: for a local table, whether
    the next entry's file is there (entries are numbered without a gap), a look that costs a
    few microseconds where ``update_incremental()`` lists the log (1.2 ms); elsewhere, always
    (the update asks the store)."""
    return not is_local(uri) or os.path.exists(_log_entry_path(uri, version + 1))


def _log_entry_path(uri: str, version: int) -> str:
    """The file of a local table's log entry ``version``."""
    return os.path.join(local_path(uri), "_delta_log", f"{version:020d}.json")


def _held_tables() -> OrderedDict[tuple[str, tuple[tuple[str, str], ...]], Any]:
    held = getattr(_OPEN_TABLES, "tables", None)
    if held is None:
        held = _OPEN_TABLES.tables = OrderedDict()
    return held


def _hold(held: OrderedDict, key: tuple, table: Any) -> Any:
    """Keep ``table`` as the newest of this thread's open tables, with the mark of the log
    entry it is at; a local table whose entry was not found is not kept."""
    version = table.version()
    mark = log_entry_mark(table.table_uri, version)
    if mark is not None or not is_local(table.table_uri):
        held[key] = (table, version, mark)
        while len(held) > OPEN_TABLES_KEPT:
            held.popitem(last=False)
    return table


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
