"""Benchmark: a deployment of many pipelines, as Airflow parses it and as one pipeline decides.

    .venv/bin/python bench/bench_fleet_parse.py [--pipelines 50] [--rounds 5]

- **Parsing**: the DAG factory (``dags/modeswitch_pipelines.py``) with ``--pipelines`` settings
  files in its pipelines folder, parsed as the dag-processor parses a file: a new process
  that fills a ``DagBag`` from it and serializes every DAG (``DagSerialization.to_dict``),
  timed from the process's start (imports included) and, inside it, the bag and the
  serialization alone; it also lists the ``pyspark``/``py4j`` modules imported (none is the
  target). Target (issue 56): 50 pipeline files parse in <= 5 s, with no Spark import.
- **decide with 1 and with N pipelines**: ``decide_task`` (a dry run: settings from Variables,
  the Variables that tune nothing listed and logged, the decision; nothing written) for one
  pipeline, in a deployment of 1 pipeline file and of ``--pipelines``, each pipeline with
  three Variables of its own in Airflow's metadata database (a SQLite one made here; read as
  Airflow's servers read them), deployments alternating; medians. Target: the same cost with
  1 or 50.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FACTORY = REPO / "dags" / "modeswitch_pipelines.py"

PARSE = """
import json, sys, time
started = time.perf_counter()
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
imported = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
bagged = time.perf_counter()
for dag in bag.dags.values():
    DagSerialization.to_dict(dag)
done = time.perf_counter()
print(json.dumps({
    "dags": len(bag.dags), "errors": len(bag.import_errors),
    "imports": imported - started, "bag": bagged - imported, "serialize": done - bagged,
    "spark_modules": sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j")),
}))
"""


def write_pipelines(folder: Path, count: int, root: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.toml"):
        old.unlink()
    for n in range(count):
        (folder / f"topic{n:02d}.toml").write_text(
            f'source = "{root}/log"\nwarehouse = "{root}/warehouse"\n'
            f'enter_threshold = "{30 + n}s"\n'
        )


def parse_once(env: dict[str, str]) -> dict:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", PARSE, str(FACTORY)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["process"] = time.perf_counter() - started
    return figures


SETTER = """
import sys
from airflow.models.variable import Variable
from airflow.utils.session import create_session
with create_session() as session:
    session.query(Variable).delete()
for n in range(int(sys.argv[1])):  # three Variables of each pipeline's own
    for setting, value in (("exit_threshold", "5s"), ("max_stream_runtime", "5m"),
                           ("trigger_interval", "200ms")):
        Variable.set(f"modeswitch_topic{n:02d}_{setting}", value)
"""

DECIDE = """
import json, statistics, sys, time, logging
logging.disable(logging.WARNING)
from airflow.models.variable import Variable
from modeswitch.airflow.settings import deployment_fleet
from modeswitch.airflow.tasks import decide_task
rounds = int(sys.argv[1])
fleet = deployment_fleet()
pipeline = fleet.get("topic00")
times = []
for _ in range(rounds + 1):
    started = time.perf_counter()
    decide_task({"dry_run": True}, pipeline=pipeline, idle_wait=0)
    times.append(time.perf_counter() - started)
print(json.dumps({"pipelines": len(fleet.pipelines) - 1, "median": statistics.median(times[1:])}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        root = Path(tmp)
        folder = root / "pipelines"
        from modeswitch.devtools.produce import EventGenerator, produce_backlog
        from modeswitch.sources.segments import SegmentLog

        log = SegmentLog.create(str(root / "log"), buckets=4)
        produce_backlog(log, EventGenerator(seed=1, buckets=4), records=10_000)
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(root / "airflow"),
            "MODESWITCH_PIPELINES_DIR": str(folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        }
        write_pipelines(folder, args.pipelines, root)
        parses = [parse_once(env) for _ in range(args.rounds)]
        for figures in parses:
            print(
                f"parse {args.pipelines} pipeline files: {figures['dags']} DAGs, "
                f"{figures['errors']} import errors, process {figures['process']:.2f} s "
                f"(imports {figures['imports']:.2f} s, bag {figures['bag']:.2f} s, serialize "
                f"{figures['serialize']:.2f} s); Spark modules {figures['spark_modules']}"
            )
        print(
            f"parse median: process {statistics.median(p['process'] for p in parses):.2f} s, "
            f"bag + serialize {statistics.median(p['bag'] + p['serialize'] for p in parses):.2f} s"
        )

        airflow = Path(sys.executable).parent / "airflow"
        subprocess.run([str(airflow), "db", "migrate"], env=env, check=True, capture_output=True)
        # Variables read from the metadata database, as in Airflow's servers (a task reads them
        # through the API server, which reads the same database).
        env["_AIRFLOW_PROCESS_CONTEXT"] = "server"
        medians: dict[int, list[float]] = {1: [], args.pipelines: []}
        for _ in range(3):  # alternating deployments of 1 and N pipeline files
            for count in (1, args.pipelines):
                write_pipelines(folder, count, root)
                subprocess.run([sys.executable, "-c", SETTER, str(count)], env=env, check=True)
                done = subprocess.run(
                    [sys.executable, "-c", DECIDE, str(args.rounds)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                figures = json.loads(done.stdout.strip().splitlines()[-1])
                medians[count].append(figures["median"])
                print(f"decide (dry run) with {count} pipelines: median {figures['median']:.3f} s")
        for count, values in medians.items():
            median = statistics.median(values)
            print(f"decide with {count} pipelines: median of medians {median:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
