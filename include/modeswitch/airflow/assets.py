"""The sink and the quarantine as Airflow Assets: downstream DAGs run when new data lands.

The tables are only known at run time (the settings come from Variables when a task runs, not
when a DAG file is parsed), so the tasks that land data name **asset aliases** as their
outlets, one per table and DAG (:func:`sink_alias`: ``<dag_id>.sink`` and
``<dag_id>.quarantine``), and attach each event to the table's own Asset (:func:`table_asset`:
the Delta table's URI, ``file:///...`` for a local folder, the object store's URI as it is).
A downstream DAG schedules on the alias (``schedule=[sink_alias("modeswitch_pipeline")]``) or,
where it knows the table, on its Asset (``schedule=[Asset(uri=...)]``); Airflow queues it on
either. ``dags/modeswitch_example_consumer.py`` is one.

What an event carries (the asset event's ``extra``, built in
:mod:`modeswitch.airflow.event_extras`: :func:`~modeswitch.airflow.event_extras.epoch_extra`):
the pipeline, the epoch, its mode, status and end reason, the records it put in the sink and
the quarantine, the sink's Delta table versions it wrote (``first_version`` and
``last_version``: a reader can read the table as of ``last_version``), the newest event time
it committed (``max_event_time``), the offsets it started and ended at per bucket (the sink's
``bucket`` and ``offset`` columns select exactly its rows: :func:`epoch_rows`; past
:data:`MAX_LISTED_BUCKETS` buckets only their count and sums) and when it started and ended.
The close task emits one per epoch on the sink, and one on the quarantine when the epoch
quarantined records; a backfill run emits one with its window and mode
(:func:`~modeswitch.airflow.event_extras.backfill_extra`).

**While an epoch runs** (a stream epoch runs up to ``max_stream_runtime``), those events wait
for it to close: a task's outlet events land when it ends. The sink's **live** Asset
(:func:`live_sink_asset`, ``<dag_id>.sink.live``) has them sooner. It is watched in Airflow's
triggerer (an ``AssetWatcher`` on :class:`~modeswitch.airflow.triggers.SinkProgressTrigger`),
which emits at most one event per ``asset_event_interval``, for the sink commits recorded
since the last one (:func:`~modeswitch.airflow.event_extras.progress_extra`: the same keys,
per bucket the offsets of exactly those rows, ``table`` the sink's URI). A DAG scheduled on
it reads each row once; schedule a DAG on one of the two, not both (their events overlap).
``dags/modeswitch_example_live_consumer.py`` is one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from modeswitch.airflow.event_extras import MAX_LISTED_BUCKETS, event_extra, table_uri

log = logging.getLogger(__name__)


def sink_alias(dag_id: str, table: str = "sink"):
    """The asset alias a DAG's events on its ``table`` (``sink`` or ``quarantine``) go through."""
    from airflow.sdk import AssetAlias

    if table not in ("sink", "quarantine"):
        raise ValueError(f"table {table!r}: the aliases are for the sink and the quarantine")
    return AssetAlias(name=f"{dag_id}.{table}", group="modeswitch")


def table_asset(location: str, *, pipeline: str, table: str):
    """The Asset of the Delta table at ``location``: named ``modeswitch.<pipeline>.<table>``,
    its URI the table's (:func:`table_uri`)."""
    from airflow.sdk import Asset

    return Asset(
        name=f"modeswitch.{pipeline}.{table}",
        uri=table_uri(location),
        group="modeswitch",
        extra={"format": "delta"},
    )


def live_sink_asset(dag_id: str = "modeswitch_pipeline", *, poll_interval: float = 10.0):
    """The sink's live Asset for the pipeline DAG ``dag_id``: named and addressed
    ``<dag_id>.sink.live``, watched in the triggerer by a
    :class:`~modeswitch.airflow.triggers.SinkProgressTrigger` that looks at the control tables
    every ``poll_interval`` seconds. The tables and the interval come from the settings (the
    Airflow Variables) at each look, as for the pipeline's tasks."""
    from airflow.sdk import Asset, AssetWatcher

    from modeswitch.airflow.triggers import SinkProgressTrigger

    name = f"{dag_id}.sink.live"
    watcher = AssetWatcher(name=name, trigger=SinkProgressTrigger(poll_interval=poll_interval))
    return Asset(name=name, uri=name, group="modeswitch", watchers=[watcher])


def epoch_rows(
    uri: str, extra: Mapping[str, Any], *, storage_options: Mapping[str, str] | None = None
):
    """The rows of the sink table at ``uri`` that the epoch of an event's ``extra`` landed
    (a ``pyarrow.Table``): per bucket, the offsets from its start to its end. The table as of
    the event's ``last_version``, so that rows landed since are not taken. Raises
    ``ValueError`` for an event without per-bucket offsets (:data:`MAX_LISTED_BUCKETS`)."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    from modeswitch.storage import delta_dataset

    if "end_offsets" not in extra:
        raise ValueError(
            f"the event of epoch {extra.get('epoch')} lists no offsets per bucket (more than "
            f"{MAX_LISTED_BUCKETS} buckets): read the table as of its last_version instead"
        )
    start, end = extra.get("start_offsets") or {}, extra["end_offsets"]
    selected = None
    for bucket, until in end.items():
        since = int(start.get(bucket, 0))
        if int(until) <= since:
            continue
        one = (
            (pc.field("bucket") == int(bucket))
            & (pc.field("offset") >= since)
            & (pc.field("offset") < int(until))
        )
        selected = one if selected is None else selected | one
    uri = extra.get("table") or uri  # a live event names the table: its Asset is not it
    location = unquote(uri[len("file://") :]) if uri.startswith("file://") else uri
    version = extra.get("last_version")
    table = DeltaTable(
        location,
        version=int(version) if version is not None else None,
        storage_options=dict(storage_options or {}) or None,
    )
    dataset = delta_dataset(table)
    if selected is None:
        return dataset.schema.empty_table()
    return dataset.to_table(filter=selected)


def rows_of_events(
    events: Any, *, storage_options: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """What a downstream task does with the sink events that triggered its run (``events``:
    the ``triggering_asset_events`` of an alias, of the sink's Asset or of its live Asset):
    each event's epoch, mode and the rows :func:`epoch_rows` finds (logged beside the event's
    ``records``), in the order they were committed; returns them and the total."""
    epochs = []
    ordered = sorted(
        ((event_extra(e), e) for e in events),
        key=lambda pair: (_version_or(pair[0].get("last_version"), -1), pair[1].timestamp),
    )
    for extra, event in ordered:
        rows = epoch_rows(event.asset.uri, extra, storage_options=storage_options)
        epochs.append(
            {
                "table": extra.get("table") or event.asset.uri,
                "epoch": extra.get("epoch"),
                "mode": extra.get("mode"),
                "records": extra.get("records"),
                "live": bool(extra.get("live")),
                "rows": rows.num_rows,
            }
        )
        log.info(
            "epoch %s (%s) landed %d rows in %s (the event says %s)",
            extra.get("epoch"),
            extra.get("mode"),
            rows.num_rows,
            extra.get("table") or event.asset.uri,
            extra.get("records"),
        )
    return {"epochs": epochs, "rows": sum(e["rows"] for e in epochs)}


def _version_or(version: Any, default: int) -> int:
    return default if version is None else int(version)


def emit(outlet_events: Any, dag_id: str, table: str, asset: Any, extra: Mapping[str, Any]):
    """Add an event on ``asset`` with ``extra`` through the DAG's alias for ``table``: Airflow
    records it when the task succeeds."""
    outlet_events[sink_alias(dag_id, table)].add(asset, extra=dict(extra))


__all__ = [
    "emit",
    "epoch_rows",
    "live_sink_asset",
    "rows_of_events",
    "sink_alias",
    "table_asset",
]
