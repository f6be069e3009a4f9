"""What every part of the control state shares: where the tables are, and how one is opened.

:class:`StateTables` holds the pipeline's id, the state root, the sink's URI and the storage
options (strings only: it pickles). Each part of :class:`~modeswitch.state.StateStore` (one
module per table: :mod:`.epochs`, :mod:`.ledger`, :mod:`.progress`, :mod:`.decisions`,
:mod:`.commands`) is built over the store's one :class:`StateTables`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from modeswitch.state.records import check_choice, check_int, check_text, to_json
from modeswitch.state.tables import SCHEMAS, ControlTable
from modeswitch.storage import absolute_location

log = logging.getLogger(__name__)


class StateTables:
    """The control tables of one pipeline, and the one sink table whose log they follow.

    ``state_root`` holds the tables (``<root>/epochs``, ``<root>/splits``, ...); local paths are
    made absolute so that every process means the same place. Tables are created on first
    write. ``attempts`` bounds how many commit races one change may lose before
    :class:`~modeswitch.errors.StateConflictError`; a table that reaches
    ``compact_at_files`` data files is compacted by the writer that got it there.

    It holds only strings and numbers: it pickles, and it opens the tables afresh on every
    call, so one instance may be shared by threads or shipped to another process.
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
            f"StateTables(state_root={self.state_root!r}, "
            f"sink_table_uri={self.sink_table_uri!r}, pipeline={self.pipeline!r})"
        )

    def uri(self, name: str) -> str:
        """Where the control table ``name`` (``epochs``, ``splits``, ...) lives."""
        check_choice(name, tuple(SCHEMAS), what="control table")
        return f"{self.state_root}/{name}"

    def table(self, name: str) -> ControlTable:
        """Control table ``name`` (``epochs``, ``progress``, ...), opened afresh."""
        return ControlTable(
            name=name,
            uri=self.uri(name),
            schema=SCHEMAS[name],
            storage_options=self.storage_options,
            attempts=self.attempts,
            compact_at_files=self.compact_at_files,
        )


def _normalise_uri(uri: str) -> str:
    return absolute_location(uri)


def json_roundtrip(value: Mapping[str, Any], *, what: str) -> dict[str, Any]:
    """The value as it will read back from its JSON column (decisions' inputs, commands'
    args)."""
    return json.loads(to_json(value, what=what))
