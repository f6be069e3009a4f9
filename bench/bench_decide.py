"""Benchmark: the control plane's part of a hand-off, the warm engine's close and decide.

    .venv/bin/python bench/bench_decide.py [--rounds 3] [--commits 150] [--json FILE]

What :func:`modeswitch.runners.lifecycle.hand_off_to_stream` does between a batch's last wave
and its stream's query, in the engine's lane thread: ``close_epoch`` of the batch and
``decide(only="stream")`` (the sink's and the quarantine's table features checked, the control
state reconciled with the sink, the policy's inputs observed, the stream epoch opened and its
decision recorded). Each round builds a fresh state like the one the compose stack's second
hand-off meets: a batch epoch, a stream epoch of ``--commits`` micro-batch commits, a batch
epoch whose wave reached its boundary, and a pending ``switch_to_stream``. The sink's commits
are made by its own committer (:func:`modeswitch.sinks.delta.commit_files`), the state's
writes by the state store, all in this thread, as a lane's thread has read the tables before
its hand-off. No Spark, no Airflow. Reported: each round's hand-off and the median.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from modeswitch.control.settings import PipelineSettings
from modeswitch.runners.lifecycle import close_epoch, decide, hand_off_to_stream
from modeswitch.sinks.delta import DeltaSinkOptions, commit_files, write_files
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore
from modeswitch.transforms import QUARANTINE_REASON

PIPELINE = "orders"
BUCKETS = (0, 1)
PER_COMMIT = 5  # records per bucket in a stream commit
T0 = datetime(2026, 1, 1, tzinfo=UTC)
TIME = pa.timestamp("us", tz="UTC")


def commit(settings: PipelineSettings, epoch: int, sequence: int, ranges: dict) -> None:
    """One sink commit of the records of ``ranges`` ({bucket: (start, end)})."""
    options = DeltaSinkOptions.parse(
        {"path": settings.sink, "pipeline": PIPELINE, "epoch": str(epoch)}
    )
    positions = [(b, o) for b, (lo, hi) in sorted(ranges.items()) for o in range(lo, hi)]
    batch = pa.RecordBatch.from_pydict(
        {
            "bucket": pa.array([b for b, _ in positions], pa.int32()),
            "offset": pa.array([o for _, o in positions], pa.int64()),
            "event_time": pa.array([T0 + timedelta(seconds=o) for _, o in positions], TIME),
            "key": pa.array([f"k{o}" for _, o in positions], pa.string()),
            "value": pa.array([f'{{"n": {o}}}' for _, o in positions], pa.string()),
            QUARANTINE_REASON: pa.array([None] * len(positions), pa.string()),
        }
    )
    commit_files(
        options,
        batch.schema,
        [write_files(options, iter([batch]))],
        sequence=sequence,
        start={b: lo for b, (lo, _) in ranges.items()},
        end={b: hi for b, (_, hi) in ranges.items()},
    )


def one_round(folder: Path, commits: int) -> float:
    """Build the state, then time the hand-off (seconds)."""
    end = 1000 * (PER_COMMIT * commits // 1000 + 2)  # whole appends of 1 000, past the stream
    log = SegmentLog.create(str(folder / "log"), buckets=len(BUCKETS), open_segment_seconds=0)
    for bucket in BUCKETS:
        for lo in range(0, end, 1000):
            times = [T0 + timedelta(seconds=o) for o in range(lo, lo + 1000)]
            log.append(
                bucket,
                pa.table(
                    {
                        "event_time": times,
                        "key": [f"k{o}" for o in range(lo, lo + 1000)],
                        "value": [f'{{"n": {o}}}' for o in range(lo, lo + 1000)],
                    }
                ),
            )
    settings = PipelineSettings.from_mapping(
        {"pipeline": PIPELINE, "source": str(folder / "log"), "warehouse": str(folder / "wh")}
    )
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    first = store.epochs.open("batch", "bench", dict.fromkeys(BUCKETS, 0), {0: 500, 1: 500})
    commit(settings, first, 0, dict.fromkeys(BUCKETS, (0, 500)))
    close_epoch(settings, first)
    at = 500
    stream = store.epochs.open("stream", "bench", dict.fromkeys(BUCKETS, at), None)
    for sequence in range(commits):
        commit(settings, stream, sequence, dict.fromkeys(BUCKETS, (at, at + PER_COMMIT)))
        at += PER_COMMIT
    close_epoch(settings, stream)
    batch = decide(settings, force_mode="batch", decided_by="bench").epoch
    assert batch is not None
    commit(settings, batch, 0, dict.fromkeys(BUCKETS, (at, end)))
    store.commands.submit("switch_to_stream", {}, issuer="bench")
    started = time.perf_counter()
    opened = hand_off_to_stream(settings, batch, decided_by="bench")
    took = time.perf_counter() - started
    assert opened is not None and store.epochs.get(opened).start == dict.fromkeys(BUCKETS, end)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commits", type=int, default=150)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    seconds = []
    for _ in range(args.rounds):
        folder = Path(tempfile.mkdtemp(prefix="bench-decide-"))
        try:
            seconds.append(one_round(folder, args.commits))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    result = {
        "commits": args.commits,
        "hand_off_ms": [round(s * 1000, 1) for s in seconds],
        "median_ms": round(statistics.median(seconds) * 1000, 1),
    }
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
