"""The sink's commit protocol without Spark: fencing, replays, races, continuity, statistics.

These call the same functions the Spark driver calls (`write_files`, `commit_files`) with
Arrow batches, so they run in milliseconds; tests/spark/test_delta_sink.py drives them
through real Spark queries.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from modeswitch.errors import (
    ConfigError,
    FencedError,
    OffsetsContinuityError,
    SchemaMismatchError,
)
from modeswitch.faults import ENV_FAULTS, ENV_MARKERS
from modeswitch.ops.maintenance import maintain_table
from modeswitch.sinks.commits import committed_offsets, sink_commits, txn_version
from modeswitch.sinks.delta import (
    DeltaSinkOptions,
    DeltaSinkStreamWriter,
    DeltaSinkWriter,
    commit_files,
    vacuum,
    write_files,
)
from modeswitch.sinks.schema import SCHEMA_CHANGE_METADATA_KEY

SCHEMA = pa.schema(
    [
        ("bucket", pa.int32()),
        ("offset", pa.int64()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("value", pa.string()),
    ]
)
BASE_US = 1_790_000_000_000_000


def rows(bucket: int, start: int, end: int, schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    n = end - start
    columns = {
        "bucket": pa.array([bucket] * n, pa.int32()),
        "offset": pa.array(range(start, end), pa.int64()),
        "event_time": pa.array(
            [BASE_US + o * 1_000_123 for o in range(start, end)], pa.timestamp("us", tz="UTC")
        ),
        "value": pa.array([f"v{bucket}-{o}" for o in range(start, end)]),
    }
    for extra in schema.names[4:]:
        columns[extra] = pa.array([1.5] * n)
    return pa.RecordBatch.from_pydict(columns, schema=schema)


def options(path: Path, epoch: int | None = 1, **extra: str) -> DeltaSinkOptions:
    raw = {"path": str(path)}
    if epoch is not None:
        raw.update(pipeline="orders", epoch=str(epoch))
    raw.update(extra)
    return DeltaSinkOptions.parse(raw)


def write_wave(
    path: Path,
    epoch: int,
    sequence: int,
    ranges: dict[int, tuple[int, int]],
    *,
    schema: pa.Schema = SCHEMA,
    **extra: str,
):
    opts = options(path, epoch, **extra)
    batches = [rows(b, lo, hi, schema) for b, (lo, hi) in ranges.items()]
    message = write_files(opts, iter(batches))
    return commit_files(
        opts,
        schema,
        [message],
        sequence=sequence,
        start={b: lo for b, (lo, _) in ranges.items()},
        end={b: hi for b, (_, hi) in ranges.items()},
    )


def data_files(path: Path) -> set[str]:
    return {
        str(p.relative_to(path)) for p in path.rglob("*.parquet") if "_delta_log" not in p.parts
    }


def test_a_commit_carries_offsets_epoch_mode_and_an_app_transaction(tmp_path: Path) -> None:
    sink = tmp_path / "sink"
    outcome = write_wave(sink, 3, 0, {0: (0, 100), 1: (0, 40)})
    assert outcome.status == "committed"
    assert outcome.table_version == 0
    table = DeltaTable(str(sink))
    assert table.to_pyarrow_table().num_rows == 140
    assert table.transaction_version("orders") == txn_version(3, 0)
    [commit] = list(sink_commits(str(sink), "orders"))
    assert (commit.epoch, commit.mode, commit.sequence) == (3, "batch", 0)
    assert commit.start == {0: 0, 1: 0}
    assert commit.end == {0: 100, 1: 40}
    assert commit.records == 140
    assert commit.max_event_time_us[0] == BASE_US + 99 * 1_000_123
    assert committed_offsets(str(sink), "orders") == {0: 100, 1: 40}


def test_storage_options_come_from_the_environment_never_from_the_jobs_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modeswitch.control.settings import PipelineSettings
    from modeswitch.sinks.options import sink_options
    from modeswitch.storage import ENV_STORAGE_OPTIONS

    secret = {"AWS_ACCESS_KEY_ID": "AKIA-unit", "AWS_REGION": "eu-west-1"}
    monkeypatch.setenv(ENV_STORAGE_OPTIONS, json.dumps(secret))
    settings = PipelineSettings.from_mapping(
        {"pipeline": "p", "source": str(tmp_path / "log"), "warehouse": str(tmp_path / "w")}
    )
    written = sink_options(settings, 3, "stream")
    assert "AKIA-unit" not in json.dumps(written)  # Spark prints these in its plans
    parsed = DeltaSinkOptions.parse({**written, "path": settings.sink})
    assert parsed.storage_options == secret  # the driver's environment
    assert "AKIA-unit" not in repr(parsed)
    # A direct user's own storage.<key> option wins over the environment's, key by key.
    mine = DeltaSinkOptions.parse({**written, "path": "t", "storage.AWS_REGION": "us-east-2"})
    assert mine.storage_options == {**secret, "AWS_REGION": "us-east-2"}
    monkeypatch.setenv(ENV_STORAGE_OPTIONS, "{not json")
    with pytest.raises(ConfigError, match=ENV_STORAGE_OPTIONS):
        DeltaSinkOptions.parse({**written, "path": "t"})


def test_add_actions_carry_file_statistics(tmp_path: Path) -> None:
    sink = tmp_path / "sink"
    write_wave(sink, 1, 0, {2: (10, 510)})
    actions = pa.table(DeltaTable(str(sink)).get_add_actions(flatten=True)).to_pydict()
    assert actions["num_records"] == [500]
    assert actions["min.offset"] == [10]
    assert actions["max.offset"] == [509]
    assert actions["null_count.value"] == [0]
    # Timestamps are kept to the millisecond; the max is rounded up so skipping stays safe.
    low, high = actions["min.event_time"][0], actions["max.event_time"][0]
    assert low.timestamp() * 1e6 <= BASE_US + 10 * 1_000_123
    assert high.timestamp() * 1e6 >= BASE_US + 509 * 1_000_123


def test_a_replayed_commit_is_skipped_and_its_files_removed(tmp_path: Path) -> None:
    sink = tmp_path / "sink"
    write_wave(sink, 1, 0, {0: (0, 50)})
    before = data_files(sink)
    again = write_wave(sink, 1, 0, {0: (0, 50)})
    assert again.status == "replayed"
    assert DeltaTable(str(sink)).to_pyarrow_table().num_rows == 50
    assert data_files(sink) == before


def test_a_replay_that_covers_other_offsets_is_refused_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    # Two runs of an epoch that planned sequence 0 differently: the second cannot pass for a
    # replay, or its next commit would start where the sink does not end.
    sink = tmp_path / "sink"
    write_wave(sink, 1, 0, {0: (0, 50)})
    before = data_files(sink)
    with pytest.raises(OffsetsContinuityError, match="sequence 0 is already committed"):
        write_wave(sink, 1, 0, {0: (0, 60)})
    assert DeltaTable(str(sink)).to_pyarrow_table().num_rows == 50
    assert data_files(sink) == before


def test_a_zombie_epoch_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    sink = tmp_path / "sink"
    write_wave(sink, 1, 0, {0: (0, 50)})
    write_wave(sink, 2, 0, {0: (50, 80)})
    before = data_files(sink)
    with pytest.raises(FencedError, match=r"epoch 1 sequence 1: the table already holds epoch 2"):
        write_wave(sink, 1, 1, {0: (80, 90)})
    assert DeltaTable(str(sink)).to_pyarrow_table().num_rows == 80
    assert data_files(sink) == before


def test_offsets_must_continue_where_the_last_commit_ended(tmp_path: Path) -> None:
    sink = tmp_path / "sink"
    write_wave(sink, 1, 0, {0: (0, 50), 1: (0, 10)})
    with pytest.raises(OffsetsContinuityError, match=r"bucket 0: .* starts at offset 60 .* a gap"):
        write_wave(sink, 1, 1, {0: (60, 70)})
    with pytest.raises(OffsetsContinuityError, match=r"starts at offset 40 .* an overlap"):
        write_wave(sink, 1, 1, {0: (40, 70)})
    # A wave over some buckets keeps the others' committed offsets in the end map.
    write_wave(sink, 1, 1, {0: (50, 70)})
    assert committed_offsets(str(sink), "orders") == {0: 70, 1: 10}


def _racing_commit(sink: str, epoch: int, result_path: str) -> None:
    try:
        outcome = write_wave(Path(sink), epoch, 0, {0: (0, 10)})
        Path(result_path).write_text(outcome.status)
    except FencedError as exc:
        Path(result_path).write_text(f"fenced: {exc}")
    # deltalake's runtime can abort the interpreter at exit (delta-rs #2184): the result file
    # is the outcome, so leave at once.
    os._exit(0)


def test_two_writers_racing_between_check_and_commit_cannot_both_land(tmp_path: Path) -> None:
    """Writer A (epoch 5) checks, then pauses before committing; writer B (epoch 6) commits
    in that window. delta-rs alone would let A land after B (measured: it does not check app
    transactions); the sink must refuse A."""
    sink = tmp_path / "sink"
    write_wave(sink, 4, 0, {0: (0, 0)})
    markers = tmp_path / "markers"
    result = tmp_path / "a.result"
    os.environ[ENV_FAULTS] = "sink.between_check_and_commit=3"
    os.environ[ENV_MARKERS] = str(markers)
    try:
        ctx = multiprocessing.get_context("spawn")
        writer_a = ctx.Process(target=_racing_commit, args=(str(sink), 5, str(result)))
        writer_a.start()
    finally:
        del os.environ[ENV_FAULTS]
        del os.environ[ENV_MARKERS]
    try:
        deadline = time.monotonic() + 60
        while not (markers.exists() and any(markers.iterdir())):
            assert time.monotonic() < deadline, "writer A never reached its check"
            assert writer_a.is_alive()
            time.sleep(0.05)
        assert write_wave(sink, 6, 0, {0: (0, 10)}).status == "committed"  # writer B
        writer_a.join(timeout=60)
    finally:
        if writer_a.is_alive():
            writer_a.kill()
    assert result.read_text().startswith("fenced: ")
    table = DeltaTable(str(sink))
    assert table.to_pyarrow_table().num_rows == 10
    assert table.transaction_version("orders") == txn_version(6, 0)
    assert [c.epoch for c in sink_commits(str(sink), "orders")] == [6, 4]


def _same_version_commit(sink: str, result_path: str) -> None:
    outcome = write_wave(Path(sink), 7, 3, {0: (0, 25)})
    Path(result_path).write_text(outcome.status)
    os._exit(0)  # see _racing_commit


def test_concurrent_replays_of_one_commit_land_once(tmp_path: Path) -> None:
    sink = tmp_path / "sink"
    write_wave(sink, 7, 2, {0: (0, 0)})
    ctx = multiprocessing.get_context("spawn")
    results = [tmp_path / f"r{i}" for i in range(4)]
    procs = [ctx.Process(target=_same_version_commit, args=(str(sink), str(r))) for r in results]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * 4
    statuses = sorted(r.read_text() for r in results)
    assert statuses == ["committed", "replayed", "replayed", "replayed"]
    assert DeltaTable(str(sink)).to_pyarrow_table().num_rows == 25


def test_new_columns_need_merge_schema_and_type_changes_are_refused(tmp_path: Path) -> None:
    sink = tmp_path / "sink"
    write_wave(sink, 1, 0, {0: (0, 5)})
    wider = SCHEMA.append(pa.field("score", pa.float64()))
    with pytest.raises(SchemaMismatchError, match=r"new columns score .* mergeSchema=true"):
        write_wave(sink, 1, 1, {0: (5, 10)}, schema=wider)
    assert DeltaTable(str(sink)).to_pyarrow_table().num_rows == 5
    write_wave(sink, 1, 1, {0: (5, 10)}, schema=wider, mergeSchema="true")
    table = DeltaTable(str(sink)).to_pyarrow_table()
    assert "score" in table.column_names
    assert table.num_rows == 10
    # The change is recorded on the commit that adds the column and on the one that first
    # holds it (the pipeline's, with its offsets).
    history = DeltaTable(str(sink)).history(2)  # newest first
    change = {"pipeline": "orders", "epoch": 1, "added": {"score": "double"}}
    assert [json.loads(h[SCHEMA_CHANGE_METADATA_KEY]) for h in history] == [change, change]
    assert history[1]["operation"] == "ADD COLUMN" and "modeswitch" in history[0]
    # A column that would change type stops the write, naming the version read.
    retyped = pa.schema([*SCHEMA, pa.field("score", pa.string())])
    version = "version 3 of subject 'orders-value'"
    with pytest.raises(
        SchemaMismatchError,
        match=rf"would change type as {version} has them: score \(double in the table, string "
        r"now\); .* nothing was written",
    ):
        write_wave(
            sink, 1, 2, {0: (10, 12)}, schema=retyped, mergeSchema="true", columnsFrom=version
        )
    assert DeltaTable(str(sink)).to_pyarrow_table().num_rows == 10


def test_partitioned_tables_write_partition_folders(tmp_path: Path) -> None:
    sink = tmp_path / "sink"
    schema = SCHEMA.append(pa.field("event_date", pa.string()))
    batch = rows(0, 0, 6)
    dates = pa.array(["2026-11-20"] * 3 + ["2026-11-21"] * 3)
    batch = pa.RecordBatch.from_arrays([*batch.columns, dates], schema=schema)
    opts = options(sink, 1, partitionBy="event_date")
    message = write_files(opts, iter([batch]))
    commit_files(opts, schema, [message], sequence=0, start={0: 0}, end={0: 6})
    table = DeltaTable(str(sink))
    assert table.metadata().partition_columns == ["event_date"]
    assert {p.split("/")[0] for p in data_files(sink)} == {
        "event_date=2026-11-20",
        "event_date=2026-11-21",
    }
    got = table.to_pyarrow_table(filters=[("event_date", "=", "2026-11-21")])
    assert got.column("offset").to_pylist() == [3, 4, 5]


def test_vacuum_removes_files_no_commit_references(tmp_path: Path) -> None:
    sink = tmp_path / "sink"
    write_wave(sink, 1, 0, {0: (0, 20)})
    kept = data_files(sink)
    # What a crashed executor leaves behind: written, never committed.
    opts = options(sink, 1)
    orphan = write_files(opts, iter([rows(0, 20, 30)])).files[0].path
    young = write_files(opts, iter([rows(0, 30, 40)])).files[0].path
    old = time.time() - 3 * 86400
    os.utime(sink / orphan, (old, old))
    removed = vacuum(str(sink), retention=timedelta(days=1))
    assert [Path(r).name for r in removed] == [Path(orphan).name]
    assert data_files(sink) == kept | {young}  # a young file may belong to a running write
    assert DeltaTable(str(sink)).to_pyarrow_table().num_rows == 20


@pytest.mark.parametrize("order", ["abort after the commit", "abort before the commit"])
def test_an_abort_leaves_the_files_a_commit_may_hold(tmp_path: Path, order: str) -> None:
    """Spark aborts a write whose commit it lost: a stream stopped while its micro-batch's
    commit ran in a Python worker of its own, which lands before or after the abort."""
    sink = tmp_path / "sink"
    write_wave(sink, 1, 0, {0: (0, 20)})
    opts = options(sink, 1)
    message = write_files(opts, iter([rows(0, 20, 30)]))

    def commit() -> None:
        commit_files(opts, SCHEMA, [message], sequence=1, start={0: 20}, end={0: 30})

    def abort() -> None:
        DeltaSinkStreamWriter(opts, SCHEMA).abort([message], 1)
        DeltaSinkWriter(opts, SCHEMA).abort([message])

    for step in (commit, abort) if order == "abort after the commit" else (abort, commit):
        step()
    table = DeltaTable(str(sink))
    assert sorted(table.to_pyarrow_table().column("offset").to_pylist()) == list(range(30))
    committed = data_files(sink)
    # What no commit holds, vacuum removes.
    orphan = write_files(opts, iter([rows(0, 30, 40)]))
    DeltaSinkStreamWriter(opts, SCHEMA).abort([orphan], 2)
    assert data_files(sink) == committed | {orphan.files[0].path}
    vacuum(str(sink), retention=timedelta(0))
    assert data_files(sink) == committed


def test_commit_metadata_is_plain_json_that_other_tools_can_read(tmp_path: Path) -> None:
    sink = tmp_path / "sink"
    write_wave(sink, 2, 5, {1: (0, 3)})
    log_entry = (sink / "_delta_log" / ("0" * 20 + ".json")).read_text().splitlines()
    info = next(json.loads(line)["commitInfo"] for line in log_entry if "commitInfo" in line)
    body = json.loads(info["modeswitch"])
    assert body["end"] == {"1": 3}
    assert body["epoch"] == 2
    assert body["sequence"] == 5
    txn = next(json.loads(line)["txn"] for line in log_entry if '"txn"' in line)
    assert txn["appId"] == "orders"
    assert txn["version"] == txn_version(2, 5)
    # Delta's own user-metadata field (DESCRIBE HISTORY's userMetadata column) has a summary.
    assert json.loads(info["userMetadata"]) == {
        "writer": "modeswitch",
        "pipeline": "orders",
        "kind": "batch",
        "epoch": 2,
        "sequence": 5,
        "records": 3,
        "end": {"1": 3},
    }


def test_quarantine_and_compaction_commits_say_what_they_are_in_user_metadata(
    tmp_path: Path,
) -> None:
    quarantine_wave(tmp_path, 4, 0, 0, 20, {3, 7})
    quarantine_wave(tmp_path, 4, 1, 20, 30, {25})
    quarantine = str(tmp_path / "quarantine")
    maintain_table("quarantine", quarantine, target_mb=128, vacuum_retention=timedelta(days=7))
    history = sorted(DeltaTable(quarantine).history(), key=lambda c: c["version"])
    summaries = [
        json.loads(c["userMetadata"]) for c in history if c.get("operation") != "SET TBLPROPERTIES"
    ]
    assert summaries == [
        {
            "writer": "modeswitch",
            "pipeline": "orders",
            "kind": "quarantine",
            "epoch": 4,
            "sequence": 0,
            "files": 1,
        },
        {
            "writer": "modeswitch",
            "pipeline": "orders",
            "kind": "quarantine",
            "epoch": 4,
            "sequence": 1,
            "files": 1,
        },
        {"writer": "modeswitch", "kind": "compaction", "table": "quarantine"},
    ]


def with_reasons(batch: pa.RecordBatch, bad_offsets: set[int]) -> pa.RecordBatch:
    reasons = pa.array(
        [
            "value is not valid JSON" if o in bad_offsets else None
            for o in batch["offset"].to_pylist()
        ],
        pa.string(),
    )
    return batch.append_column("_quarantine_reason", reasons)


def quarantine_wave(
    path: Path, epoch: int, sequence: int, lo: int, hi: int, bad: set[int]
) -> DeltaSinkOptions:
    opts = options(path / "sink", epoch, quarantinePath=str(path / "quarantine"))
    batch = with_reasons(rows(0, lo, hi), bad)
    message = write_files(opts, iter([batch]))
    commit_files(opts, batch.schema, [message], sequence=sequence, start={0: lo}, end={0: hi})
    return opts


def test_malformed_records_go_to_the_quarantine_with_their_reason(tmp_path: Path) -> None:
    quarantine_wave(tmp_path, 1, 0, 0, 20, {3, 7})
    sink = DeltaTable(str(tmp_path / "sink")).to_pyarrow_table()
    assert "_quarantine_reason" not in sink.column_names
    assert sorted(sink["offset"].to_pylist()) == [o for o in range(20) if o not in (3, 7)]
    quarantine = DeltaTable(str(tmp_path / "quarantine"))
    got = quarantine.to_pyarrow_table().sort_by("offset").to_pylist()
    assert [(r["bucket"], r["offset"], r["value"], r["reason"]) for r in got] == [
        (0, 3, "v0-3", "value is not valid JSON"),
        (0, 7, "v0-7", "value is not valid JSON"),
    ]
    assert quarantine.transaction_version("orders") == txn_version(1, 0)
    assert committed_offsets(str(tmp_path / "sink"), "orders") == {0: 20}


def test_micro_batches_that_quarantine_load_each_table_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's commits come from one reused Python process: the sink and the quarantine
    tables are each loaded once there, then brought up to date (``update_incremental``)."""
    import deltalake

    loads: list[str] = []
    real = deltalake.DeltaTable.__init__

    def counted(self, path, *args, **kwargs):
        loads.append(Path(str(path)).name)
        real(self, path, *args, **kwargs)

    monkeypatch.setattr(deltalake.DeltaTable, "__init__", counted)
    for sequence in range(4):
        quarantine_wave(tmp_path, 1, sequence, sequence * 10, sequence * 10 + 10, {sequence * 10})
    # Each: once finding no table (the first commit makes it), once more after that.
    assert loads.count("sink") <= 2 and loads.count("quarantine") <= 2, loads
    got = DeltaTable(str(tmp_path / "quarantine")).to_pyarrow_table()["offset"].to_pylist()
    assert sorted(got) == [0, 10, 20, 30]


def test_a_crash_between_sink_and_quarantine_commits_is_repaired_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import modeswitch.sinks.committer as committer

    def crash(name: str) -> None:
        if name == "sink.before_quarantine_commit":
            raise KeyboardInterrupt("simulated crash")

    monkeypatch.setattr(committer, "pause_point", crash)
    with pytest.raises(KeyboardInterrupt):
        quarantine_wave(tmp_path, 1, 0, 0, 10, {4})
    monkeypatch.undo()
    assert committed_offsets(str(tmp_path / "sink"), "orders") == {0: 10}
    assert not (tmp_path / "quarantine" / "_delta_log").exists()
    # The replay of the same wave (Spark retrying it) repairs the quarantine; so would the next.
    quarantine_wave(tmp_path, 1, 0, 0, 10, {4})
    quarantine_wave(tmp_path, 1, 1, 10, 15, {12})
    quarantine_wave(tmp_path, 1, 1, 10, 15, {12})  # a replay: nothing twice
    got = DeltaTable(str(tmp_path / "quarantine")).to_pyarrow_table()
    assert sorted(got["offset"].to_pylist()) == [4, 12]
    assert DeltaTable(str(tmp_path / "sink")).to_pyarrow_table().num_rows == 13


def test_a_zombie_never_commits_its_quarantined_records(tmp_path: Path) -> None:
    quarantine_wave(tmp_path, 2, 0, 0, 10, set())
    with pytest.raises(FencedError):
        quarantine_wave(tmp_path, 1, 0, 0, 10, {1, 2})
    assert not (tmp_path / "quarantine" / "_delta_log").exists()
    assert not list((tmp_path / "quarantine").rglob("*.parquet"))


def test_commits_after_a_version_are_read_from_the_new_log_files_only(tmp_path: Path) -> None:
    from modeswitch.sinks.commits import commits_after

    sink = tmp_path / "sink"
    assert commits_after(str(sink), "orders", -1) == ([], -1)
    write_wave(sink, 1, 0, {0: (0, 5)})
    write_wave(sink, 1, 1, {0: (5, 9)})
    found, version = commits_after(str(sink), "orders", -1)
    assert [(c.sequence, c.end, c.table_version) for c in found] == [(0, {0: 5}, 0), (1, {0: 9}, 1)]
    assert version == 1
    assert commits_after(str(sink), "orders", 1) == ([], 1)
    write_wave(sink, 1, 2, {0: (9, 12)})
    found, version = commits_after(str(sink), "orders", 1)
    assert [c.sequence for c in found] == [2] and version == 2
    assert commits_after(str(sink), "payments", -1) == ([], 2)  # another pipeline's commits


def test_commits_after_a_cleaned_log_start_at_the_oldest_file_and_a_caught_up_reader_lists_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modeswitch.sinks import commits, delta_log

    sink = tmp_path / "sink"
    for sequence in range(6):
        write_wave(sink, 1, sequence, {0: (sequence * 5, sequence * 5 + 5)})
    for version in range(4):  # what log cleanup does: the oldest files first
        (sink / "_delta_log" / f"{version:020d}.json").unlink()

    for mark in (-1, 1, 2):
        found, version = commits.commits_after(str(sink), "orders", mark)
        assert [c.table_version for c in found] == [4, 5] and version == 5

    def listing(*args: object) -> None:
        raise AssertionError("a reader at the newest version listed the whole log")

    monkeypatch.setattr(delta_log, "_oldest_log_version", listing)
    assert commits.commits_after(str(sink), "orders", 5) == ([], 5)


def test_max_event_time_per_bucket_of_batches_that_mix_buckets(tmp_path: Path) -> None:
    mixed = pa.Table.from_batches([rows(0, 0, 50), rows(1, 0, 80), rows(0, 50, 60)])
    shuffled = mixed.take(pa.array([(i * 37) % mixed.num_rows for i in range(mixed.num_rows)]))
    empty = rows(2, 0, 0)
    message = write_files(options(tmp_path / "sink"), iter([*shuffled.to_batches(50), empty]))
    assert message.records == 140
    assert message.max_event_time_us == {0: BASE_US + 59 * 1_000_123, 1: BASE_US + 79 * 1_000_123}


def test_writing_files_does_not_load_pyarrow_acero(tmp_path: Path) -> None:
    """A cold writer worker's first micro-batch must not pay for pyarrow's Acero engine and
    the pyarrow.dataset / pandas imports it drags in (a group-by did: ~1 s per worker)."""
    program = f"""
import sys
import pyarrow as pa
from modeswitch.sinks.delta import DeltaSinkOptions, write_files
batch = pa.RecordBatch.from_pydict(
    {{"bucket": pa.array([0, 1, 0], pa.int32()), "offset": pa.array([0, 0, 1], pa.int64()),
      "event_time": pa.array([1, 2, 3], pa.timestamp("us", tz="UTC"))}}
)
options = DeltaSinkOptions.parse(
    {{"path": {str(tmp_path / "sink")!r}, "pipeline": "p", "epoch": "1"}}
)
# (building the batch from Python lists may load pandas: pyarrow looks for it)
before = sorted(m for m in ("pyarrow.acero", "pandas") if m in sys.modules)
message = write_files(options, iter([batch]))
assert message.max_event_time_us == {{0: 3, 1: 2}}, message
print(before, sorted(m for m in ("pyarrow.acero", "pandas") if m in sys.modules))
"""
    result = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        check=True,
    )
    before, after = result.stdout.strip().split("\n")[-1].split(" ", 1)
    assert after == before, f"write_files loaded {after}, having {before}"
    assert "pyarrow.acero" not in after


def test_commits_of_one_process_load_the_table_once_and_see_other_writers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sink keeps its table open between commits (a micro-batch each) and brings it up to
    date, instead of loading it afresh: yet a commit made elsewhere in between still counts."""
    import deltalake

    sink = tmp_path / "sink"
    write_wave(sink, 1, 0, {0: (0, 10)})
    loads = []

    class CountingTable(deltalake.DeltaTable):
        def __init__(self, *args, **kwargs) -> None:
            loads.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(deltalake, "DeltaTable", CountingTable)
    write_wave(sink, 1, 1, {0: (10, 20)})
    write_wave(sink, 1, 2, {0: (20, 30)})
    assert loads.count(str(sink)) <= 1
    # Another process commits epoch 2; this process's next commit for epoch 1 is a zombie's.
    other = multiprocessing.get_context("spawn").Process(
        target=write_wave, args=(sink, 2, 0, {0: (30, 40)})
    )
    other.start()
    other.join(60)
    assert other.exitcode == 0
    with pytest.raises(FencedError):
        write_wave(sink, 1, 3, {0: (30, 40)})
    assert loads.count(str(sink)) <= 1
    assert committed_offsets(str(sink), "orders") == {0: 40}


def test_a_commit_with_keep_log_checkpoints_but_leaves_the_log_to_maintenance(
    tmp_path: Path,
) -> None:
    """What maintenance's and a backfill's commits to the sink pass: their checkpoint lies
    above the pipeline's newest commit, so their cleanup would delete it once old enough."""
    from deltalake import write_deltalake

    from modeswitch.sinks.commits import keep_log

    uri = str(tmp_path / "t")
    expiring = {"delta.logRetentionDuration": "interval 0 seconds", "delta.checkpointInterval": "2"}
    write_deltalake(uri, pa.table({"a": [0]}), configuration=expiring)
    for n in range(1, 4):
        row = pa.table({"a": [n]})
        write_deltalake(uri, row, mode="append", post_commithook_properties=keep_log())
    log_dir = Path(uri, "_delta_log")
    assert sorted(p.name for p in log_dir.glob("*.checkpoint.parquet"))  # checkpoints written
    assert len(list(log_dir.glob("*.json"))) == 4  # nothing cleaned
    write_deltalake(uri, pa.table({"a": [4]}), mode="append")  # a default commit cleans
    assert len(list(log_dir.glob("*.json"))) < 5


def test_the_sink_adds_new_columns_only_under_on_schema_change_evolve(tmp_path: Path) -> None:
    from modeswitch.control.settings import PipelineSettings
    from modeswitch.sinks.options import sink_options

    def merges(**values: str) -> bool:
        settings = PipelineSettings.from_mapping(
            {"pipeline": "p", "source": str(tmp_path / "log"), **values}
        )
        written = sink_options(settings, 1, "batch")
        return DeltaSinkOptions.parse({**written, "path": settings.sink}).merge_schema

    assert merges()  # evolve, the default
    assert not merges(on_schema_change="fail")
    assert not merges(on_schema_change="quarantine")
