"""Batch waves run in the Python workers (modeswitch.sinks.arrow_wave.write_wave): each task
reads its ranges, runs the transform's Arrow form and writes the files; the driver commits. On
a real Spark session, a real segment log and real Delta tables."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql.pandas.types import from_arrow_schema

from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import FencedError, ModeswitchError
from modeswitch.offsets import offsets_to_json
from modeswitch.sinks.arrow_wave import write_wave
from modeswitch.sinks.commits import committed_offsets, sink_commits
from modeswitch.sinks.delta import QUARANTINE_SCHEMA
from modeswitch.sinks.native import write_batch
from modeswitch.sources.base import RECORD_SCHEMA
from modeswitch.transforms import ArrowForm
from modeswitch.transforms.arrow import parse_events_arrow

RECORDS = 30_000
INPUT = from_arrow_schema(RECORD_SCHEMA)


@pytest.fixture
def log(tmp_path: Path):
    from modeswitch.sources.segments import SegmentLog

    log = SegmentLog.create(str(tmp_path / "log"), buckets=3)
    produce_backlog(
        log,
        EventGenerator(seed=7, buckets=3, skew="zipf:1.1", malformed_fraction=0.01),
        records=RECORDS,
        chunk=5_000,
    )
    return log


def form() -> ArrowForm:
    found = parse_events_arrow.arrow_form(INPUT)
    assert found is not None
    return found


def partitions(start: dict[int, int], end: dict[int, int], parts: int = 3) -> list[list[tuple]]:
    """The ranges cut in ``parts`` pieces per bucket, dealt to ``parts`` partitions."""
    out: list[list[tuple]] = [[] for _ in range(parts)]
    for bucket in sorted(end):
        lo, hi = start[bucket], end[bucket]
        cuts = [lo + (hi - lo) * i // parts for i in range(parts + 1)]
        for i in range(parts):
            if cuts[i] < cuts[i + 1]:
                out[i].append((bucket, cuts[i], cuts[i + 1]))
    return out


def wave(spark, log, tmp_path: Path, *, epoch=1, sequence=0, start, end, function=None, **extra):
    arrow = form()
    return write_wave(
        spark,
        log.root,
        partitions(start, end),
        function or arrow.function,
        arrow.schema,
        str(tmp_path / "sink"),
        pipeline="p",
        epoch=str(epoch),
        sequence=str(sequence),
        offsetsStart=offsets_to_json(start),
        offsetsEnd=offsets_to_json(end),
        quarantinePath=str(tmp_path / "quarantine"),
        **{"expectedRecords": str(sum(end[b] - start[b] for b in end)), **extra},
    )


def rows(table: str, sort: list[str]) -> list[dict]:
    return (
        DeltaTable(table).to_pyarrow_table().sort_by([(c, "ascending") for c in sort]).to_pylist()
    )


def attempt_folders(root: Path) -> set[str]:
    return {p.name for p in root.glob("native-*")}


def test_a_wave_writes_what_the_data_frame_path_writes_with_its_quarantine(
    spark, log, tmp_path, caplog
) -> None:
    end = log.latest_offsets()
    zero = dict.fromkeys(end, 0)
    with caplog.at_level(logging.INFO, logger="modeswitch.sinks.arrow_wave"):
        outcome = wave(spark, log, tmp_path, start=zero, end=end)
    assert outcome.status == "committed"
    # Where the tasks' time went, summed over the three tasks, in the wave's log line.
    [line] = [r.getMessage() for r in caplog.records if "arrow wave" in r.getMessage()]
    phases = re.search(
        r"summed over 3 tasks, 0 of them written ahead: read ([\d.]+) s, parse ([\d.]+) s, "
        r"write ([\d.]+) s",
        line,
    )
    assert phases is not None, line
    assert all(float(seconds) > 0 for seconds in phases.groups()), line
    # The same ranges through Spark: the bucketlog reader, the transform's DataFrame form
    # (mapInArrow), the sink's native writer.
    frame = (
        spark.read.format("bucketlog")
        .option("startingOffsets", offsets_to_json(zero))
        .option("endingOffsets", offsets_to_json(end))
        .load(log.root)
    )
    other = tmp_path / "other"
    write_batch(
        parse_events_arrow(frame),
        str(other / "sink"),
        pipeline="p",
        epoch="1",
        sequence="0",
        offsetsStart=offsets_to_json(zero),
        offsetsEnd=offsets_to_json(end),
        quarantinePath=str(other / "quarantine"),
    )
    sink, quarantine = str(tmp_path / "sink"), str(tmp_path / "quarantine")
    assert (
        DeltaTable(sink).schema().to_arrow() == DeltaTable(str(other / "sink")).schema().to_arrow()
    )
    assert rows(sink, ["bucket", "offset"]) == rows(str(other / "sink"), ["bucket", "offset"])
    assert rows(quarantine, ["bucket", "offset"]) == rows(
        str(other / "quarantine"), ["bucket", "offset"]
    )
    bad = DeltaTable(quarantine).to_pyarrow_table()
    assert bad.schema == QUARANTINE_SCHEMA
    assert 100 < bad.num_rows < 600  # 1 % of 30 000
    assert "value is not valid JSON" in bad["reason"].to_pylist()
    good = DeltaTable(sink).to_pyarrow_table()
    seen = Counter(zip(good["bucket"].to_pylist(), good["offset"].to_pylist(), strict=True))
    seen.update(zip(bad["bucket"].to_pylist(), bad["offset"].to_pylist(), strict=True))
    assert seen == Counter({(b, o) for b in end for o in range(end[b])})
    # One commit: offsets, records, max event time per bucket; one file per task, each in the
    # attempt's folder, with statistics; nothing else left in the table's folder.
    commit = next(sink_commits(sink, "p"))
    assert commit.records == good.num_rows
    assert committed_offsets(sink, "p") == end
    latest = good.group_by("bucket").aggregate([("event_time", "max")]).to_pylist()
    assert commit.max_event_time_us == {
        r["bucket"]: int(pa.scalar(r["event_time_max"]).cast(pa.int64()).as_py()) for r in latest
    }
    actions = pa.table(DeltaTable(sink).get_add_actions(flatten=True)).to_pydict()
    assert len(actions["path"]) == 3
    assert all(p.startswith("native-") for p in actions["path"])
    assert None not in actions["min.offset"] + actions["max.event_time"]
    on_disk = {str(p.relative_to(sink)) for p in Path(sink).rglob("*") if p.is_file()} - {
        str(p.relative_to(sink)) for p in Path(sink, "_delta_log").rglob("*")
    }
    assert on_disk == set(actions["path"])
    assert DeltaTable(quarantine).transaction_version("p") == commit.txn_version


def test_a_count_other_than_planned_commits_nothing_and_leaves_no_file(
    spark, log, tmp_path
) -> None:
    end = log.latest_offsets()
    zero = dict.fromkeys(end, 0)
    with pytest.raises(ModeswitchError, match="source offsets cover 29999"):
        wave(spark, log, tmp_path, start=zero, end=end, expectedRecords="29999")
    assert not (tmp_path / "sink" / "_delta_log").exists()
    assert attempt_folders(tmp_path / "sink") == set()
    assert attempt_folders(tmp_path / "quarantine") == set()


def test_a_failed_task_commits_nothing_and_the_retry_commits_once(spark, log, tmp_path) -> None:
    end = log.latest_offsets()
    zero = dict.fromkeys(end, 0)
    half = {b: o // 2 for b, o in end.items()}
    wave(spark, log, tmp_path, start=zero, end=half)
    sink = tmp_path / "sink"
    before = attempt_folders(sink)
    inner, failing_offset = form().function, end[0] - 1

    def failing(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Defined here, so the workers get it by value: the Arrow parse, failing on the batch
        # that holds bucket 0's last offset; the other tasks have written their files by then.
        for batch in inner(batches):
            if failing_offset in batch.column("offset").to_pylist():
                raise RuntimeError(f"injected failure at offset {failing_offset}")
            yield batch

    with pytest.raises(Exception, match="injected failure"):
        wave(
            spark,
            log,
            tmp_path,
            sequence=1,
            start=half,
            end=end,
            function=failing,
        )
    assert DeltaTable(str(sink)).version() == 0
    assert attempt_folders(sink) == before  # the failed attempt's folder (other tasks' files) gone
    outcome = wave(spark, log, tmp_path, sequence=1, start=half, end=end)
    assert outcome.status == "committed"
    replay = wave(spark, log, tmp_path, sequence=1, start=half, end=end)
    assert replay.status == "replayed"
    with pytest.raises(FencedError, match="zombie"):
        wave(spark, log, tmp_path, epoch=0, sequence=5, start=half, end=end)
    table = DeltaTable(str(sink))
    assert table.version() == 1
    assert len(attempt_folders(sink)) == 2  # the replay and the zombie left nothing
    good = table.to_pyarrow_table(columns=["bucket", "offset"])
    bad = DeltaTable(str(tmp_path / "quarantine")).to_pyarrow_table(columns=["bucket", "offset"])
    seen = Counter(zip(good["bucket"].to_pylist(), good["offset"].to_pylist(), strict=True))
    seen.update(zip(bad["bucket"].to_pylist(), bad["offset"].to_pylist(), strict=True))
    assert seen == Counter({(b, o) for b in end for o in range(end[b])})


def test_a_range_beyond_the_log_is_refused_naming_it(spark, log, tmp_path) -> None:
    end = log.latest_offsets()
    zero = dict.fromkeys(end, 0)
    beyond = {**end, 0: end[0] + 10}
    with pytest.raises(Exception, match=f"bucket 0.*{end[0] + 10}|{end[0] + 10}.*bucket 0"):
        wave(spark, log, tmp_path, start=zero, end=beyond)
    assert not (tmp_path / "sink" / "_delta_log").exists()
    assert attempt_folders(tmp_path / "sink") == set()
