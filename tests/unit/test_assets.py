"""The sink as an Airflow Asset: the URI naming the Delta table, what an event carries, and a
downstream reader taking exactly an epoch's rows from it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from modeswitch.airflow.assets import epoch_rows, rows_of_events, sink_alias, table_asset
from modeswitch.airflow.event_extras import (
    MAX_LISTED_BUCKETS,
    backfill_extra,
    epoch_extra,
    offsets_extra,
    table_uri,
)


def test_a_table_is_named_by_its_uri(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert table_uri("warehouse/sink") == f"file://{tmp_path}/warehouse/sink"
    assert table_uri("/data/my sink/") == "file:///data/my%20sink"
    assert table_uri("file:///data/sink") == "file:///data/sink"
    assert table_uri("s3://bucket/sink") == "s3://bucket/sink"
    asset = table_asset("/data/sink", pipeline="orders", table="sink")
    assert (asset.name, asset.uri) == ("modeswitch.orders.sink", "file:///data/sink")
    assert sink_alias("modeswitch_pipeline").name == "modeswitch_pipeline.sink"
    assert sink_alias("modeswitch_pipeline", "quarantine").name == "modeswitch_pipeline.quarantine"
    with pytest.raises(ValueError, match="'progress'"):
        sink_alias("modeswitch_pipeline", "progress")


def test_an_event_lists_offsets_per_bucket_or_sums_them_past_the_limit() -> None:
    assert offsets_extra({0: 5, 1: 7}, {0: 10, 1: 7, 2: 3}) == {
        "start_offsets": {"0": 5, "1": 7},
        "end_offsets": {"0": 10, "1": 7, "2": 3},
    }
    many = {b: 10 for b in range(MAX_LISTED_BUCKETS + 1)}
    assert offsets_extra(dict.fromkeys(many, 4), many) == {
        "offsets_summary": {
            "buckets": MAX_LISTED_BUCKETS + 1,
            "start_sum": 4 * (MAX_LISTED_BUCKETS + 1),
            "end_sum": 10 * (MAX_LISTED_BUCKETS + 1),
        }
    }


def test_an_epoch_event_says_what_the_epoch_landed() -> None:
    epoch = SimpleNamespace(
        id=3,
        mode="stream",
        end_reason="lag over the threshold",
        started_at=datetime(2026, 11, 27, 1, tzinfo=UTC),
        ended_at=datetime(2026, 11, 27, 2, tzinfo=UTC),
        start={0: 10},
        end={0: 25},
        max_event_time_us={0: 1_764_212_400_000_000, 1: 1_764_212_460_000_000},
    )
    summary = {"records": 14, "quarantined": 1, "first_version": 7, "last_version": 9}
    assert epoch_extra("orders", epoch, summary, status="completed") == {
        "pipeline": "orders",
        "epoch": 3,
        "mode": "stream",
        "status": "completed",
        "reason": "lag over the threshold",
        "records": 14,
        "quarantined": 1,
        "first_version": 7,
        "last_version": 9,
        "started_at": "2026-11-27T01:00:00+00:00",
        "ended_at": "2026-11-27T02:00:00+00:00",
        "max_event_time": "2025-11-27T03:01:00+00:00",
        "start_offsets": {"0": 10},
        "end_offsets": {"0": 25},
    }
    plan = {"pipeline": "orders", "command": 4, "mode": "reprocess", "window": ["a", "b"]}
    outcome = {"records": 100, "quarantined": None, "sink_version": 12, "run_id": "x"}
    assert backfill_extra(plan, outcome) == {
        "pipeline": "orders",
        "backfill": True,
        "command": 4,
        "mode": "reprocess",
        "window_start": "a",
        "window_end": "b",
        "records": 100,
        "quarantined": 0,
        "last_version": 12,
    }


def _rows(bucket: int, start: int, end: int) -> pa.Table:
    return pa.table(
        {
            "bucket": pa.array([bucket] * (end - start), pa.int32()),
            "offset": pa.array(range(start, end), pa.int64()),
            "value": pa.array([f"{bucket}-{o}" for o in range(start, end)]),
        }
    )


def test_a_reader_takes_exactly_the_rows_of_the_epochs_it_was_told_of(tmp_path: Path) -> None:
    sink = tmp_path / "sink dir"
    write_deltalake(str(sink), pa.concat_tables([_rows(0, 0, 10), _rows(1, 0, 4)]))  # epoch 1
    write_deltalake(str(sink), _rows(0, 10, 15), mode="append")  # epoch 2, version 1
    write_deltalake(str(sink), _rows(1, 4, 9), mode="append")  # epoch 2, version 2
    write_deltalake(str(sink), _rows(0, 15, 30), mode="append")  # landed after the event
    uri = table_uri(str(sink))
    second = {
        "epoch": 2,
        "mode": "stream",
        "records": 10,
        "first_version": 1,
        "last_version": 2,
        **offsets_extra({0: 10, 1: 4, 2: 0}, {0: 15, 1: 9, 2: 0}),
    }
    rows = epoch_rows(uri, second)
    assert sorted(zip(rows["bucket"].to_pylist(), rows["offset"].to_pylist(), strict=True)) == [
        *[(0, o) for o in range(10, 15)],
        *[(1, o) for o in range(4, 9)],
    ]
    # Read as of the event's last version: offsets the epoch had not reached are not there
    # even when the range asks for them.
    assert epoch_rows(uri, {**second, "end_offsets": {"0": 40}}).num_rows == 5
    first = {"epoch": 1, "mode": "batch", "records": 14, "last_version": 0}
    first |= offsets_extra({}, {0: 10, 1: 4})
    events = [
        SimpleNamespace(asset=SimpleNamespace(uri=uri), extra=second, timestamp=2),
        SimpleNamespace(asset=SimpleNamespace(uri=uri), extra=first, timestamp=1),
    ]
    assert rows_of_events(events) == {
        "epochs": [
            {"table": uri, "epoch": 1, "mode": "batch", "records": 14, "live": False, "rows": 14},
            {"table": uri, "epoch": 2, "mode": "stream", "records": 10, "live": False, "rows": 10},
        ],
        "rows": 24,
    }
    with pytest.raises(ValueError, match="epoch 9 lists no offsets per bucket"):
        epoch_rows(uri, {"epoch": 9, "offsets_summary": {"buckets": 300}})
