"""``modeswitch run --pipelines DIR``: several pipelines at once on one warm engine.

A folder of three settings files (three embedded logs, different sizes, skews and buckets),
run as a user runs it (``--until caught-up``): one engine serves all three, each pipeline's
epochs in a lane of its own (the engine's log names the lanes), each pipeline's Spark jobs in a
scheduler pool of its own; the engine is stopped at the end. Each pipeline's sink holds its
records exactly once. Isolation: with a fourth pipeline whose source is gone, the three others
still run to 0 missing / 0 duplicated, and the command fails naming the broken one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import psutil

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.ops.verify import audit
from modeswitch.runners.engine import ENGINE_DIR_ENV, SHARED_FILE, EngineAddress, stop_engines_in
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore

MODESWITCH = str(Path(sys.executable).parent / "modeswitch")

FLEET = {  # pipeline: (buckets, records, skew)
    "orders": (4, 40_000, "zipf:1.2"),
    "clicks": (2, 15_000, "uniform"),
    "payments": (3, 5_000, "zipf:1.5"),
}


def pipelines_folder(tmp_path: Path, fleet: dict) -> Path:
    folder = tmp_path / "pipelines"
    folder.mkdir()
    for name, (buckets, records, skew) in fleet.items():
        log = SegmentLog.create(str(tmp_path / name / "log"), buckets=buckets)
        generator = EventGenerator(
            seed=len(name), buckets=buckets, skew=skew, malformed_fraction=0.01
        )
        produce_backlog(log, generator, records=records, span=timedelta(hours=1))
        config = {
            "source": str(tmp_path / name / "log"),
            "warehouse": str(tmp_path / name / "warehouse"),
            "engine": "warm",
            "wave_records": "20000",
            "max_split_records": "10000",
            "watermark_lag_threshold": "1h",
            "enter_threshold": "1h",
            "exit_threshold": "30m",
            "min_time_in_stream": "0s",
        }
        (folder / f"{name}.json").write_text(json.dumps(config))
    return folder


def settings_of(folder: Path, name: str) -> PipelineSettings:
    return PipelineSettings.from_mapping(
        {**json.loads((folder / f"{name}.json").read_text()), "pipeline": name}
    )


def run_fleet(folder: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    engines = tmp_path / "engines"
    try:
        return subprocess.run(
            [MODESWITCH, "run", "--pipelines", str(folder), "--until", "caught-up"],
            capture_output=True,
            text=True,
            timeout=900,
            env={**_environ(), ENGINE_DIR_ENV: str(engines)},
        )
    finally:
        stop_engines_in(engines)  # only if the command left it: it stops what it started


def _environ() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "MODESWITCH_ENGINE_SHARING"}


def engines_left(tmp_path: Path) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any("jobs/engine.py" in part for part in (p.info["cmdline"] or []))
        and str(tmp_path) in " ".join(p.info["cmdline"] or [])
    ]


def test_three_pipelines_run_together_on_one_engine_and_a_broken_fourth_stops_alone(
    tmp_path: Path,
) -> None:
    folder = pipelines_folder(tmp_path, {**FLEET, "broken": (2, 1_000, "uniform")})
    shutil.rmtree(tmp_path / "broken" / "log")  # its source is down
    run = run_fleet(folder, tmp_path)
    told = run.stdout + run.stderr
    assert run.returncode != 0 and "pipeline 'broken'" in told, told[-3000:]
    engine_logs = list((tmp_path / "engines").glob("*.log"))
    assert [p.name for p in engine_logs] == [SHARED_FILE.replace(".json", ".log")]
    text = engine_logs[0].read_text()
    for name in FLEET:
        assert f"{name}: epoch 1: batch" in run.stdout, run.stdout
        assert f"a lane for pipeline {name}" in text or f"engine of pipeline {name}" in text
        settings = settings_of(folder, name)
        epochs = StateStore.from_settings(settings).epochs.list()
        assert [e.mode for e in epochs[:2]] == ["batch", "stream"], name
        assert epochs[1].start == epochs[0].end, name  # the exact handoff
        report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
        assert report.ok and report.totals.missing == 0 and report.totals.duplicated == 0, report
        assert report.totals.expected == FLEET[name][1], name
    assert engines_left(tmp_path) == [], "the shared engine outlived modeswitch run"
    assert EngineAddress.read(tmp_path / "engines" / SHARED_FILE) is None
