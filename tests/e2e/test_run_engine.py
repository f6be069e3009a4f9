"""``modeswitch run`` on the warm engine: ``engine = "warm"`` works without Airflow.

The command, as a user runs it (a settings file, ``--until caught-up``), starts the
pipeline's engine (one Spark application on the local master, in its own process group),
runs a batch epoch on it that the engine hands over to its stream epoch itself, and stops the
engine before it exits. Every record is in the sink or the quarantine exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import psutil
import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.ops.verify import audit
from modeswitch.runners.engine import (
    ENGINE_DIR_ENV,
    EngineAddress,
    engine_file,
    engine_scratch,
    ensure_engine,
    start_local_engine,
    stop_engine,
)
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore

MODESWITCH = str(Path(sys.executable).parent / "modeswitch")


def test_modeswitch_run_on_the_warm_engine_hands_off_inside_it_and_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=4)
    produce_backlog(
        log,
        EventGenerator(seed=3, buckets=4, malformed_fraction=0.01),
        records=60_000,
        span=timedelta(hours=1),
    )
    config = {
        "pipeline": "warm",
        "source": str(tmp_path / "log"),
        "warehouse": str(tmp_path / "warehouse"),
        "engine": "warm",
        "wave_records": "20000",
        "max_split_records": "10000",
        "watermark_lag_threshold": "1h",
        "enter_threshold": "1h",
        "exit_threshold": "30m",
        "min_time_in_stream": "0s",
    }
    (tmp_path / "settings.json").write_text(json.dumps(config))
    monkeypatch.setenv(ENGINE_DIR_ENV, str(tmp_path / "engines"))
    settings = PipelineSettings.from_mapping(config)
    engine_pids: list[int] = []
    try:
        run = subprocess.run(
            [
                MODESWITCH,
                "run",
                "--config",
                str(tmp_path / "settings.json"),
                "--until",
                "caught-up",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert "epoch 1: batch" in run.stdout and "epoch 2: stream" in run.stdout, run.stdout

        store = StateStore.from_settings(settings)
        epochs = {e.id: e for e in store.epochs.list()}
        assert [epochs[1].mode, epochs[2].mode] == ["batch", "stream"]
        assert epochs[2].start == epochs[1].end  # the exact handoff
        # The engine handed the batch over to its stream itself.
        opened = [(d.decided_by, d.mode) for d in store.decisions.list() if d.switched]
        assert opened == [("engine", "stream"), ("modeswitch run", "batch")], opened

        # The engine's log shows it ran both epochs; it is gone, its address file too.
        engine_logs = list((tmp_path / "engines").glob("*.log"))
        assert engine_logs and "running stream epoch 2" in engine_logs[0].read_text()
        assert not engine_file(settings).exists()
        pids = [
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if any("jobs/engine.py" in part for part in (p.info["cmdline"] or []))
            and str(tmp_path) in " ".join(p.info["cmdline"] or [])
        ]
        engine_pids.extend(pids)
        assert pids == [], "the engine outlived modeswitch run"

        report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
        assert report.ok, report
        assert report.totals.missing == 0 and report.totals.duplicated == 0
    finally:
        address = EngineAddress.read(engine_file(settings))
        if address is not None or engine_pids:
            stop_engine(settings)


def test_the_engine_keeps_its_spark_scratch_beside_its_address_and_it_goes_with_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark's local dirs and the JVM's temporary files (native libraries it unpacks) are in
    the engine's scratch folder, not the machine's ``/tmp``; a SIGKILLed engine's are removed
    when the next engine starts, and the folder when the engine is stopped."""
    monkeypatch.setenv(ENGINE_DIR_ENV, str(tmp_path / "engines"))
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "scratch",
            "source": str(SegmentLog.create(str(tmp_path / "log"), buckets=2).root),
            "warehouse": str(tmp_path / "warehouse"),
            "engine": "warm",
        }
    )
    path = engine_file(settings)
    scratch = engine_scratch(path)
    start = start_local_engine(settings, log_dir=tmp_path / "logs")
    try:
        first = ensure_engine(settings, start)
        jvm = [p for p in psutil.Process(first.pid).children(recursive=True) if "java" in p.name()]
        assert jvm and f"-Djava.io.tmpdir={scratch}" in " ".join(jvm[0].cmdline())
        left = {p.name for p in scratch.iterdir()}
        assert any(name.startswith("blockmgr-") for name in left), left  # Spark's local dir

        os.killpg(first.pgid, signal.SIGKILL)  # what it left stays, until the next start
        psutil.wait_procs([psutil.Process(first.pid)], timeout=10)
        assert left <= {p.name for p in scratch.iterdir()}
        second = ensure_engine(settings, start)
        assert second.pid != first.pid
        assert not left & {p.name for p in scratch.iterdir()}, "the dead engine's scratch stayed"
    finally:
        stop_engine(settings)
    assert not scratch.exists()
