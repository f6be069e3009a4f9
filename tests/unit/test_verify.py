"""The exactly-once audit, without Spark: tables written directly with deltalake."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from modeswitch.cli import main
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import ModeswitchError
from modeswitch.ops.audit_counts import count_positions
from modeswitch.ops.verify import audit
from modeswitch.sinks.commits import SinkCommit, committed_offsets
from modeswitch.sources.segments import SegmentLog

PIPELINE = "orders"
BUCKETS = 4
# Two waves. Bucket 0 starts at offset 10 (where the pipeline began reading it), bucket 2
# is first covered by the second wave, bucket 3 is never committed.
WAVES: list[dict[int, tuple[int, int]]] = [
    {0: (10, 100), 1: (0, 50)},
    {0: (100, 300), 1: (50, 240), 2: (5, 30)},
]
RANGES = {0: (10, 300), 1: (0, 240), 2: (5, 30), 3: None}


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> SegmentLog:
    root = tmp_path_factory.mktemp("verify") / "log"
    log = SegmentLog.create(str(root), buckets=BUCKETS)
    generator = EventGenerator(seed=3, buckets=BUCKETS, malformed_fraction=0.1)
    produce_backlog(log, generator, records=1_600, segment_records=150)
    assert min(log.latest_offsets().values()) > 300
    return log


def is_good(value: str) -> bool:
    try:
        return isinstance(json.loads(value), dict)
    except ValueError:
        return False


def source_rows(log: SegmentLog, positions: Iterable[tuple[int, int]]) -> pa.Table:
    """The source records at the given (bucket, offset) positions, in that order."""
    rows = []
    for bucket, offset in positions:
        rows.extend(pa.Table.from_batches(list(log.read(bucket, offset, offset + 1))).to_pylist())
    return pa.Table.from_pylist(rows, schema=next(log.read(0, 0, 1)).schema)


def quarantined(rows: pa.Table) -> pa.Table:
    return rows.append_column("reason", pa.array(["value is not valid JSON"] * rows.num_rows))


@dataclass
class Tables:
    sink: str
    quarantine: str


def build(
    tmp_path: Path,
    log: SegmentLog,
    *,
    waves: list[dict[int, tuple[int, int]]] = WAVES,
    drop: set[tuple[int, int]] = frozenset(),  # type: ignore[assignment]
    extra_sink: list[tuple[int, int]] = (),  # type: ignore[assignment]
    extra_quarantine: list[tuple[int, int]] = (),  # type: ignore[assignment]
    pipeline: str = PIPELINE,
    configuration: Mapping[str, str] | None = None,
) -> Tables:
    """Sink and quarantine tables as the sink writes them: per wave, good records to the sink
    and malformed ones to the quarantine, one sink commit carrying offsets and app txn.

    ``drop`` leaves positions out; ``extra_*`` add copies of source records to the last wave;
    ``configuration``: the sink table's properties, if this creates it.
    """
    tables = Tables(str(tmp_path / "sink"), str(tmp_path / "quarantine"))
    end: dict[int, int] = {}
    for sequence, wave in enumerate(waves):
        positions = [
            (b, o) for b, (lo, hi) in wave.items() for o in range(lo, hi) if (b, o) not in drop
        ]
        rows = source_rows(log, positions)
        good = pa.array([is_good(v) for v in rows.column("value").to_pylist()], pa.bool_())
        sink_rows, bad_rows = rows.filter(good), rows.filter(pc.invert(good))
        if sequence == len(waves) - 1:
            sink_rows = pa.concat_tables([sink_rows, source_rows(log, extra_sink)])
            bad_rows = pa.concat_tables([bad_rows, source_rows(log, extra_quarantine)])
        end.update({b: hi for b, (_, hi) in wave.items()})
        commit = SinkCommit(
            pipeline=pipeline,
            epoch=1,
            mode="batch",
            sequence=sequence,
            start={b: lo for b, (lo, _) in wave.items()},
            end=dict(end),
            records=rows.num_rows,
        )
        write_deltalake(
            tables.sink,
            sink_rows,
            mode="append",
            configuration=configuration,
            commit_properties=CommitProperties(
                custom_metadata=commit.to_metadata(),
                app_transactions=[Transaction(pipeline, commit.txn_version)],
            ),
        )
        if bad_rows.num_rows:
            write_deltalake(tables.quarantine, quarantined(bad_rows), mode="append")
    return tables


def malformed_positions(log: SegmentLog, bucket: int, lo: int, hi: int) -> list[int]:
    values = pa.Table.from_batches(list(log.read(bucket, lo, hi))).column("value").to_pylist()
    return [lo + i for i, v in enumerate(values) if not is_good(v)]


# -- the audit --------------------------------------------------------------------------------
def test_a_perfect_sink_is_ok_with_exact_counts(tmp_path: Path, log: SegmentLog) -> None:
    tables = build(tmp_path, log)
    assert committed_offsets(tables.sink, PIPELINE) == {0: 300, 1: 240, 2: 30}

    report = audit(log.root, tables.sink, tables.quarantine, PIPELINE)

    assert report.ok
    assert [b.bucket for b in report.buckets] == [0, 1, 2, 3]
    for row in report.buckets:
        span = RANGES[row.bucket]
        if span is None:  # never committed: contributes nothing
            assert (row.start, row.committed, row.expected) == (None, None, 0)
            assert row.in_sink == row.in_quarantine == 0
            continue
        lo, hi = span
        bad = len(malformed_positions(log, row.bucket, lo, hi))
        assert (row.start, row.committed, row.expected) == (lo, hi, hi - lo)
        assert (row.in_sink, row.in_quarantine) == (hi - lo - bad, bad)
        assert (row.missing, row.duplicated, row.out_of_range) == (0, 0, 0)
    assert report.totals.expected == 290 + 240 + 25
    assert report.totals.in_quarantine > 0
    assert report.totals.in_sink + report.totals.in_quarantine == report.totals.expected
    assert report.sink_commits == 2


@pytest.mark.parametrize("table", ["sink", "quarantine"])
def test_a_missing_record_is_found_in_its_bucket(
    tmp_path: Path, log: SegmentLog, table: str
) -> None:
    bad = malformed_positions(log, 0, 10, 300)
    offset = bad[0] if table == "quarantine" else next(o for o in range(150, 300) if o not in bad)
    report = audit(log.root, *vars(build(tmp_path, log, drop={(0, offset)})).values(), PIPELINE)

    assert not report.ok
    row = report.buckets[0]
    assert (row.missing, row.duplicated, row.out_of_range) == (1, 0, 0)
    assert row.missing_ranges == ((offset, offset + 1),)
    assert all(b.ok for b in report.buckets[1:])
    assert report.totals.missing == 1


def test_a_missing_range_is_reported_as_ranges(tmp_path: Path, log: SegmentLog) -> None:
    drop = {(1, o) for o in [0, 1, 2, 100, 239]}
    tables = build(tmp_path, log, drop=drop)
    row = audit(log.root, tables.sink, tables.quarantine, PIPELINE).buckets[1]
    assert row.missing == 5
    assert row.missing_ranges == ((0, 3), (100, 101), (239, 240))


def test_a_record_twice_in_the_sink_is_duplicated(tmp_path: Path, log: SegmentLog) -> None:
    offset = next(o for o in range(20, 240) if o not in malformed_positions(log, 1, 0, 240))
    tables = build(tmp_path, log, extra_sink=[(1, offset)])
    report = audit(log.root, tables.sink, tables.quarantine, PIPELINE)

    assert not report.ok
    row = report.buckets[1]
    assert (row.missing, row.duplicated, row.out_of_range) == (0, 1, 0)
    assert row.duplicated_offsets == (offset,)
    assert row.in_sink + row.in_quarantine == row.expected + 1
    assert [b.bucket for b in report.buckets if not b.ok] == [1]


def test_a_record_in_both_sink_and_quarantine_is_duplicated(
    tmp_path: Path, log: SegmentLog
) -> None:
    offset = next(o for o in range(20, 240) if o not in malformed_positions(log, 1, 0, 240))
    tables = build(tmp_path, log, extra_quarantine=[(1, offset)])
    row = audit(log.root, tables.sink, tables.quarantine, PIPELINE).buckets[1]
    assert (row.missing, row.duplicated, row.out_of_range) == (0, 1, 0)
    assert row.duplicated_offsets == (offset,)


def test_records_outside_the_committed_range_are_out_of_range(
    tmp_path: Path, log: SegmentLog
) -> None:
    # Bucket 0: below where the pipeline began (10) and at the committed offset (300);
    # bucket 3: nothing committed, so any record of it is out of range.
    tables = build(tmp_path, log, extra_sink=[(0, 3), (0, 300), (3, 0)])
    report = audit(log.root, tables.sink, tables.quarantine, PIPELINE)

    assert not report.ok
    b0, b3 = report.buckets[0], report.buckets[3]
    assert (b0.missing, b0.duplicated, b0.out_of_range) == (0, 0, 2)
    assert b0.out_of_range_offsets == (3, 300)
    assert (b3.expected, b3.in_sink, b3.out_of_range, b3.committed) == (0, 1, 1, None)
    assert report.totals.out_of_range == 3
    assert report.buckets[1].ok and report.buckets[2].ok


def test_a_bucket_with_nothing_committed_contributes_nothing(
    tmp_path: Path, log: SegmentLog
) -> None:
    # Only bucket 1 is ever committed.
    tables = build(tmp_path, log, waves=[{1: (0, 40)}])
    report = audit(log.root, tables.sink, tables.quarantine, PIPELINE)
    assert report.ok
    assert report.totals.expected == 40
    assert [(b.bucket, b.expected) for b in report.buckets] == [(0, 0), (1, 40), (2, 0), (3, 0)]


def test_no_tables_yet_is_an_empty_ok_audit(tmp_path: Path, log: SegmentLog) -> None:
    report = audit(log.root, str(tmp_path / "none"), str(tmp_path / "nor"), PIPELINE)
    assert report.ok
    assert (report.sink_version, report.quarantine_version) == (None, None)
    assert report.totals.expected == 0
    assert len(report.buckets) == BUCKETS


def test_a_quarantine_table_that_does_not_exist_is_empty(tmp_path: Path, log: SegmentLog) -> None:
    # Everything, malformed or not, went to the sink: no quarantine table is needed.
    sink = str(tmp_path / "sink")
    commit = SinkCommit(PIPELINE, 1, "batch", 0, {2: 0}, {2: 60}, 60)
    write_deltalake(
        sink,
        source_rows(log, [(2, o) for o in range(60)]),
        commit_properties=CommitProperties(
            custom_metadata=commit.to_metadata(),
            app_transactions=[Transaction(PIPELINE, commit.txn_version)],
        ),
    )
    report = audit(log.root, sink, str(tmp_path / "no-quarantine"), PIPELINE)
    assert report.ok
    assert report.quarantine_version is None
    assert (report.buckets[2].in_sink, report.buckets[2].in_quarantine) == (60, 0)


def test_another_pipelines_commits_do_not_count(tmp_path: Path, log: SegmentLog) -> None:
    tables = build(tmp_path, log, pipeline="someone-else")
    report = audit(log.root, tables.sink, tables.quarantine, PIPELINE)
    assert not report.ok
    assert report.totals.expected == 0
    assert report.totals.out_of_range == report.totals.in_sink + report.totals.in_quarantine


def test_committed_offsets_beyond_the_source_are_a_problem(tmp_path: Path, log: SegmentLog) -> None:
    latest = log.latest_offsets()[2]
    sink = str(tmp_path / "sink")
    commit = SinkCommit(PIPELINE, 1, "batch", 0, {2: 0}, {2: latest + 5}, 0)
    write_deltalake(
        sink,
        source_rows(log, [(2, o) for o in range(latest)]),
        commit_properties=CommitProperties(custom_metadata=commit.to_metadata()),
    )
    report = audit(log.root, sink, str(tmp_path / "q"), PIPELINE)
    assert not report.ok
    assert report.buckets[2].missing == 5
    assert len(report.problems) == 1
    assert f"beyond the log's latest offset {latest}" in report.problems[0]


def test_spot_check_compares_quarantined_records_with_the_source(
    tmp_path: Path, log: SegmentLog
) -> None:
    tables = build(tmp_path, log)
    report = audit(log.root, tables.sink, tables.quarantine, PIPELINE, spot_check=10)
    assert report.ok
    assert report.spot_check is not None
    assert (report.spot_check.checked, report.spot_check.mismatches) == (10, ())

    # A quarantined record whose value is not the source's at its offset.
    wrong = source_rows(log, [(1, 5)]).set_column(4, "value", pa.array(["forged"]))
    write_deltalake(tables.quarantine, quarantined(wrong), mode="append")
    report = audit(log.root, tables.sink, tables.quarantine, PIPELINE, spot_check=10_000)
    assert report.spot_check is not None
    mismatches = [m for m in report.spot_check.mismatches if m.column == "value"]
    assert [(m.bucket, m.offset, m.quarantined) for m in mismatches] == [(1, 5, "forged")]
    assert not report.ok


def test_a_table_without_positions_is_refused(tmp_path: Path, log: SegmentLog) -> None:
    write_deltalake(str(tmp_path / "q"), pa.table({"value": ["x"]}))
    with pytest.raises(ModeswitchError, match=r"quarantine table .*: has no column\(s\) bucket"):
        audit(log.root, str(tmp_path / "sink"), str(tmp_path / "q"), PIPELINE)


# -- the counting, against a naive reference --------------------------------------------------
def naive(sink, quarantine, starts, committed, known):
    rows = list(sink) + list(quarantine)
    buckets = sorted(set(known) | set(committed) | {b for b, _ in rows})
    result = {}
    for bucket in buckets:
        lo, hi = (starts[bucket], committed[bucket]) if bucket in committed else (0, 0)
        inside = Counter(o for b, o in rows if b == bucket and lo <= o < hi)
        result[bucket] = (
            hi - lo,
            sum(1 for b, _ in sink if b == bucket),
            sum(1 for b, _ in quarantine if b == bucket),
            sum(1 for o in range(lo, hi) if o not in inside),
            sum(c - 1 for c in inside.values()),
            sum(1 for b, o in rows if b == bucket and not lo <= o < hi),
        )
    return result


positions = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 30)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(
    sink=positions,
    quarantine=positions,
    ranges=st.dictionaries(
        st.integers(0, 3),
        st.tuples(st.integers(0, 15), st.integers(0, 15)).map(lambda t: (t[0], t[0] + t[1])),
    ),
)
def test_counts_match_a_naive_count(sink, quarantine, ranges) -> None:
    starts = {b: lo for b, (lo, _) in ranges.items()}
    committed = {b: hi for b, (_, hi) in ranges.items()}

    def arrays(rows):
        return (np.array([b for b, _ in rows], np.int64), np.array([o for _, o in rows], np.int64))

    got = count_positions(
        arrays(sink), arrays(quarantine), starts=starts, committed=committed, known_buckets=[0, 1]
    )
    expected = naive(sink, quarantine, starts, committed, [0, 1])
    assert {
        r.bucket: (r.expected, r.in_sink, r.in_quarantine, r.missing, r.duplicated, r.out_of_range)
        for r in got
    } == expected
    for r in got:
        assert r.ok == (r.missing == r.duplicated == r.out_of_range == 0)
        assert r.in_sink + r.in_quarantine == (
            r.expected - r.missing + r.duplicated + r.out_of_range
        )
        lo, hi = ranges.get(r.bucket, (0, 0))
        present = {o for b, o in sink + quarantine if b == r.bucket}
        gaps: list[tuple[int, int]] = []
        for o in range(lo, hi):
            if o in present:
                continue
            if gaps and gaps[-1][1] == o:
                gaps[-1] = (gaps[-1][0], o + 1)
            else:
                gaps.append((o, o + 1))
        assert r.missing_ranges == tuple(gaps[:5])


# -- the command line -------------------------------------------------------------------------
def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["verify", *argv])
    out = capsys.readouterr()
    return code, " ".join((out.out + out.err).split())


def test_cli_exits_0_and_prints_the_per_bucket_table(
    tmp_path: Path, log: SegmentLog, capsys: pytest.CaptureFixture[str]
) -> None:
    tables = build(tmp_path, log)
    report = audit(log.root, tables.sink, tables.quarantine, PIPELINE)
    args = ["--log", log.root, "--sink", tables.sink, "--quarantine", tables.quarantine]
    code, text = run_cli(capsys, *args, "--pipeline", PIPELINE, "--spot-check", "3")
    assert code == 0
    for header in ("bucket", "expected", "sink", "quarantine", "missing", "duplicated"):
        assert header in text
    b1 = report.buckets[1]
    assert f" 1 {b1.expected} {b1.in_sink} {b1.in_quarantine} 0 0 0 " in text
    assert " 3 - 0 0 0 0 0 " in text  # nothing committed
    t = report.totals
    assert f" total {t.expected} {t.in_sink} {t.in_quarantine} 0 0 0 " in text
    assert "spot check: 3 quarantined records compared" in text
    assert "OK: every committed record" in text


def test_cli_exits_1_on_a_discrepancy_and_names_it(
    tmp_path: Path, log: SegmentLog, capsys: pytest.CaptureFixture[str]
) -> None:
    offset = next(o for o in range(20, 240) if o not in malformed_positions(log, 1, 0, 240))
    tables = build(tmp_path, log, extra_sink=[(1, offset)], drop={(0, 42)})
    args = ["--log", log.root, "--sink", tables.sink, "--quarantine", tables.quarantine]
    code, text = run_cli(capsys, *args, "--pipeline", PIPELINE)
    assert code == 1
    assert "bucket 0 (range [10, 300)): missing [42, 43)" in text
    assert f"bucket 1 (range [0, 240)): duplicated {offset}" in text
    assert "FAILED: 1 missing, 1 duplicated, 0 out of range" in text


def test_cli_exits_2_on_a_bad_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run_cli(
        capsys,
        *["--log", str(tmp_path / "nolog"), "--sink", "s", "--quarantine", "q"],
        *["--pipeline", PIPELINE],
    )
    assert code == 2
    assert "no bucketed log at" in text
