"""Benchmark: the batch path and live latency on local[2] against a two-worker standalone
cluster on the same machine (the same two cores).

    .venv/bin/python bench/bench_cluster.py [--records 10000000] [--rounds 1]
        [--latency-seconds 60]

Each round runs ``bench/bench_modes.py --only a,latency`` twice, alternating: once with the
jobs on ``local[*]`` (two cores), once with ``MODESWITCH_SPARK_MASTER`` = a standalone
cluster started here (:class:`modeswitch.devtools.standalone.StandaloneCluster`: a master and two
workers of one core and 4 GB each, on loopback, stopped after). (a) is the batch job on a
batch epoch (records/s, wall, CPU, peak memory of the job's processes: on the cluster the
executors' JVMs and Python workers are the workers' children, not the job's, so its peak is
the driver's side only), ``latency`` a live stream at 5 000 records/s with a 100 ms trigger
after a batch epoch (p50/p99). Prints each run's figures and the cluster's ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from modeswitch.devtools.standalone import StandaloneCluster

BENCH_MODES = Path(__file__).with_name("bench_modes.py")


def bench_modes(records: int, latency_seconds: float, master: str | None) -> dict:
    env = dict(os.environ)
    if master:
        env["MODESWITCH_SPARK_MASTER"] = master
    what = ["--only", "a,latency", "--records", str(records)]
    done = subprocess.run(
        [sys.executable, str(BENCH_MODES), *what, "--latency-seconds", str(latency_seconds)],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"bench_modes on {master or 'local'} failed:\n{done.stderr[-4000:]}")
    found: dict = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            found["a"] = json.loads(line)
        elif line.startswith("live at"):
            found["latency"] = line
            found["p50_ms"], found["p99_ms"] = (
                int(re.search(rf"{p} (\d+) ms", line).group(1)) for p in ("p50", "p99")
            )
        elif line.startswith("handoff,"):
            found["handoff"] = line
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--latency-seconds", type=float, default=60)
    args = parser.parse_args(argv)
    results = []
    for number in range(args.rounds):
        local = bench_modes(args.records, args.latency_seconds, None)
        print(json.dumps({"round": number, "on": "local[*]", **local}), flush=True)
        work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
        with StandaloneCluster(work, workers=2, cores=1, memory="4g") as cluster:
            remote = bench_modes(args.records, args.latency_seconds, cluster.master_url)
        print(json.dumps({"round": number, "on": "standalone", **remote}), flush=True)
        results.append((local, remote))
    for local, remote in results:
        a, b = local["a"], remote["a"]
        print(
            f"(a) local {a['records'] / a['seconds']:,.0f} records/s in {a['seconds']:.1f} s, "
            f"cluster {b['records'] / b['seconds']:,.0f} records/s in {b['seconds']:.1f} s: "
            f"cluster/local wall x{b['seconds'] / a['seconds']:.2f}, CPU (driver side) "
            f"{a['cpu_seconds']:.0f} / {b['cpu_seconds']:.0f} s; live p50/p99 local "
            f"{local.get('p50_ms')}/{local.get('p99_ms')} ms, cluster "
            f"{remote.get('p50_ms')}/{remote.get('p99_ms')} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
