"""Building a :class:`~modeswitch.state.StateStore` in tests: at the default root under a
warehouse, as :class:`~modeswitch.control.settings.PipelineSettings` places it."""

from __future__ import annotations

from collections.abc import Mapping

from modeswitch.state import StateStore
from modeswitch.storage import absolute_location


def warehouse_store(
    warehouse: str,
    pipeline: str,
    sink_table_uri: str,
    *,
    storage_options: Mapping[str, str] | None = None,
    attempts: int = 40,
    compact_at_files: int = 64,
) -> StateStore:
    """The store at the default root, ``<warehouse>/_modeswitch/<pipeline>``."""
    return StateStore(
        f"{absolute_location(warehouse)}/_modeswitch/{pipeline}",
        sink_table_uri,
        pipeline,
        storage_options=storage_options,
        attempts=attempts,
        compact_at_files=compact_at_files,
    )
