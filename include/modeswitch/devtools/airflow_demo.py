"""``make demo`` through Airflow: the pipeline DAG, one ``dag.test()`` run per epoch.

1. A local Airflow (SQLite) under ``<dir>/airflow``, migrated; the demo's settings as
   ``modeswitch_<setting>`` Variables; ``spark_default`` = ``local[*]``.
2. A skewed backlog and a live producer (as :mod:`modeswitch.devtools.demo`).
3. Four runs of ``modeswitch_pipeline`` (``dag.test()``, each run's log in
   ``<dir>/logs/airflow-run-N.log``), one after the other in one child process that imports
   Airflow once (:class:`DagRuns`): batch (the backlog) -> stream (a burst holds it back
   until its offset lag has stayed over the threshold for the dwell) -> batch (the burst)
   -> stream (15 s, set by the run's ``settings`` param; with the warm engine, the stream
   the engine started right after the batch keeps the demo's own ``max_stream_runtime``).
   The epochs run in the pipeline's warm engine (``engine = warm``,
   :mod:`modeswitch.runners.engine`):
   the first batch task starts it, and it hands each batch over to its stream itself.
4. A run of ``modeswitch_example_consumer`` (``dag.test()``): it reads every epoch's rows
   through the sink Asset's events (their extras name each epoch's offsets and versions).
5. The demo's summary (:func:`modeswitch.devtools.demo.print_summary`): epochs, handoffs,
   records per mode, the audit.

Every process started here is stopped here: the producer thread is joined, the child's
process group is stopped at the end (killed if a run overruns), and the engine (which
outlives the runs) is stopped by its process group at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.airflow_local import DAGS, airflow_environment, migrate
from modeswitch.devtools.demo import DEMO_SETTINGS, burst_later, demo_sources, print_summary
from modeswitch.environment import DEMO_ENGINE, env_value
from modeswitch.runners.engine import ENGINE_DIR_ENV, stop_engine
from modeswitch.runners.processes import kill_group, start_group, stop_group
from modeswitch.state import StateStore

DAG_ID = "modeswitch_pipeline"
FACTORY = "modeswitch_pipelines.py"
"""The DAG file that declares every pipeline's DAGs."""
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
    "engine": env_value(DEMO_ENGINE),
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
    with DagRuns(env, root / "logs" / "airflow.log") as runs:
        try:
            with demo_sources(settings, records=records, buckets=buckets, console=console) as log:
                console.rule(f"2. the {DAG_ID} DAG: one run per epoch (dag.test)")
                _run(runs, root, 1, {}, settings, console, "drains the backlog up to its boundary")
                with burst_later(
                    log, buckets, console, after=BURST_AFTER_SECONDS, records=BURST_RECORDS
                ):
                    _run(
                        runs, root, 2, {}, settings, console, "from the batch's end, until a burst"
                    )
                _run(runs, root, 3, {}, settings, console, "drains what the burst left")
                short = {"settings": {"max_stream_runtime": "15s"}}
                note = "live again, 15 s (run param; an epoch the engine started keeps its own)"
                _run(runs, root, 4, short, settings, console, note)
        finally:
            if stop_engine(settings):
                console.print(f"stopped the pipeline's warm engine (log: {root}/engines)")
        _consume(runs, root, console)
    return print_summary(settings, console)


class DagRuns:
    """One child process, in its own process group, that runs DAGs with ``dag.test()`` one
    request at a time: Airflow is imported and set up once for the demo's five runs instead
    of once a run (about 6 s each here). Each run's output goes to its own log file; what the
    child prints between runs goes to ``log_file``. The group is stopped on leaving, and
    killed when a run overruns."""

    def __init__(self, env: dict[str, str], log_file: Path) -> None:
        self._env = env
        self._log_file = log_file
        self._process: subprocess.Popen | None = None
        self._replies = -1

    def __enter__(self) -> DagRuns:
        read, write = os.pipe()
        serve = [sys.executable, "-m", "modeswitch.devtools.airflow_demo", "--serve", str(write)]
        try:
            with open(self._log_file, "ab") as output:
                self._process = start_group(
                    serve,
                    self._env,
                    output,
                    stdin=subprocess.PIPE,
                    pass_fds=(write,),
                )
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        self._replies = read
        return self

    def __exit__(self, *exc: object) -> None:
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()  # the child's loop ends
            stop_group(process, grace=10.0)
        os.close(self._replies)

    def run(self, dag_id: str, log_file: Path, conf: dict | None = None, **extra: str) -> int:
        """One ``dag.test()`` run of ``dag_id``: 0 when it succeeded (its output in
        ``log_file``); the child's exit status, negative, when it died."""
        process = self._process
        request = {"dag": dag_id, "conf": conf or {}, "log": str(log_file), **extra}
        process.stdin.write(json.dumps(request).encode() + b"\n")
        process.stdin.flush()
        reply = b""
        deadline = time.monotonic() + RUN_TIMEOUT
        while not reply.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._replies], [], [], left)[0]:
                kill_group(process)
                raise SystemExit(
                    f"the {dag_id} run overran {RUN_TIMEOUT:.0f} s; its log: {log_file}"
                )
            chunk = os.read(self._replies, 4096)
            if not chunk:  # the child died
                return -abs(process.wait() or 1)
            reply += chunk
        return int(json.loads(reply)["code"])


def _consume(runs: DagRuns, root: Path, console: Console) -> None:
    """A run of the downstream DAG on the sink's Asset (``dag.test()``, in a child): it reads
    the rows of every epoch the sink's Asset has an event for, through the events' extras."""
    console.rule(f"the downstream DAG {CONSUMER_DAG_ID}: each epoch through the sink's Asset")
    run_log = root / "logs" / "airflow-consumer.log"
    result = root / "logs" / "consumer.json"
    code = runs.run(CONSUMER_DAG_ID, run_log, result=str(result))
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
    runs: DagRuns,
    root: Path,
    number: int,
    conf: dict,
    settings: PipelineSettings,
    console: Console,
    note: str,
) -> None:
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    before = {e.id: e for e in store.epochs.list()}
    run_log = root / "logs" / f"airflow-run-{number}.log"
    started = time.monotonic()
    code = runs.run(DAG_ID, run_log, conf)
    seconds = time.monotonic() - started
    epochs = store.epochs.list()
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

    own = DAGS / f"{dag_id}.py"  # an example's file, else the pipelines' factory
    bag = DagBag(dag_folder=str(own if own.exists() else DAGS / FACTORY))
    if bag.import_errors:
        print(bag.import_errors, file=sys.stderr)
        return None
    return bag.dags[dag_id].test(run_conf=conf)


def _run_dag(dag_id: str, conf: dict) -> int:
    """In the child: one ``dag.test()`` run of a pipeline DAG."""
    run = _test_dag(dag_id, conf)
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


def _serve(reply_fd: int) -> int:
    """In the child: run each request read from standard input (one JSON line: the DAG, its
    run conf, the run's log file, the consumer's result file), its output to its log file;
    answer each on ``reply_fd`` with the run's status, 0 for success."""
    with os.fdopen(reply_fd, "w") as replies:
        for line in sys.stdin:
            request = json.loads(line)
            with _output_to(request["log"]):
                try:
                    if request["dag"] == CONSUMER_DAG_ID:
                        code = _run_consumer(Path(request["result"]))
                    else:
                        code = _run_dag(request["dag"], request["conf"])
                except Exception:
                    traceback.print_exc()
                    code = 1
            replies.write(json.dumps({"code": code}) + "\n")
            replies.flush()
    return 0


@contextlib.contextmanager
def _output_to(log_file: str) -> Iterator[None]:
    """This process's standard output and error (the file descriptors, so that whatever
    writes to them, Python or not, is caught) to ``log_file`` for a while."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with open(log_file, "ab") as output:
            os.dup2(output.fileno(), 1)
            os.dup2(output.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        sys.exit(_serve(int(sys.argv[2])))
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
