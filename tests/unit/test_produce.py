"""The synthetic producer: determinism, skew, late and malformed events, and its CLI."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pendulum
import pyarrow as pa
import pytest

from modeswitch.cli import main
from modeswitch.devtools.produce import EventGenerator, parse_skew, produce_backlog, produce_live
from modeswitch.errors import ConfigError
from modeswitch.sources.segments import SegmentLog

NOW = pendulum.datetime(2026, 11, 21, 12, 0, 0, tz="UTC")


def whole_log(log: SegmentLog) -> pa.Table:
    latest = log.latest_offsets()
    batches = [b for bucket in log.buckets() for b in log.read(bucket, 0, latest[bucket])]
    return pa.Table.from_batches(batches)


def backlog(root: Path, *, seed: int, chunk: int = 262_144) -> pa.Table:
    log = SegmentLog.create(str(root), buckets=8)
    generator = EventGenerator(
        seed=seed, buckets=8, skew="zipf:1.1", late_fraction=0.05, malformed_fraction=0.01
    )
    produce_backlog(log, generator, records=30_000, span=timedelta(hours=1), now=NOW, chunk=chunk)
    return whole_log(log)


def test_same_seed_gives_the_same_log_however_it_is_chunked(tmp_path: Path) -> None:
    first = backlog(tmp_path / "a", seed=7)
    again = backlog(tmp_path / "b", seed=7, chunk=999)
    other = backlog(tmp_path / "c", seed=8)
    assert first.num_rows == again.num_rows == 30_000
    assert first.equals(again)
    assert not first.equals(other)


def test_zipf_skew_makes_bucket_zero_the_heaviest(tmp_path: Path) -> None:
    table = backlog(tmp_path / "a", seed=1)
    counts = pa.TableGroupBy(table, "bucket").aggregate([("offset", "count")]).to_pydict()
    per_bucket = dict(zip(counts["bucket"], counts["offset_count"], strict=True))
    assert per_bucket[0] == max(per_bucket.values())
    assert per_bucket[0] > 3 * per_bucket[7]
    weights = parse_skew("zipf:1.1", 8)
    assert per_bucket[0] / 30_000 == pytest.approx(weights[0], abs=0.02)


def test_late_and_malformed_fractions_are_honoured(tmp_path: Path) -> None:
    table = backlog(tmp_path / "a", seed=3)
    values = table.column("value").to_pylist()
    malformed = 0
    for value in values:
        try:
            json.loads(value)
        except json.JSONDecodeError:
            malformed += 1
    assert 0.005 < malformed / len(values) < 0.02
    # On-time backlog events are spread evenly up to NOW; late ones are pushed back.
    times = table.column("event_time").to_pylist()
    assert max(times) <= NOW
    assert min(times) >= NOW - timedelta(hours=1, minutes=10)
    assert min(times) < NOW - timedelta(hours=1)  # some are late beyond the span


def test_payloads_are_json_with_typed_fields(tmp_path: Path) -> None:
    table = backlog(tmp_path / "a", seed=5)
    good = []
    for value in table.column("value").to_pylist():
        try:
            good.append(json.loads(value))
        except json.JSONDecodeError:
            continue
    sample = good[0]
    assert set(sample) == {"event_id", "user_id", "action", "amount", "country"}
    assert len({g["event_id"] for g in good}) == len(good)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="--skew"):
        parse_skew("pareto:2", 4)
    with pytest.raises(ConfigError, match="--late-fraction"):
        EventGenerator(seed=0, buckets=2, late_fraction=1.5)


def test_live_producer_paces_to_the_rate_and_stops_at_the_record_count(tmp_path: Path) -> None:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=2)
    report = produce_live(
        log,
        EventGenerator(seed=0, buckets=2),
        rate=2_000,
        duration=timedelta(seconds=30),
        records=1_000,
        flush_every=timedelta(milliseconds=50),
    )
    assert report.records == 1_000 == sum(log.latest_offsets().values())
    assert 0.3 < report.seconds < 5  # ~0.5 s at 2 000/s, never all at once


def test_cli_produces_a_backlog_and_continues_numbering(tmp_path: Path, capsys) -> None:
    root = str(tmp_path / "log")
    args = ["produce", "--log", root, "--buckets", "4", "--records", "5000", "--seed", "7"]
    assert main([*args, "--skew", "zipf:1.1"]) == 0
    assert main(["produce", "--log", root, "--records", "1000", "--seed", "7"]) == 0
    log = SegmentLog(root)
    assert sum(log.latest_offsets().values()) == 6000
    ids = [json.loads(v)["event_id"] for v in whole_log(log).column("value").to_pylist()]
    assert sorted(ids) == list(range(6000))
    out = capsys.readouterr().out
    assert "total" in out and "6,000" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--records", "10", "--duration", "5s"], "--duration needs --rate"),
        (["--rate", "fast", "--duration", "5s"], "--rate: 'fast' is not a rate"),
        (["--rate", "10/s"], "needs --duration or --records"),
        (["--records", "10", "--skew", "zipf:x"], "--skew"),
        ([], "give --records"),
    ],
)
def test_cli_refuses_bad_arguments_with_a_named_error(
    tmp_path: Path, capsys, argv: list[str], message: str
) -> None:
    code = main(["produce", "--log", str(tmp_path / "log"), "--buckets", "2", *argv])
    assert code == 2
    assert message in capsys.readouterr().err.replace("\n", " ")
