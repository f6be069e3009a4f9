"""The warehouse's storage fails under a running batch epoch: its filesystem fills up, or turns
read-only between two waves. The job fails with an error naming the file and the cause; what
was committed before stays, and no table is left half-written (every table opens, and every
file the sink references is there); once the storage is writable again, the epoch's retry
re-attaches and the pipeline converges to every record once.

The warehouse is a tmpfs of a few MB mounted by the test (as root) and unmounted after, even
when the test fails; the log lives elsewhere."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import ModeswitchError
from modeswitch.faults import ENV_FAULTS, ENV_MARKERS
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import run_job_process
from modeswitch.sinks.commits import sink_commits
from modeswitch.sources.segments import SegmentLog
from modeswitch.transforms.payload import EVENT_VALUE_SCHEMA

RECORDS = 1_500_000
"""About 40 MB of sink files: more than the small filesystem holds."""
FULL_SIZES = os.environ.get("MODESWITCH_STORAGE_FULL_SIZES", "24m").split(",")
"""The small filesystem's sizes, one run each: it fills up after more or fewer waves
(``make soak-faults`` tries several)."""
READ_ONLY_AFTER = [
    int(wave) for wave in os.environ.get("MODESWITCH_STORAGE_READ_ONLY_WAVES", "2").split(",")
]
"""The waves committed before the warehouse turns read-only, one run each."""


def _mount(folder: Path, options: str) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], check=True)


def _remount(folder: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(folder)], check=True)


@pytest.fixture
def warehouse(tmp_path: Path) -> Iterator[Path]:
    """An empty tmpfs at ``tmp_path/warehouse`` (its size set by each test), unmounted at the
    end."""
    if os.geteuid() != 0:
        pytest.skip("mounting the small filesystem needs root (CI runs as root)")
    folder = tmp_path / "warehouse"
    folder.mkdir()
    _mount(folder, "size=256m")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _settings(tmp_path: Path, warehouse: Path) -> PipelineSettings:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=4)
    generator = EventGenerator(seed=4, buckets=4, malformed_fraction=0.01)
    produce_backlog(log, generator, records=RECORDS)
    return PipelineSettings.from_mapping(
        {
            "pipeline": "stored",
            "source": log.root,
            "warehouse": str(warehouse),
            "wave_records": "150000",
            "max_split_records": "75000",
            "value_schema": EVENT_VALUE_SCHEMA,  # the demo's events, parsed: some quarantined
            "watermark_lag_threshold": "1h",
            "enter_threshold": "1h",
            "exit_threshold": "1h",
        }
    )


def _assert_intact(settings: PipelineSettings) -> list[tuple[int, int]]:
    """Every table opens and every file of the sink is there; what the sink committed is
    exactly once. Returns the committed (epoch, sequence) pairs."""
    sink = DeltaTable(settings.sink)
    for uri in sink.file_uris():
        assert Path(uri.removeprefix("file://")).is_file(), uri
    report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
    assert (report.totals.missing, report.totals.duplicated) == (0, 0), report
    return [(c.epoch, c.sequence) for c in sink_commits(settings.sink, settings.pipeline)]


def _converge(settings: PipelineSettings, epoch: int, log_file: Path) -> None:
    """The epoch's retry: decide re-attaches, the job runs again and completes."""
    again = decide(settings, decided_by="retry")
    assert (again.epoch, again.mode) == (epoch, "batch")
    run_job_process("batch", settings, epoch, timeout=600, log_file=log_file)
    assert close_epoch(settings, epoch)[0] == "completed"
    report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
    assert report.ok, report
    assert report.totals.expected == RECORDS
    assert report.totals.in_sink + report.totals.in_quarantine == RECORDS


@pytest.mark.parametrize("size", FULL_SIZES)
def test_a_warehouse_that_fills_up_fails_the_job_by_name_and_converges_once_freed(
    tmp_path: Path, warehouse: Path, size: str
) -> None:
    _remount(warehouse, f"size={size}")
    settings = _settings(tmp_path, warehouse)
    plan = decide(settings, force_mode="batch")
    failed_log = tmp_path / "full.log"
    with pytest.raises(ModeswitchError, match="exited with status"):
        run_job_process("batch", settings, plan.epoch, timeout=600, log_file=failed_log)
    output = failed_log.read_text()
    assert f"writing the data file {warehouse}/" in output
    assert "No space left on device" in output
    before = _assert_intact(settings)
    assert before  # some waves landed before the disk was full

    _remount(warehouse, "size=256m")  # space freed
    _converge(settings, plan.epoch, tmp_path / "retry.log")
    after = [(c.epoch, c.sequence) for c in sink_commits(settings.sink, settings.pipeline)]
    assert set(before) <= set(after)  # nothing committed was lost


@pytest.mark.parametrize("waves", READ_ONLY_AFTER)
def test_a_warehouse_turned_read_only_between_waves_fails_by_name_and_converges(
    tmp_path: Path, warehouse: Path, monkeypatch: pytest.MonkeyPatch, waves: int
) -> None:
    settings = _settings(tmp_path, warehouse)
    plan = decide(settings, force_mode="batch")
    markers = tmp_path / "markers"
    # The job waits 5 s after the commit of its wave ``waves``: the folder turns read-only.
    monkeypatch.setenv(ENV_FAULTS, f"batch.after_wave_commit=5@{waves}")
    monkeypatch.setenv(ENV_MARKERS, str(markers))

    def read_only_at_the_pause() -> None:
        deadline = time.monotonic() + 300
        while not any(markers.glob("batch.after_wave_commit.*")):
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)
        _remount(warehouse, "ro")

    turner = threading.Thread(target=read_only_at_the_pause, daemon=True)
    turner.start()
    failed_log = tmp_path / "read-only.log"
    try:
        with pytest.raises(ModeswitchError, match="exited with status"):
            run_job_process("batch", settings, plan.epoch, timeout=600, log_file=failed_log)
    finally:
        turner.join(timeout=310)
    output = failed_log.read_text()
    assert "Read-only file system" in output
    assert f"{warehouse}/" in output
    monkeypatch.delenv(ENV_FAULTS)
    before = _assert_intact(settings)
    assert len(before) == waves  # the waves before the pause

    _remount(warehouse, "rw")
    _converge(settings, plan.epoch, tmp_path / "retry.log")
    after = [(c.epoch, c.sequence) for c in sink_commits(settings.sink, settings.pipeline)]
    assert set(before) <= set(after)
