"""Maintenance without Spark: tables written with deltalake as the sink writes them, then
compacted, their logs cleaned and vacuumed; the audit still finds every record once; the lease
lets one run at a time; progress past the horizon is merged without changing what it says."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pendulum
import pytest
from deltalake import DeltaTable
from fault_tools import commit_to_sink
from state_tools import warehouse_store
from test_verify import BUCKETS, PIPELINE, build

from modeswitch.cli import main
from modeswitch.control.setting_groups import MaintenanceSettings
from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import ConfigError, MaintenanceRefusedError, SinkLogCleanedError
from modeswitch.ops.maintenance import maintain, maintain_table
from modeswitch.ops.status import pipeline_status
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import decide
from modeswitch.sinks.history import LogSummary
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore, reconcile
from modeswitch.state.tables import SCHEMAS

pytestmark = pytest.mark.unit

# Many small waves: the small files and log entries a stream leaves.
SMALL_WAVES = [{0: (10 + 10 * i, 20 + 10 * i), 1: (10 * i, 10 + 10 * i)} for i in range(24)]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> SegmentLog:
    log = SegmentLog.create(str(tmp_path_factory.mktemp("maintain") / "log"), buckets=BUCKETS)
    generator = EventGenerator(seed=3, buckets=BUCKETS, malformed_fraction=0.1)
    produce_backlog(log, generator, records=1_600)
    return log


def settings_for(tmp_path: Path, log: SegmentLog, **maintenance: object) -> PipelineSettings:
    """The tests set the sink's log retention themselves (``log_retention`` none)."""
    return PipelineSettings(
        pipeline=PIPELINE,
        source=log.root,
        warehouse=str(tmp_path),
        sink=str(tmp_path / "sink"),
        quarantine=str(tmp_path / "quarantine"),
        maintenance=MaintenanceSettings(**{"log_retention": None, **maintenance}),
    )


EXPIRE_AT_ONCE = {"delta.logRetentionDuration": "interval 0 seconds"}
"""A sink whose log files expire at once: what a month of age does to the default's 30 days.
Set when the table is created: maintenance cleans the log as configured at the pipeline's
newest commit."""


def test_maintenance_compacts_cleans_and_vacuums_and_the_audit_still_holds(
    tmp_path: Path, log: SegmentLog
) -> None:
    tables = build(tmp_path, log, waves=SMALL_WAVES, configuration=EXPIRE_AT_ONCE)
    before = audit(log.root, tables.sink, tables.quarantine, PIPELINE)
    assert before.ok and before.sink_commits == 24
    rows_before = DeltaTable(tables.sink).to_pyarrow_table().num_rows
    settings = settings_for(tmp_path, log)
    store = StateStore.from_settings(settings)

    report = maintain(settings, store=store)

    sink = next(t for t in report.tables if t.table == "sink")
    assert (sink.files_before, sink.files_after) == (24, 1)
    assert DeltaTable(tables.sink).to_pyarrow_table().num_rows == rows_before
    log_files = sorted(p.name for p in (Path(tables.sink) / "_delta_log").glob("*.json"))
    assert log_files[0] != "00000000000000000000.json"  # the commits' log files are gone

    # The audit reads the run's summary in place of the cleaned commits.
    summaries = store.commands.log_summaries()
    assert [s.commits for s in summaries] == [24]
    after = audit(log.root, tables.sink, tables.quarantine, PIPELINE, summaries=summaries)
    assert after.ok, after.problems
    assert after.totals == before.totals
    assert after.sink_commits == 24
    # Without it, the audit says what it cannot see rather than miscounting.
    blind = audit(log.root, tables.sink, tables.quarantine, PIPELINE)
    assert any("were cleaned up" in p for p in blind.problems)
    # The command line finds the summaries in the pipeline's state.
    command = ["verify", "--log", log.root, "--sink", tables.sink]
    command += ["--quarantine", tables.quarantine, "--pipeline", PIPELINE]
    assert main([*command, "--state", settings.state_root]) == 0
    assert main([*command, "--state", str(tmp_path / "elsewhere")]) == 1
    # The command records the run, and the operator's view says what it did.
    command = store.commands.get(report.command)
    assert (command.kind, command.status) == ("maintain", "applied")
    store.epochs.open("batch", "backlog", {0: 0}, {0: 0})  # the view needs an epoch
    [shown] = [c for c in pipeline_status(settings)["commands"] if c["kind"] == "maintain"]
    assert "sink 24 -> 1 files" in shown["outcome"]
    assert "log_summary" not in shown["args"]
    # The compacted-away files go once they are older than the retention (0 h here, which
    # settings refuse; a run of its own, without a summary of the commits it cleans).
    vacuumed = maintain_table("sink", tables.sink, target_mb=128, vacuum_retention=timedelta(0))
    assert vacuumed is not None and vacuumed.vacuumed == 24
    assert DeltaTable(tables.sink).to_pyarrow_table().num_rows == rows_before


def test_maintenance_sets_the_log_and_tombstone_retentions(tmp_path: Path, log: SegmentLog) -> None:
    tables = build(tmp_path, log, waves=SMALL_WAVES[:3])
    settings = settings_for(
        tmp_path, log, log_retention=timedelta(hours=6), vacuum_retention=timedelta(hours=2)
    )

    store = StateStore.from_settings(settings)
    store.decisions.record("batch", "a progress row, a decision", {})

    maintain(settings, store=store)

    control = [
        store.tables.uri(n) for n in SCHEMAS if DeltaTable.is_deltatable(store.tables.uri(n))
    ]
    assert len(control) >= 2  # commands (the run's own) and decisions
    for uri in (tables.sink, tables.quarantine, *control):
        properties = DeltaTable(uri).metadata().configuration
        assert properties["delta.logRetentionDuration"] == "interval 21600 seconds", uri
        assert properties["delta.deletedFileRetentionDuration"] == "interval 14400 seconds", uri
    assert audit(log.root, tables.sink, tables.quarantine, PIPELINE).ok


def checkpoint_tombstones(uri: str) -> int:
    """The remove actions in the table's newest checkpoint: what every reader loads."""
    import json

    import pyarrow.parquet as pq

    version = json.loads(Path(uri, "_delta_log", "_last_checkpoint").read_text())["version"]
    removes = pq.read_table(Path(uri, "_delta_log", f"{version:020d}.checkpoint.parquet"))
    return sum(1 for action in removes.column("remove").to_pylist() if action)


@pytest.mark.parametrize(("retention", "tombstones"), [(timedelta(hours=1), 24), (timedelta(0), 0)])
def test_the_tombstone_retention_bounds_what_each_checkpoint_carries(
    tmp_path: Path, log: SegmentLog, retention: timedelta, tombstones: int
) -> None:
    """Compaction leaves a tombstone per small file; the checkpoints carry them until they
    are older than the retention maintenance sets (0 here, which settings refuse, to see them
    go without waiting an hour)."""
    tables = build(tmp_path, log, waves=SMALL_WAVES)

    maintain_table("sink", tables.sink, target_mb=128, vacuum_retention=retention)

    assert checkpoint_tombstones(tables.sink) == tombstones
    assert audit(log.root, tables.sink, tables.quarantine, PIPELINE).ok


def test_summaries_of_successive_runs_join(tmp_path: Path, log: SegmentLog) -> None:
    whole = build(tmp_path / "whole", log, waves=SMALL_WAVES)
    expected = audit(log.root, whole.sink, whole.quarantine, PIPELINE).totals
    tables = build(tmp_path, log, waves=SMALL_WAVES[:12], configuration=EXPIRE_AT_ONCE)
    settings = settings_for(tmp_path, log)
    store = StateStore.from_settings(settings)
    maintain(settings, store=store)
    build(tmp_path, log, waves=SMALL_WAVES[12:])  # the pipeline goes on
    maintain(settings, store=store)
    # The compacted-away files gone too (settings keep them an hour at least).
    DeltaTable(tables.sink).vacuum(0, dry_run=False, enforce_retention_duration=False)

    first, second = store.commands.log_summaries()
    assert second.after == first.through
    assert (first.commits, second.commits) == (12, 12)
    report = audit(
        log.root, tables.sink, tables.quarantine, PIPELINE, summaries=store.commands.log_summaries()
    )
    assert report.ok, report.problems
    assert report.totals == expected


def test_a_second_run_is_refused_while_the_first_holds_the_lease(tmp_path: Path) -> None:
    store = warehouse_store(str(tmp_path), PIPELINE, str(tmp_path / "sink"))
    lease = timedelta(hours=1)
    first = store.commands.claim_maintenance(run_id="a", issuer="test", lease=lease)

    with pytest.raises(MaintenanceRefusedError, match="holds the maintenance lease"):
        store.commands.claim_maintenance(run_id="b", issuer="test", lease=lease)
    assert (
        store.commands.claim_maintenance(run_id="a", issuer="test", lease=lease) == first
    )  # a retry

    # A lease older than its length was left by a run that died: the next run takes it.
    taken = store.commands.claim_maintenance(run_id="c", issuer="test", lease=timedelta(0))
    assert store.commands.get(first).status == "rejected"
    assert store.commands.get(taken).status == "running"
    assert not store.commands.note_run(first, step="compact")  # the superseded run learns it


def test_two_runs_at_once_one_maintains_and_no_row_is_doubled(
    tmp_path: Path, log: SegmentLog
) -> None:
    tables = build(tmp_path, log, waves=SMALL_WAVES)
    rows = DeltaTable(tables.sink).to_pyarrow_table().num_rows
    settings = settings_for(tmp_path, log)
    start = threading.Barrier(2)
    outcomes: list[object] = []

    def run() -> None:
        start.wait()
        try:
            outcomes.append(maintain(settings))
        except MaintenanceRefusedError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    refused = [o for o in outcomes if isinstance(o, MaintenanceRefusedError)]
    assert len(refused) == 1, outcomes
    assert DeltaTable(tables.sink).to_pyarrow_table().num_rows == rows
    assert audit(log.root, tables.sink, tables.quarantine, PIPELINE).ok


def test_progress_past_the_horizon_is_merged_and_says_the_same(tmp_path: Path) -> None:
    store = warehouse_store(str(tmp_path), PIPELINE, str(tmp_path / "sink"))
    epoch = store.epochs.open("stream", "live", {0: 0, 1: 0})
    for sequence in range(30):
        commit = commit_to_sink(
            store.tables.sink_table_uri, epoch, sequence, {0: 10 * sequence, 1: 5 * sequence},
            {0: 10 * sequence + 10, 1: 5 * sequence + 5}, mode="stream",
        )  # fmt: skip
        store.progress.record(commit)
    reconcile(store)
    summary, event_times = store.progress.epoch_summaries(epoch), store.epochs.max_event_times()
    assert summary[epoch]["commits"] == 30

    # Nothing is past a horizon of a day yet; all of it is past one of a second, an hour on.
    assert store.progress.downsample(timedelta(days=1)) == 0
    later = pendulum.now("UTC").add(hours=2)
    merged = store.progress.downsample(timedelta(seconds=1), now=later)

    rows = store.progress.list(epoch)
    assert merged == 30 - len(rows) and len(rows) <= 2
    assert sum(p.commits for p in rows) == 30
    assert rows[0].start == {0: 0, 1: 0} and rows[-1].end == {0: 300, 1: 150}
    assert store.progress.epoch_summaries(epoch)[epoch]["commits"] == 30
    assert store.progress.epoch_summaries(epoch)[epoch]["records"] == summary[epoch]["records"]
    assert store.epochs.max_event_times() == event_times
    assert not reconcile(store).repaired
    # A second run finds nothing new past the horizon.
    assert store.progress.downsample(timedelta(seconds=1), now=later) == 0
    # New commits are recorded as before.
    commit = commit_to_sink(
        store.tables.sink_table_uri, epoch, 30, {0: 300}, {0: 310}, mode="stream"
    )
    assert store.progress.record(commit)


def test_the_log_summary_folds_commits_in_order(tmp_path: Path, log: SegmentLog) -> None:
    tables = build(tmp_path, log)
    summary = LogSummary.read(tables.sink, PIPELINE, after=-1)
    assert (summary.after, summary.through, summary.commits) == (-1, 1, 2)
    assert summary.starts == {0: 10, 1: 0, 2: 5}
    assert summary.end == {0: 300, 1: 240, 2: 30}
    assert LogSummary.from_dict(summary.to_dict()) == summary
    assert LogSummary.read(tables.sink, PIPELINE, after=1).commits == 0


def test_retention_settings_are_bounded_and_named_when_refused() -> None:
    defaults = MaintenanceSettings()
    assert (defaults.log_retention, defaults.vacuum_retention) == (timedelta(hours=2),) * 2
    accepted = MaintenanceSettings.from_mapping({"log_retention": "10m", "vacuum_retention": "1h"})
    assert (accepted.log_retention, accepted.vacuum_retention) == (
        timedelta(minutes=10),
        timedelta(hours=1),
    )
    assert MaintenanceSettings.from_mapping({"log_retention": "none"}).log_retention is None
    with pytest.raises(ConfigError, match=r"log_retention: .* at least 0:10:00"):
        MaintenanceSettings.from_mapping({"log_retention": "9m"})
    with pytest.raises(ConfigError, match=r"vacuum_retention: .* less than 1:00:00"):
        MaintenanceSettings.from_mapping({"vacuum_retention": "59m"})


def test_a_pipeline_paused_past_the_log_retention_keeps_its_committed_offsets(
    tmp_path: Path, log: SegmentLog
) -> None:
    """Maintenance of an idle sink writes commits and a checkpoint above the pipeline's newest
    commit; once that commit's file is older than the retention, cleaning below the checkpoint
    deleted it, and the next decision started the pipeline over from offset 0 (every record
    again). The run cleans only below the newest commit; a file removed by another writer's
    cleanup is refused by name, never read as "nothing committed"."""
    # Expiring at once: hours of pause, against the 2 h retention.
    tables = build(tmp_path, log, waves=SMALL_WAVES[:3], configuration=EXPIRE_AT_ONCE)
    settings = settings_for(tmp_path, log)
    store = StateStore.from_settings(settings)
    committed = store.progress.committed_offsets()
    newest = DeltaTable(tables.sink).version()
    for _ in range(2):  # the second run's checkpoint lies above the first one's commits
        maintain(settings, store=store)

    newest_file = Path(tables.sink, "_delta_log", f"{newest:020d}.json")
    assert newest_file.exists()
    assert DeltaTable(tables.sink).version() > newest  # the runs' commits and checkpoints
    assert store.progress.committed_offsets() == committed == {0: 40, 1: 30}
    plan = decide(settings)
    assert {b: plan.start[b] for b in committed} == committed

    for version in range(newest + 1):  # another writer's cleanup
        Path(tables.sink, "_delta_log", f"{version:020d}.json").unlink(missing_ok=True)
    with pytest.raises(SinkLogCleanedError, match=r"epoch 1 sequence 2.*log cleanup removed"):
        store.progress.committed_offsets()
