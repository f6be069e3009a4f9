"""What every part of the control state shares: where the tables are, and how one is opened.

:class:`ControlState` holds the pipeline's id, the state root, the sink's URI and the storage
options (strings only: it pickles); the parts of :class:`~modeswitch.state.StateStore` (one
module per table: :mod:`.epochs`, :mod:`.ledger`, :mod:`.progress`, :mod:`.decisions`,
:mod:`.commands`) build on it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from modeswitch.state.records import check_choice, check_int, check_text, to_json
from modeswitch.state.tables import SCHEMAS, ControlTable
from modeswitch.storage import absolute_location

log = logging.getLogger(__name__)


STATE_DIR = "_modeswitch"
_PIPELINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class ControlState:
    """The control tables of one pipeline, and the one sink table whose log they follow.

    ``state_root`` holds the tables (``<root>/epochs``, ``<root>/splits``, ...); local paths are
    made absolute so that every process means the same place. Tables are created on first
    write. ``attempts`` bounds how many commit races one change may lose before
    :class:`~modeswitch.errors.StateConflictError`; a table that reaches
    ``compact_at_files`` data files is compacted by the writer that got it there.

    The store holds only strings and numbers: it pickles, and it opens the tables afresh on
    every call, so one instance may be shared by threads or shipped to another process.
    """

    def __init__(
        self,
        state_root: str,
        sink_table_uri: str,
        pipeline: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        attempts: int = 40,
        compact_at_files: int = 64,
    ) -> None:
        self.state_root = _normalise_uri(
            check_text(state_root, what="state_root", allow_empty=False)
        )
        self.sink_table_uri = _normalise_uri(
            check_text(sink_table_uri, what="sink_table_uri", allow_empty=False)
        )
        self.pipeline = check_text(pipeline, what="pipeline", allow_empty=False)
        self.storage_options = dict(storage_options or {})
        self.attempts = check_int(attempts, what="attempts", minimum=1)
        self.compact_at_files = check_int(compact_at_files, what="compact_at_files", minimum=2)

    def __repr__(self) -> str:
        return (
            f"StateStore(state_root={self.state_root!r}, sink_table_uri={self.sink_table_uri!r},"
            f" pipeline={self.pipeline!r})"
        )

    def table_uri(self, name: str) -> str:
        """Where the control table ``name`` (``epochs``, ``splits``, ...) lives."""
        check_choice(name, tuple(SCHEMAS), what="control table")
        return f"{self.state_root}/{name}"

    def epoch_event_maxima(self, epoch: int) -> dict[int, int]:
        """Per bucket, the max event time of one epoch's sink commits (``progress``)."""
        raise NotImplementedError

    def control_table(self, name: str) -> ControlTable:
        """Control table ``name`` (``epochs``, ``progress``, ...), for maintenance."""
        return self._table(name)

    def _table(self, name: str) -> ControlTable:
        return ControlTable(
            name=name,
            uri=self.table_uri(name),
            schema=SCHEMAS[name],
            storage_options=self.storage_options,
            attempts=self.attempts,
            compact_at_files=self.compact_at_files,
        )


def _normalise_uri(uri: str) -> str:
    return absolute_location(uri)


def _iso(value: datetime | None) -> str:
    return "never" if value is None else value.isoformat()


def _json_roundtrip(value: Mapping[str, Any], *, what: str) -> dict[str, Any]:
    """The value as it will read back from its JSON column."""
    return json.loads(to_json(value, what=what))
