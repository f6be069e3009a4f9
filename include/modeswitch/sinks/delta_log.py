"""A Delta table's log read from its commit files directly, without loading a snapshot.

The sink's readers follow the log one commit file (``_delta_log/<version>.json``) at a time:
what was committed since a version (:func:`commit_infos_after`, for
:func:`modeswitch.sinks.commits.commits_after` and :mod:`modeswitch.sinks.history`), which
versions the log still holds after log cleanup (:func:`log_versions`,
:func:`oldest_log_version`), and one commit file's ``commitInfo`` (:func:`read_commit_info`).
Any filesystem :func:`modeswitch.storage.filesystem` opens.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from modeswitch.storage import filesystem

log = logging.getLogger(__name__)


def delta_log_dir(table_uri: str) -> tuple[Any, str]:
    """``(filesystem, path)`` of the ``_delta_log`` folder of the table at ``table_uri``."""
    fs, root = filesystem(table_uri)
    return fs, f"{root}/_delta_log"


def commit_infos_after(table_uri: str, version: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """Every commit's ``commitInfo`` (with its ``version``) at table versions above
    ``version``, oldest first, read from the log's commit files; if log cleanup has removed
    the files just above ``version``, from the oldest file kept."""
    log_dir = delta_log_dir(table_uri)
    first = True
    while True:
        info = read_commit_info(log_dir, version + 1)
        if info is None:
            if not first or (version >= 0 and _log_file_exists(log_dir, version)):
                return  # ``version`` is the newest: cleanup removes the oldest files first
            # Were the files above ``version`` cleaned up? A listing of the whole log, paid
            # only when ``version``'s own file is gone too.
            oldest = _oldest_log_version(log_dir)
            if oldest is None or oldest <= version + 1:
                return
            log.warning(
                "sink %s: log files %d to %d were cleaned up; reading from %d",
                table_uri,
                version + 1,
                oldest - 1,
                oldest,
            )
            version = oldest - 1
            first = False
            continue
        first = False
        version += 1
        yield version, info


def oldest_log_version(table_uri: str) -> int | None:
    """The oldest commit file the sink's log still holds (0 until log cleanup removes
    some), None if it holds none."""
    return _oldest_log_version(delta_log_dir(table_uri))


def log_versions(table_uri: str) -> list[int]:
    """The versions of the commit files a table's log holds, ascending (none: no log)."""
    return _log_versions(delta_log_dir(table_uri))


def _oldest_log_version(log_dir: tuple[Any, str]) -> int | None:
    """The oldest commit file the log holds, None if it holds none."""
    return min(_log_versions(log_dir), default=None)


def _log_versions(log_dir: tuple[Any, str]) -> list[int]:
    import pyarrow.fs as pafs

    fs, path = log_dir
    entries = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(
        int(e.base_name[:-5])
        for e in entries
        if e.base_name.endswith(".json") and e.base_name[:-5].isdigit()
    )


def _log_file_exists(log_dir: tuple[Any, str], version: int) -> bool:
    import pyarrow.fs as pafs

    fs, path = log_dir
    return fs.get_file_info(f"{path}/{version:020d}.json").type == pafs.FileType.File


def read_commit_info(log_dir: tuple[Any, str], version: int) -> dict[str, Any] | None:
    """The ``commitInfo`` of log file ``version``, with its ``version`` (only the ``version``
    if it has none); None if there is no such file."""
    fs, path = log_dir
    try:
        with fs.open_input_stream(f"{path}/{version:020d}.json") as src:
            lines = src.read().decode().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        if '"commitInfo"' in line:
            return {**json.loads(line)["commitInfo"], "version": version}
    return {"version": version}
