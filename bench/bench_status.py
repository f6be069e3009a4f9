"""Benchmark: the operator's view on a pipeline that has run for weeks.

    .venv/bin/python bench/bench_status.py [--progress 200000] [--decisions 50000] [--calls 20]

Control tables as three weeks of switching leave them: ``--progress`` sink commits in 2 000
epochs (alternating batch and stream), ``--decisions`` policy evaluations with inputs the size
of real ones (8 buckets), written through the control tables' own codec in appends of 5 000
rows and then compacted as the tables' writer compacts them; a segment log of 8 buckets and a
sink whose newest commit ends where the progress table does. While it measures, a writer
thread records what a live stream job records, a decision and a sink commit's progress row
every 250 ms, through the state store (so the tables' own compaction runs too).

Measured: :func:`modeswitch.ops.status.pipeline_status` in this process; the app's
``/api/status``, ``/api/history`` and ``/api/decisions`` (FastAPI's test client, the
operator's app with Airflow's auth replaced by a no-op: in-process, no Airflow); and
``modeswitch status --json`` as a command (a new process each time, imports included).
Targets (issue 17): the status API p95 <= 300 ms, ``modeswitch status`` <= 1 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from modeswitch.control.settings import PipelineSettings
from modeswitch.sinks.delta import DeltaSinkOptions, commit_files, write_files
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore
from modeswitch.state.codec import decision_to_row, epoch_to_row, progress_to_row
from modeswitch.state.records import Epoch, Progress, RecordedDecision
from modeswitch.state.tables import SCHEMAS, Change, ControlTable, insert, rows_table
from modeswitch.transforms import QUARANTINE_REASON

BUCKETS = 8
EPOCHS = 2_000
CHUNK = 5_000


def decision_inputs(at: datetime, offsets: dict[int, int], mode: str) -> dict:
    """A decision's inputs, shaped and sized like ``Decision.to_record()``'s."""
    stamps = {str(b): (at - timedelta(seconds=b)).isoformat() for b in range(BUCKETS)}
    return {
        "mode": mode,
        "reason": "no backlog (watermark_lag: watermark lag 1.2s (held by bucket 3) at most 5m)",
        "switched": False,
        "state": {"mode": mode, "mode_since": at.isoformat(), "backlog_since": None},
        "previous": {"mode": mode, "mode_since": at.isoformat(), "backlog_since": None},
        "command": None,
        "signals": [
            {"strategy": s, "backlog": False, "reason": f"{s}: nothing behind"}
            for s in ("offset_boundary", "watermark_lag", "offset_lag", "combined")
        ],
        "watermark": {
            "state": "defined",
            "value": at.isoformat(),
            "lag_seconds": 1.2,
            "holding_bucket": 3,
            "idle_buckets": [],
        },
        "observation": {
            "now": at.isoformat(),
            "committed": {str(b): o for b, o in offsets.items()},
            "latest": {str(b): o + 10 for b, o in offsets.items()},
            "boundary": None,
            "max_event_time": stamps,
            "last_data_at": stamps,
        },
    }


def build(root: Path, progress_rows: int, decision_rows: int) -> PipelineSettings:
    """The log, the sink and the control tables of three weeks of running."""
    settings = PipelineSettings.from_mapping(
        {"pipeline": "weeks", "source": str(root / "log"), "warehouse": str(root / "warehouse")}
    )
    store = StateStore.from_settings(settings)
    began = datetime.now(UTC) - timedelta(days=21)
    step = timedelta(days=21) / progress_rows
    per_epoch = progress_rows // EPOCHS
    offsets = dict.fromkeys(range(BUCKETS), 0)
    epochs, progress, decisions = [], [], []
    for n in range(progress_rows):
        epoch, sequence = n // per_epoch + 1, n % per_epoch
        mode = "batch" if epoch % 2 else "stream"
        at = began + n * step
        start = dict(offsets)
        offsets[n % BUCKETS] += 1
        if sequence == 0:
            epochs.append([epoch, mode, at, start])
        progress.append(
            Progress(
                epoch=epoch,
                sequence=sequence,
                mode=mode,
                start=start,
                end=dict(offsets),
                records=1,
                max_event_time_us={b: int(at.timestamp() * 1e6) for b in range(BUCKETS)},
                watermark=at,
                committed_at=at,
                sink_version=n,
                recorded_at=at,
                recorded_by="sink",
            )
        )
        if n % (progress_rows // decision_rows) == 0 and len(decisions) < decision_rows:
            decisions.append(
                RecordedDecision(
                    at=at,
                    mode=mode,
                    reason="no backlog",
                    switched=sequence == 0,
                    inputs=decision_inputs(at, offsets, mode),
                    epoch=epoch,
                    decided_by=mode,
                )
            )
    epoch_rows = []
    for i, (epoch, mode, at, start) in enumerate(epochs):
        last = i == len(epochs) - 1
        end = None if last else epochs[i + 1][3]
        epoch_rows.append(
            epoch_to_row(
                Epoch(
                    id=epoch,
                    mode=mode,
                    reason="bench",
                    status="running" if last else "completed",
                    started_at=at,
                    start=start,
                    boundary=end if mode == "batch" else None,
                    ended_at=None if last else epochs[i + 1][2],
                    end=end,
                    end_reason=None if last else "bench",
                )
            )
        )
    for name, rows in (
        ("epochs", epoch_rows),
        ("progress", [progress_to_row(p) for p in progress]),
        ("decisions", [decision_to_row(d) for d in decisions]),
    ):
        table = ControlTable(name, store.tables.uri(name), SCHEMAS[name])
        for lo in range(0, len(rows), CHUNK):
            write_deltalake(
                table.uri, rows_table(SCHEMAS[name], rows[lo : lo + CHUNK]), mode="append"
            )
        table.compact(at_files=table.compact_at_files)  # as the tables' writer does
    log = SegmentLog.create(str(root / "log"), buckets=BUCKETS)
    for bucket, count in offsets.items():
        times = [began + timedelta(seconds=i) for i in range(count + 100)]
        log.append(
            bucket,
            pa.table(
                {"event_time": times, "key": [None] * len(times), "value": ["{}"] * len(times)}
            ),
        )
    # The sink's newest commit ends where the progress table does.
    last = progress[-1]
    options = DeltaSinkOptions.parse(
        {"path": settings.sink, "pipeline": "weeks", "epoch": str(last.epoch)}
    )
    batch = pa.RecordBatch.from_pydict(
        {
            "bucket": pa.array([0], pa.int32()),
            "offset": pa.array([last.end[0] - 1], pa.int64()),
            "event_time": pa.array([began], pa.timestamp("us", tz="UTC")),
            "key": pa.array([None], pa.string()),
            "value": pa.array(["{}"], pa.string()),
            QUARANTINE_REASON: pa.array([None], pa.string()),
        }
    )
    commit_files(
        options,
        batch.schema,
        [write_files(options, iter([batch]))],
        sequence=last.sequence,
        start=last.start,
        end=last.end,
    )
    return settings


class LiveWriter(threading.Thread):
    """What a live stream job records: a decision and a progress row every 250 ms."""

    def __init__(self, settings: PipelineSettings) -> None:
        super().__init__(daemon=True)
        self.store = StateStore.from_settings(settings)
        self.stop = threading.Event()
        self.writes = 0

    def run(self) -> None:
        table = self.store._table("progress")
        sequence = 10_000
        while not self.stop.wait(0.25):
            now = datetime.now(UTC)
            self.store.decisions.record("stream", "live", decision_inputs(now, {0: 1}, "stream"))
            row = progress_to_row(
                Progress(
                    epoch=EPOCHS,
                    sequence=sequence,
                    mode="stream",
                    start={0: 0},
                    end={0: 0},
                    records=0,
                    max_event_time_us={0: int(now.timestamp() * 1e6)},
                    watermark=now,
                    committed_at=now,
                    sink_version=None,
                    recorded_at=now,
                    recorded_by="bench",
                )
            )

            rows = rows_table(SCHEMAS["progress"], [row])
            table.transact("bench progress", lambda _, rows=rows: Change(None, insert(rows)))
            sequence += 1
            self.writes += 1


def operator_app(settings: PipelineSettings):
    """The operator's app for ``settings`` alone, with Airflow's auth replaced by a no-op (in
    process, no Airflow): for FastAPI's test client."""
    from fastapi import Depends

    from modeswitch.airflow.web import create_app

    layers = [("bench:", settings.to_mapping())]
    return create_app(
        layers=lambda: layers,
        access=Depends(lambda: None),
        commanding=Depends(lambda: "bench"),
        credentials=lambda _settings: contextlib.nullcontext({}),
    )


def timed(call, calls: int) -> list[float]:
    """Milliseconds of each of ``calls`` calls."""
    out = []
    for _ in range(calls):
        began = time.perf_counter()
        call()
        out.append((time.perf_counter() - began) * 1000)
    return out


def summary(name: str, ms: list[float]) -> str:
    ms = sorted(ms)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return f"| {name} | {len(ms)} | {statistics.median(ms):.0f} | {p95:.0f} | {ms[-1]:.0f} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--progress", type=int, default=200_000)
    parser.add_argument("--decisions", type=int, default=50_000)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--commands", type=int, default=5, help="`modeswitch status` runs")
    parser.add_argument("--keep", help="build the tables in this folder and keep them")
    args = parser.parse_args(argv)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-status-"))
    try:
        began = time.perf_counter()
        settings = build(root, args.progress, args.decisions)
        print(f"built in {time.perf_counter() - began:.0f} s under {root}", flush=True)
        from fastapi.testclient import TestClient

        from modeswitch.ops.status import pipeline_status

        app = operator_app(settings)
        config = root / "pipeline.json"
        config.write_text(json.dumps(settings.to_mapping()))
        command = [sys.executable, "-m", "modeswitch.cli", "status", "--config", str(config)]
        writer = LiveWriter(settings)
        writer.start()
        rows = ["| what | calls | p50 ms | p95 ms | max ms |", "|---|---|---|---|---|"]
        try:
            rows.append(
                summary("pipeline_status()", timed(lambda: pipeline_status(settings), args.calls))
            )
            with TestClient(app) as http:
                for route in ("status", "history", "decisions"):

                    def get(route=route) -> None:
                        assert http.get(f"/api/{route}").status_code == 200

                    rows.append(summary(f"GET /api/{route}", timed(get, args.calls)))
            rows.append(
                summary(
                    "modeswitch status --json (a new process)",
                    timed(
                        lambda: subprocess.run(
                            [*command, "--json"], check=True, capture_output=True
                        ),
                        args.commands,
                    ),
                )
            )
        finally:
            writer.stop.set()
            writer.join()
        print(f"the live writer recorded {writer.writes} decisions and progress rows meanwhile")
        print("\n".join(rows))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
