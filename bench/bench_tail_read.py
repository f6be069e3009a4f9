"""Benchmark: the read of a stream's first micro-batch after a batch, on the embedded log, alone.

The log is laid out as ``bench_modes.py --only latency`` lays it out: a backlog of 500 000
records in 16 buckets (Zipf 1.1), then the same appender producing live at 5 000 records/s,
flushing every 50 ms, for ``--seconds`` (the batch epoch's length). What is timed is
``SegmentLog.read_ranges`` from the backlog's end (the batch's boundary) to the log's latest,
in a fresh log object each round: the records the first micro-batch reads. Wall time and the
process's CPU time (pyarrow's threads included) per round; nothing else runs in the process.

    .venv/bin/python bench/bench_tail_read.py [--seconds 11] [--rounds 5]

Run it with another tree's code (``PYTHONPATH=OTHER/include``) to compare: the appender of the
code under test lays the log out.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import timedelta

from modeswitch.devtools.produce import EventGenerator, produce_backlog, produce_live
from modeswitch.sources.segments import SegmentLog

BUCKETS = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=11.0, help="live production before")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="modeswitch-bench-tail-") as scratch:
        log = SegmentLog.create(f"{scratch}/log", buckets=BUCKETS)
        produce_backlog(
            log, EventGenerator(seed=2, buckets=BUCKETS, skew="zipf:1.1"), records=500_000
        )
        start = log.latest_offsets()
        produce_live(
            log,
            EventGenerator(seed=3, buckets=BUCKETS, skew="zipf:1.1"),
            rate=5000.0,
            duration=timedelta(seconds=args.seconds),
            first=10_000_000,
            flush_every=timedelta(milliseconds=50),
        )
        latest = log.latest_offsets()
        ranges = [(b, start[b], latest[b]) for b in sorted(latest) if latest[b] > start[b]]
        files = sum(len(log.covering(b, s, e)) for b, s, e in ranges)
        print(f"{sum(e - s for _, s, e in ranges)} records in {files} segments")
        for round_ in range(1, args.rounds + 1):
            reader = SegmentLog(log.root)
            began, cpu = time.perf_counter(), time.process_time()
            records = sum(batch.num_rows for batch in reader.read_ranges(ranges))
            wall, cpu = time.perf_counter() - began, time.process_time() - cpu
            print(f"round {round_}: {records} records in {wall:.3f} s, {cpu:.3f} CPU-s")


if __name__ == "__main__":
    main()
