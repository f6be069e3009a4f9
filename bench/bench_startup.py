"""Benchmark: Spark's start-up with and without the JVM class archive (modeswitch.runners.jvm).

    .venv/bin/python bench/bench_startup.py [--runs 2]

Each run is a fresh process: a session (``create_spark_session``), then the first streaming
micro-batch of a small ``bucketlog`` -> transform -> ``modeswitch_delta`` query (availableNow),
which is what a stream epoch waits for at a handoff. Runs alternate archive off / on
(``MODESWITCH_CDS``); the archive is made first if it is missing.

``--jars both`` also times sessions without the fetched jars (delta-spark, Spark's Kafka
source: ``jvm/pom.xml``) and without Delta's SQL extension and catalog, as every session was
before they came: each run then alternates with / without the jars, each with its own archive
(made first: the archive's name holds the jar list, so the two never share one).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from modeswitch.runners.jvm import ENV_SWITCH, make_archive

WITHOUT_JARS = """
import modeswitch.runners.jvm as _jvm, modeswitch.runners.session as _session
_jvm.fetched_jars = lambda: []
_session.DELTA_SPARK_CONF.clear()
"""
"""Prepended to a run's (or the archive's) program: a session as before the jars came."""

ONE_RUN = """
import json, sys, time
started = time.perf_counter()
if sys.argv[2] == "without":
    exec(sys.argv[3])
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


def archive_without_jars() -> str:
    """Make (if missing) the archive of a session without the fetched jars; its path."""
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT_JARS
            + "import os, subprocess, sys, uuid\n"
            + "from modeswitch.runners import jvm\n"
            + "path = jvm.archive_path()\n"
            + "if not path.is_file():\n"
            + "    path.parent.mkdir(parents=True, exist_ok=True)\n"
            + "    tmp = path.with_name(f'.{path.stem}.{uuid.uuid4().hex}.tmp')\n"
            + "    env = {**os.environ, jvm.ENV_SWITCH: 'off'}\n"
            + "    program = sys.argv[1] + jvm._WORKLOAD\n"
            + "    subprocess.run([sys.executable, '-c', program, str(tmp)], env=env, check=True,"
            + " capture_output=True, start_new_session=True)\n"
            + "    os.replace(tmp, path)\n"
            + "print(path)\n",
            WITHOUT_JARS,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return made.stdout.split()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--jars", choices=("with", "both"), default="with")
    args = parser.parse_args(argv)
    archive = make_archive()
    print(f"archive: {archive}")
    jar_cases = ("with",) if args.jars == "with" else ("with", "without")
    if "without" in jar_cases:
        print(f"archive without the jars: {archive_without_jars()}")
    print("| jars | archive | session (s) | session + first micro-batch (s) |")
    print("|---|---|---|---|")
    for number in range(args.runs):
        order = jar_cases if number % 2 == 0 else jar_cases[::-1]
        for jars in order:
            for switch in ("off", "on"):
                with tempfile.TemporaryDirectory(prefix="modeswitch-bench-startup-") as work:
                    result = subprocess.run(
                        [sys.executable, "-c", ONE_RUN, work, jars, WITHOUT_JARS],
                        env={**os.environ, ENV_SWITCH: switch},
                        capture_output=True,
                        text=True,
                        check=True,
                        start_new_session=True,
                    )
                session, first = result.stdout.split()[-2:]
                print(f"| {jars} | {switch} | {session} | {first} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
