"""Benchmark: Spark's start-up with and without the JVM class archive (modeswitch.runners.jvm).

    .venv/bin/python bench/bench_startup.py [--runs 2]

Each run is a fresh process: a session (``create_spark_session``), then the first streaming
micro-batch of a small ``bucketlog`` -> transform -> ``modeswitch_delta`` query (availableNow),
which is what a stream epoch waits for at a handoff. Runs alternate archive off / on
(``MODESWITCH_CDS``); the archive is made first if it is missing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from modeswitch.runners.jvm import ENV_SWITCH, make_archive

ONE_RUN = """
import json, sys, time
started = time.perf_counter()
from modeswitch.runners.session import create_spark_session
from modeswitch.sources.segments import SegmentLog
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.transforms import load_transform
work = sys.argv[1]
log = SegmentLog.create(work + "/log", buckets=4)
produce_backlog(log, EventGenerator(seed=1, buckets=4), records=20_000)
spark = create_spark_session("bench-startup")
session = time.perf_counter()
start = json.dumps({str(b): 0 for b in range(4)})
stream = spark.readStream.format("bucketlog").option("startingOffsets", start).load(log.root)
query = (
    load_transform("modeswitch.transforms:parse_events")(stream)
    .withWatermark("event_time", "10 seconds")
    .writeStream.format("modeswitch_delta")
    .option("pipeline", "bench").option("epoch", "1").option("mode", "stream")
    .option("offsetsStart", start).option("quarantinePath", work + "/quarantine")
    .option("checkpointLocation", work + "/checkpoint").trigger(availableNow=True)
    .start(work + "/sink")
)
query.awaitTermination()
done = time.perf_counter()
print(f"{session - started:.2f} {done - started:.2f}")
spark.stop()
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)
    archive = make_archive()
    print(f"archive: {archive}")
    print("| archive | session (s) | session + first micro-batch (s) |")
    print("|---|---|---|")
    for _ in range(args.runs):
        for switch in ("off", "on"):
            with tempfile.TemporaryDirectory(prefix="modeswitch-bench-startup-") as work:
                result = subprocess.run(
                    [sys.executable, "-c", ONE_RUN, work],
                    env={**os.environ, ENV_SWITCH: switch},
                    capture_output=True,
                    text=True,
                    check=True,
                    start_new_session=True,
                )
            session, first = result.stdout.split()[-2:]
            print(f"| {switch} | {session} | {first} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
