"""The status and the chart's data at scale and in a range, without Spark: a pipeline of
1 000 buckets (a real segment log, a real ``decide``) answers one page of its buckets, the
worst-lagging first, with a summary of all of them; the chart's range params are checked
before anything is read, and a bad one is refused naming it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import ConfigError
from modeswitch.ops.status import history_range, pipeline_history, pipeline_status
from modeswitch.runners.lifecycle import decide
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore

BUCKETS = 1000
RECORDS = 20_000


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> PipelineSettings:
    """1 000 buckets, skewed (some hold hundreds of records, most a few or none), nothing
    committed yet: each bucket's offset lag is what it holds."""
    root = tmp_path_factory.mktemp("wide")
    log = SegmentLog.create(str(root / "log"), buckets=BUCKETS)
    produce_backlog(log, EventGenerator(seed=3, buckets=BUCKETS, skew="zipf:1.1"), records=RECORDS)
    settings = PipelineSettings.from_mapping(
        {"pipeline": "wide", "source": str(root / "log"), "warehouse": str(root / "warehouse")}
    )
    decide(settings, decided_by="test")
    return settings


def test_a_page_of_1000_buckets_is_the_worst_lagging_first(wide: PipelineSettings) -> None:
    everything = pipeline_status(wide)
    assert everything["mode"]["mode"] == "batch" and everything["mode"]["running"]
    assert [b["bucket"] for b in everything["buckets"]] == list(range(BUCKETS))
    lag = {b["bucket"]: b["offset_lag"] for b in everything["buckets"]}
    assert sum(lag.values()) == RECORDS

    first = pipeline_status(wide, bucket_order="lag", bucket_limit=50)
    shown = [(b["bucket"], b["offset_lag"]) for b in first["buckets"]]
    worst_first = sorted(lag.items(), key=lambda item: (-item[1], item[0]))
    assert shown == worst_first[:50]
    assert first["bucket_summary"] == {
        "total": BUCKETS,
        "order": "lag",
        "offset": 0,
        "limit": 50,
        "shown": 50,
        "lagging": sum(1 for n in lag.values() if n > 0),
        "offset_lag": RECORDS,
        "worst_offset_lag": worst_first[0][1],
        "worst_bucket": worst_first[0][0],
        "max_event_time_lag_seconds": None,  # nothing committed: no event time yet
        "finished": 0,  # the batch epoch decide opened has finished none
    }
    # The next pages go on where it stopped; the last is short; past it, none.
    second = pipeline_status(wide, bucket_order="lag", bucket_offset=50, bucket_limit=50)
    assert [(b["bucket"], b["offset_lag"]) for b in second["buckets"]] == worst_first[50:100]
    last = pipeline_status(wide, bucket_order="lag", bucket_offset=980, bucket_limit=50)
    assert [b["bucket"] for b in last["buckets"]] == [b for b, _ in worst_first[980:]]
    assert last["bucket_summary"]["shown"] == 20
    assert pipeline_status(wide, bucket_offset=BUCKETS, bucket_limit=50)["buckets"] == []
    # What the page fetches every 5 s: a page, not 1 000 rows.
    assert len(json.dumps(first)) < len(json.dumps(everything)) / 5


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"bucket_order": "worst"}, "bucket_order: 'worst' is not one of bucket, lag"),
        ({"bucket_offset": -1}, "bucket_offset -1, bucket_limit None: the offset must be 0"),
        ({"bucket_limit": 0}, "bucket_offset 0, bucket_limit 0: the offset must be 0"),
    ],
)
def test_a_bad_bucket_page_is_refused_naming_it(
    wide: PipelineSettings, params: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        pipeline_status(wide, **params)


NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, (NOW - timedelta(hours=1), NOW)),
        ({"hours": 0.25}, (NOW - timedelta(minutes=15), NOW)),
        (
            {"since": "2026-03-01T10:00:00Z", "until": "2026-03-01T10:30:00Z"},
            (NOW - timedelta(hours=2), NOW - timedelta(minutes=90)),
        ),
        # UTC unless the time says otherwise.
        ({"since": "2026-03-01T10:00:00"}, (NOW - timedelta(hours=2), NOW)),
        ({"since": "2026-03-01T11:00:00+01:00"}, (NOW - timedelta(hours=2), NOW)),
        (
            {"until": "2026-03-01T11:00:00Z", "hours": 2},
            (NOW - timedelta(hours=3), NOW - timedelta(hours=1)),
        ),
    ],
)
def test_the_charts_range_from_its_params(params: dict, expected: tuple) -> None:
    assert history_range(now=NOW, **params) == expected


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"since": "yesterday"}, "param since: 'yesterday' is not an ISO-8601 time"),
        ({"until": "2026-13-01T00:00:00Z"}, "param until: '2026-13-01T00:00:00Z' is not an ISO"),
        ({"since": "12:00"}, "param since: '12:00' is not a date and time"),
        ({"since": "2026-03-01T11:00:00Z", "hours": 1}, "params since and hours: give one"),
        ({"since": "2026-03-01T12:00:00Z"}, "param since: '2026-03-01T12:00:00Z' is not before"),
        (
            {"since": "2026-03-01T11:00:00Z", "until": "2026-03-01T10:00:00Z"},
            "param since: '2026-03-01T11:00:00Z' is not before until",
        ),
        ({"since": "2025-01-01T00:00:00Z"}, "params since and until: .* is over 31 days"),
        ({"hours": 0}, r"param hours: 0 is not within \(0, 744\]"),
        ({"until": "0001-01-01T00:00:00Z"}, "param until: '0001-01-01T00:00:00Z' is too early"),
    ],
)
def test_a_bad_range_is_refused_naming_the_param(params: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        history_range(now=NOW, **params)


def test_the_charts_data_holds_only_its_range(tmp_path: Path) -> None:
    settings = PipelineSettings.from_mapping(
        {"pipeline": "p", "source": str(tmp_path / "log"), "warehouse": str(tmp_path / "wh")}
    )
    store = StateStore.from_settings(settings)
    for minute in range(10):
        store.decisions.record(
            "batch", f"minute {minute}", {"mode": "batch"}, at=NOW + timedelta(minutes=minute)
        )
    since, until = NOW + timedelta(minutes=3), NOW + timedelta(minutes=6)
    history = pipeline_history(settings, since=since, until=until, now=NOW + timedelta(hours=1))
    assert [p["at"] for p in history["points"]] == [
        (NOW + timedelta(minutes=m)).isoformat() for m in (3, 4, 5, 6)
    ]
    assert (history["since"], history["until"]) == (since.isoformat(), until.isoformat())
