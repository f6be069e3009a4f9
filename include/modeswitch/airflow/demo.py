"""``make demo`` through Airflow: the pipeline DAG, one ``dag.test()`` run per epoch.

1. A local Airflow (SQLite) under ``<dir>/airflow``, migrated; the demo's settings as
   ``modeswitch_<setting>`` Variables; ``spark_default`` = ``local[*]``.
2. A skewed backlog and a live producer (as :mod:`modeswitch.devtools.demo`).
3. Four runs of ``modeswitch_pipeline``, each a child process (``dag.test()``, its log in
   ``<dir>/logs/airflow-run-N.log``): batch (the backlog) -> stream (a burst holds it back
   until its offset lag has stayed over the threshold for the dwell) -> batch (the burst)
   -> stream (15 s, set by the run's ``settings`` param; with the warm engine, the stream
   the engine started right after the batch keeps the demo's own ``max_stream_runtime``).
   The epochs run in the pipeline's warm engine (``engine = warm``,
   :mod:`modeswitch.runners.engine`):
   the first batch task starts it, and it hands each batch over to its stream itself.
4. A run of ``modeswitch_example_consumer`` (``dag.test()``): it reads every epoch's rows
   through the sink Asset's events (their extras name each epoch's offsets and versions).
5. The summary of :mod:`modeswitch.devtools.demo`: epochs, handoffs, records per mode, the audit.

Every process started here is stopped here: the producer thread is joined, each run's child
process group is killed if it overruns, and the engine (which outlives the runs) is stopped
by its process group at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from modeswitch.airflow.local import DAGS, airflow_environment, migrate
from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.demo import DEMO_SETTINGS, _summary, burst_later, demo_sources
from modeswitch.runners.engine import ENGINE_DIR_ENV, stop_engine
from modeswitch.runners.processes import run_process_group
from modeswitch.state import StateStore

DAG_ID = "modeswitch_pipeline"
CONSUMER_DAG_ID = "modeswitch_example_consumer"
RUN_TIMEOUT = 600.0
BURST_RECORDS = 400_000
BURST_AFTER_SECONDS = 10.0
"""Into run 2, whose stream the engine started at the batch's end: a few seconds live first."""
# The demo's settings, switching on offset lag (FLIP-328's second strategy): records behind
# the source's latest offsets. Unlike watermark lag, it does not depend on how fast this
# machine runs Airflow and Spark: the backlog and the burst are far above the threshold, the
# live producer (500 events/s) stays far below it. The watermark-lag strategy stays on, OR-ed,
# at 10 minutes.
AIRFLOW_DEMO_SETTINGS = {
    **DEMO_SETTINGS,
    # The epochs run in the pipeline's warm engine (modeswitch.runners.engine: the default,
    # auto, on the local master), started by the first epoch task and stopped at the demo's
    # end; MODESWITCH_DEMO_ENGINE=submit runs each epoch as its own spark-submit job instead.
    "engine": os.environ.get("MODESWITCH_DEMO_ENGINE", "auto"),
    "offset_lag_threshold": "100000",
    "watermark_lag_threshold": "10m",
    # The last stream: the run's 15 s param with spark-submit, this with the warm engine
    # (which starts the stream itself, before that run); the burst stops the first one.
    "max_stream_runtime": "15s",
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
    os.environ[ENGINE_DIR_ENV] = str(root / "engines")  # the engine's address, for its runs too
    env = airflow_environment(root / "airflow", variables=variables)
    console.rule("1. a local Airflow, a skewed backlog and a live producer")
    started = time.monotonic()
    migrate(env)
    console.print(
        f"Airflow (SQLite) under {env['AIRFLOW_HOME']}, DAGs from {DAGS}, spark_default "
        f"local[*], settings as {len(variables)} modeswitch_* Variables "
        f"({time.monotonic() - started:.1f} s)"
    )
    try:
        with demo_sources(settings, records=records, buckets=buckets, console=console) as log:
            console.rule(f"2. the {DAG_ID} DAG: one run per epoch (dag.test)")
            _run(env, root, 1, {}, settings, console, "drains the backlog up to its boundary")
            with burst_later(
                log, buckets, console, after=BURST_AFTER_SECONDS, records=BURST_RECORDS
            ):
                _run(env, root, 2, {}, settings, console, "from the batch's end, until a burst")
            _run(env, root, 3, {}, settings, console, "drains what the burst left")
            short = {"settings": {"max_stream_runtime": "15s"}}
            note = "live again, 15 s (run param; an epoch the engine started keeps its own)"
            _run(env, root, 4, short, settings, console, note)
    finally:
        if stop_engine(settings):
            console.print(f"stopped the pipeline's warm engine (log: {root}/engines)")
    _consume(env, root, console)
    return _summary(settings, console)


def _consume(env: dict[str, str], root: Path, console: Console) -> None:
    """A run of the downstream DAG on the sink's Asset (``dag.test()``, in a child): it reads
    the rows of every epoch the sink's Asset has an event for, through the events' extras."""
    console.rule(f"the downstream DAG {CONSUMER_DAG_ID}: each epoch through the sink's Asset")
    run_log = root / "logs" / "airflow-consumer.log"
    result = root / "logs" / "consumer.json"
    code = run_process_group(
        [sys.executable, "-m", "modeswitch.airflow.demo", "--run-consumer", str(result)],
        env=env,
        timeout=RUN_TIMEOUT,
        log_file=run_log,
    )
    if code != 0 or not result.exists():
        raise SystemExit(f"the {CONSUMER_DAG_ID} run failed (exit {code}); its log: {run_log}")
    read = json.loads(result.read_text())
    for epoch in read["epochs"]:
        console.print(
            f"  epoch {epoch['epoch']} ({epoch['mode']}): {epoch['rows']} rows read, "
            f"{epoch['records']} in its event"
        )
    console.print(f"  {read['rows']} rows in all (log: {run_log})")


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
    before = {e.id: e for e in store.epochs()}
    run_log = root / "logs" / f"airflow-run-{number}.log"
    started = time.monotonic()
    code = run_process_group(
        [sys.executable, "-m", "modeswitch.airflow.demo", "--run-dag", json.dumps(conf)],
        env=env,
        timeout=RUN_TIMEOUT,
        log_file=run_log,
    )
    seconds = time.monotonic() - started
    epochs = store.epochs()
    # The run's epoch: one it opened, or the one it re-attached (the warm engine opens a
    # stream epoch itself right after a batch; the next run attaches to it).
    attached = [e.id for e in before.values() if e.running]
    new = [e for e in epochs if e.id not in before]
    ran = [e for e in epochs if e.id in attached] or new[:1]
    if code != 0 or not ran:
        raise SystemExit(f"DAG run {number} failed (exit {code}); its log: {run_log}")
    epoch = ran[0]
    console.print(
        f"[bold]run {number} -> epoch {epoch.id}: {epoch.mode}[/bold] {note} ({seconds:.0f} s)\n"
        f"  ended: {epoch.status}, {epoch.end_reason}\n  log: {run_log}"
    )
    for handed in (e for e in new if e.id != epoch.id):
        console.print(f"  the engine handed off to {handed.mode} epoch {handed.id} at once")


def _test_dag(dag_id: str, conf: dict | None = None) -> Any:
    """In the child: one ``dag.test()`` run of ``dag_id``; None if its file does not load."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / f"{dag_id}.py"))
    if bag.import_errors:
        print(bag.import_errors, file=sys.stderr)
        return None
    return bag.dags[dag_id].test(run_conf=conf)


def _run_dag(conf: dict) -> int:
    """In the child: one ``dag.test()`` run of the pipeline DAG."""
    run = _test_dag(DAG_ID, conf)
    return 0 if run is not None and str(run.state) == "success" else 1


def _run_consumer(result: Path) -> int:
    """In the child: one ``dag.test()`` run of the consumer DAG; what its task returned, to
    ``result``."""
    run = _test_dag(CONSUMER_DAG_ID)
    if run is None or str(run.state) != "success":
        return 1
    task = "read_landed_rows"
    result.write_text(json.dumps(run.get_task_instance(task).xcom_pull(task_ids=task)))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--run-dag":
        sys.exit(_run_dag(json.loads(sys.argv[2])))
    if len(sys.argv) == 3 and sys.argv[1] == "--run-consumer":
        sys.exit(_run_consumer(Path(sys.argv[2])))
    sys.exit(
        run_airflow_demo(
            sys.argv[1] if len(sys.argv) > 1 else ".demo",
            records=1_000_000,
            buckets=16,
            console=Console(),
        )
    )
