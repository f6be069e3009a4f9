"""``make demo`` through Airflow: the pipeline DAG, one ``dag.test()`` run per epoch.

1. A local Airflow (SQLite) under ``<dir>/airflow``, migrated; the demo's settings as
   ``modeswitch_<setting>`` Variables; ``spark_default`` = ``local[*]``.
2. A skewed backlog and a live producer (as :mod:`modeswitch.demo`).
3. Four runs of ``modeswitch_pipeline``, each a child process (``dag.test()``, its log in
   ``<dir>/logs/airflow-run-N.log``): batch (the backlog) -> stream (a burst holds it back
   until its offset lag has stayed over the threshold for the dwell) -> batch (the burst)
   -> stream (20 s, set by the run's ``settings`` param).
4. The summary of :mod:`modeswitch.demo`: epochs, handoffs, records per mode, the audit.

Every process started here is stopped here: the producer thread is joined, each run's child
process group is killed if it overruns.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from rich.console import Console

from modeswitch.airflow.local import DAGS, airflow_environment, migrate
from modeswitch.config import PipelineSettings
from modeswitch.demo import DEMO_SETTINGS, _summary, burst_later, demo_sources
from modeswitch.processes import run_process_group
from modeswitch.state import StateStore

DAG_ID = "modeswitch_pipeline"
RUN_TIMEOUT = 600.0
BURST_RECORDS = 400_000
BURST_AFTER_SECONDS = 20.0
# The demo's settings, switching on offset lag (FLIP-328's second strategy): records behind
# the source's latest offsets. Unlike watermark lag, it does not depend on how fast this
# machine runs Airflow and Spark: the backlog and the burst are far above the threshold, the
# live producer (500 events/s) stays far below it. The watermark-lag strategy stays on, OR-ed,
# at 10 minutes.
AIRFLOW_DEMO_SETTINGS = {
    **DEMO_SETTINGS,
    "offset_lag_threshold": "100000",
    "watermark_lag_threshold": "10m",
    "enter_threshold": "none",
    "exit_threshold": "none",
}


def run_airflow_demo(directory: str, *, records: int, buckets: int, console: Console) -> int:
    root = Path(directory).resolve()
    shutil.rmtree(root, ignore_errors=True)
    (root / "logs").mkdir(parents=True)
    variables = {
        **AIRFLOW_DEMO_SETTINGS,
        "source": str(root / "log"),
        "warehouse": str(root / "warehouse"),
    }
    settings = PipelineSettings.from_mapping(variables)
    env = airflow_environment(root / "airflow", variables=variables)
    console.rule("1. a local Airflow, a skewed backlog and a live producer")
    started = time.monotonic()
    migrate(env)
    console.print(
        f"Airflow (SQLite) under {env['AIRFLOW_HOME']}, DAGs from {DAGS}, spark_default "
        f"local[*], settings as {len(variables)} modeswitch_* Variables "
        f"({time.monotonic() - started:.1f} s)"
    )
    with demo_sources(settings, records=records, buckets=buckets, console=console) as log:
        console.rule(f"2. the {DAG_ID} DAG: one run per epoch (dag.test)")
        _run(env, root, 1, {}, settings, console, "drains the backlog up to its boundary")
        with burst_later(log, buckets, console, after=BURST_AFTER_SECONDS, records=BURST_RECORDS):
            _run(env, root, 2, {}, settings, console, "from the batch's end, until a burst")
        _run(env, root, 3, {}, settings, console, "drains what the burst left")
        short = {"settings": {"max_stream_runtime": "20s"}}
        _run(env, root, 4, short, settings, console, "live again for 20 s (run param settings)")
    return _summary(settings, console)


def _run(
    env: dict[str, str],
    root: Path,
    number: int,
    conf: dict,
    settings: PipelineSettings,
    console: Console,
    note: str,
) -> None:
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    before = {e.id for e in store.epochs()}
    run_log = root / "logs" / f"airflow-run-{number}.log"
    started = time.monotonic()
    code = run_process_group(
        [sys.executable, "-m", "modeswitch.airflow.demo", "--run-dag", json.dumps(conf)],
        env=env,
        timeout=RUN_TIMEOUT,
        log_file=run_log,
    )
    new = [e for e in store.epochs() if e.id not in before]
    seconds = time.monotonic() - started
    if code != 0 or not new:
        raise SystemExit(f"DAG run {number} failed (exit {code}); its log: {run_log}")
    epoch = new[-1]
    console.print(
        f"[bold]run {number} -> epoch {epoch.id}: {epoch.mode}[/bold] {note} ({seconds:.0f} s)\n"
        f"  ended: {epoch.status}, {epoch.end_reason}\n  log: {run_log}"
    )


def _run_dag(conf: dict) -> int:
    """In the child: one ``dag.test()`` run of the pipeline DAG."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / f"{DAG_ID}.py"))
    if bag.import_errors:
        print(bag.import_errors, file=sys.stderr)
        return 1
    run = bag.dags[DAG_ID].test(run_conf=conf)
    return 0 if str(run.state) == "success" else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--run-dag":
        sys.exit(_run_dag(json.loads(sys.argv[2])))
    sys.exit(
        run_airflow_demo(
            sys.argv[1] if len(sys.argv) > 1 else ".demo",
            records=1_000_000,
            buckets=16,
            console=Console(),
        )
    )
