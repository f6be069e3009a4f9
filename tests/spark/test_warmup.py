"""Warming the Python workers (modeswitch.warmup): a stream's first micro-batch then starts
no Python worker of its own but its source runner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from deltalake import DeltaTable

from modeswitch.produce import EventGenerator, produce_backlog
from modeswitch.sources.segments import SegmentLog
from modeswitch.warmup import start_worker_warmup

PROGRAM = Path(__file__).parent / "programs" / "warm_then_stream.py"
PER_QUERY = "python_streaming_source_runner"
"""The one Python process each streaming query starts for itself (not pooled)."""


def test_the_warm_up_streams_through_bucketlog_and_the_sink_and_removes_its_scratch(
    spark, tmp_path: Path
) -> None:
    scratch = tmp_path / "warmup"
    warmup = start_worker_warmup(spark, str(scratch), tasks=2)
    assert warmup is not None
    assert warmup.wait(120)
    assert warmup.error is None
    assert warmup.seconds is not None
    assert sum(p["numInputRows"] for p in warmup.query.recentProgress) == 2
    assert not warmup.query.isActive
    assert not scratch.exists()


def test_after_a_warm_up_a_stream_starts_no_python_worker_but_its_source_runner(
    tmp_path: Path,
) -> None:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=2)
    produce_backlog(log, EventGenerator(seed=5, buckets=2), records=2_000)
    result = subprocess.run(
        [
            sys.executable,
            str(PROGRAM),
            *("--log", log.root, "--sink", str(tmp_path / "sink")),
            *("--checkpoint", str(tmp_path / "checkpoint"), "--scratch", str(tmp_path / "w")),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    started = json.loads(result.stdout.strip().splitlines()[-1])
    assert [cmd for cmd in started if PER_QUERY not in cmd] == []
    assert DeltaTable(str(tmp_path / "sink")).to_pyarrow_table().num_rows == 2_000
