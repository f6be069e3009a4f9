"""The DAGs through a real Airflow: scheduler, dag-processor, triggerer and API server as
separate processes (what ``airflow standalone`` starts), LocalExecutor, SQLite, under a
temporary AIRFLOW_HOME, all in one process group that the fixture kills however the test
ends.

- The pipeline DAG (unpaused at creation, ``@continuous``) runs through the scheduler: its
  first run decides a batch epoch, ``spark-submit``s the backlog job on ``spark_default`` =
  ``local[*]`` and closes the epoch at its boundary. The closed epoch is an event on the
  sink's Asset, and the scheduler runs the example consumer DAG scheduled on it, which reads
  the epoch's rows.
- A run of a tiny test DAG (``scheduler_dags/``), triggered with ``airflow dags trigger``,
  defers the ``LagThresholdSensor`` to the triggerer (its task instance is ``deferred`` and
  holds no worker slot), and resumes when records appended to the log it watches push the
  offset lag over its threshold.
- ``airflow backfill create`` of the backfill DAG over three days reprocesses three daily
  windows while the pipeline DAG keeps running: each window's records (late ones included)
  are replaced in one commit, and the audit finds every record once. The backfill DAG's own
  scheduled run (yesterday, mode ``fill``) finds nothing to fill.

- On PostgreSQL (a throwaway server on loopback, ``tests/postgres_tools.py``): the same
  components run the pipeline's batch and stream epochs, and a command sent through the
  control DAG stops the stream.

Marked ``scheduler`` (deselect with ``-m "not scheduler"``): a few minutes on 2 cores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pendulum
import pyarrow as pa
import pytest
from fault_tools import (
    CommandLineWatch,
    files_holding,
    processes_with_environment,
    records_in_window,
)
from postgres_tools import PostgresServer, throwaway_postgres
from state_tools import warehouse_store

from modeswitch.airflow.settings import settings_from_airflow
from modeswitch.airflow.tasks import submit_control_command
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.modes.backfill_commits import backfill_commits
from modeswitch.ops.verify import audit
from modeswitch.runners.engine import ENGINE_DIR_ENV, stop_engines_in
from modeswitch.runners.processes import stop_group
from modeswitch.sinks.commits import sink_commits
from modeswitch.sources.segments import SegmentLog

pytestmark = pytest.mark.scheduler

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = Path(sys.executable).parent / "airflow"
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
DAG_IDS = (
    "modeswitch_pipeline",
    "modeswitch_control",
    "modeswitch_backfill",
    "modeswitch_lag_watch",
    "modeswitch_example_consumer",
    "modeswitch_example_live_consumer",
    "modeswitch_lag_alerts",
)
UNPAUSED_FIRST = (
    "modeswitch_pipeline",
    "modeswitch_control",
    "modeswitch_lag_watch",
    "modeswitch_example_consumer",
    "modeswitch_example_live_consumer",
    "modeswitch_lag_alerts",
)
"""Every DAG but the backfill DAG, unpaused once parsed."""
RECORDS = 20_000
LIVE_RECORDS = 600
PG_CRASHES = int(os.environ.get("MODESWITCH_PG_CRASHES", "1"))
"""How often the PostgreSQL test's database crashes under the stream epoch."""
"""Produced after the first epoch: the next epochs commit them, and the sink's live Asset has
them while those run."""
TODAY = pendulum.now("UTC").start_of("day")
STORAGE_SECRET = f"sweep-s3cr3t-{secrets.token_hex(4)}"
"""In the storage Connection's extras (the tables' credentials, unused by local folders but
handed to every task and job that opens a table): no file the run writes and no command line of
its processes may hold it."""


@dataclass
class RunningAirflow:
    home: Path
    env: dict[str, str]
    port: int
    leader: subprocess.Popen
    database: PostgresServer | None = None  # None: SQLite under ``home``

    def query(self, sql: str, *args: object) -> list[tuple]:
        if self.database is not None:
            import psycopg2

            url = self.database.url.replace("postgresql+psycopg2", "postgresql")
            db = psycopg2.connect(url)
            try:
                with db.cursor() as cursor:
                    cursor.execute(sql.replace("?", "%s"), args)
                    return cursor.fetchall()
            finally:
                db.close()
        db = sqlite3.connect(f"file:{self.home / 'airflow.db'}?mode=ro", uri=True, timeout=30)
        try:
            return db.execute(sql, args).fetchall()
        finally:
            db.close()

    def api(
        self, method: str, path: str, body: dict[str, Any], *, done_if_conflict: bool = False
    ) -> dict[str, Any]:
        """A call to the running API server's REST API (``/api/v2/...``; every user is an
        admin here). What a user's script would do, and no Python process importing Airflow
        for each call as the CLI is (~3-5 CPU-seconds each on these 2 cores).

        On SQLite the server waits up to a minute for another component's write lock
        (``timeout=60`` in the URL), so the client waits longer than that; a 5xx (the lock
        never came: the server rolled its transaction back) is tried again, as a user's script
        would, and so is a call that got no answer in time. ``done_if_conflict``: a 409 on a
        second try means an earlier one was written (a run id that now exists)."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/api/v2/{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method=method,
        )
        for attempt in range(4):
            try:
                with urllib.request.urlopen(request, timeout=150) as response:
                    return json.load(response)
            except urllib.error.HTTPError as exc:
                if exc.code == 409 and done_if_conflict and attempt > 0:
                    return {}
                if exc.code < 500 or attempt == 3:
                    detail = exc.read()[:2000]
                    raise AssertionError(f"{method} {path}: {exc.code} {detail!r}") from exc
            except (TimeoutError, urllib.error.URLError) as exc:
                if attempt == 3:
                    raise AssertionError(f"{method} {path}: {exc}\n{self.logs()}") from exc
            time.sleep(2)
        raise AssertionError("unreachable")

    def trigger(self, dag_id: str, run_id: str, conf: dict[str, Any]) -> None:
        self.api(
            "POST",
            f"dags/{dag_id}/dagRuns",
            {"dag_run_id": run_id, "logical_date": None, "conf": conf},
            done_if_conflict=True,
        )

    def unpause(self, *dag_ids: str) -> None:
        for dag_id in dag_ids:
            self.api("PATCH", f"dags/{dag_id}?update_mask=is_paused", {"is_paused": False})

    def cli(self, *args: str) -> str:
        """Run an ``airflow`` command; again if SQLite was locked by a component (its
        transaction was rolled back: nothing of it was written)."""
        for _ in range(5):
            done = subprocess.run(
                [str(AIRFLOW), *args], env=self.env, capture_output=True, text=True, timeout=180
            )
            if done.returncode == 0 or "database is locked" not in done.stderr:
                break
            time.sleep(2)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def logs(self) -> str:
        """The tail of every component's output, for a failing assertion."""
        parts = []
        for name in COMPONENTS:
            text = (self.home / f"{name}.out").read_text(errors="replace")
            parts.append(f"--- {name} ---\n{text[-4000:]}")
        return "\n".join(parts)

    def wait_for(self, what: str, check: Callable[[], object], timeout: float) -> object:
        deadline = time.monotonic() + timeout
        import psycopg2

        while True:
            # A locked or new database (SQLite), tables not migrated yet (PostgreSQL).
            with contextlib.suppress(sqlite3.OperationalError, psycopg2.Error):
                result = check()
                if result:
                    return result
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{self.logs()}")
            assert self.leader.poll() is None, f"the components' shell exited\n{self.logs()}"
            time.sleep(1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop_group(leader: subprocess.Popen, home: Path) -> None:
    """SIGTERM the whole group, then SIGKILL whatever is left (Spark JVMs, task runners), and
    then every process still running under this Airflow's home: Airflow 3's task supervisor
    (``airflow worker -- <task instance>``) starts a session of its own, out of the group."""
    stop_group(leader, grace=20)
    for pid in processes_with_environment("AIRFLOW_HOME", str(home)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # its group: the task's spark-submit and JVM too
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, Path]:
    backlog = SegmentLog.create(str(tmp_path / "log"), buckets=4)
    # Four days of event time: three daily backfill windows and yesterday, the window of the
    # backfill DAG's own scheduled run.
    produce_backlog(
        backlog,
        EventGenerator(seed=5, buckets=4, late_fraction=0.05, max_lateness=timedelta(hours=6)),
        records=RECORDS,
        span=timedelta(days=4),
        now=TODAY,
    )
    watched = SegmentLog.create(str(tmp_path / "watched"), buckets=1)
    produce_backlog(watched, EventGenerator(seed=6, buckets=1), records=50)
    return {"log": tmp_path / "log", "watched": tmp_path / "watched", "tmp": tmp_path}


@pytest.fixture
def airflow_processes(sources: dict[str, Path]) -> Iterator[RunningAirflow]:
    # Every DAG is paused when first parsed; the test unpauses the backfill DAG only once the
    # pipeline has committed its first epoch. Its scheduled run (yesterday's fill) is refused
    # while the pipeline has committed nothing, and stop 46's CI saw the first epoch outlast
    # that run and its retry.
    yield from _airflow(sources, paused_at_creation=True)


@pytest.fixture
def airflow_on_postgres(sources: dict[str, Path]) -> Iterator[RunningAirflow]:
    """The same four components on a throwaway PostgreSQL server (LocalExecutor); each stream
    epoch may run ten minutes, so that only the command stops it within the test's time. The
    engine setting's default (``auto``): the warm engine, each epoch task deferred while it
    runs the epoch."""
    with throwaway_postgres() as database:
        yield from _airflow(
            sources, database, supervise=True, max_stream_runtime="10m", engine="auto"
        )


def _airflow(
    sources: dict[str, Path],
    database: PostgresServer | None = None,
    *,
    supervise: bool = False,
    paused_at_creation: bool = False,
    environment: dict[str, str] | None = None,
    **settings: str,
) -> Iterator[RunningAirflow]:
    """The four components on SQLite, or on ``database``. ``supervise``: each component is
    started again when it exits, as a deployment's process supervisor (systemd, Kubernetes)
    does; their output goes on in the same file. ``paused_at_creation``: Airflow's own
    default; the test unpauses what it runs. ``environment``: more of the components'
    environment (``MODESWITCH_*`` variables read where the DAG files are parsed)."""
    tmp = sources["tmp"]
    home, dags = tmp / "airflow", tmp / "dags"
    home.mkdir()
    dags.mkdir()
    for dag_file in (
        REPO / "dags" / "modeswitch_pipelines.py",
        REPO / "dags" / "modeswitch_example_consumer.py",
        REPO / "dags" / "modeswitch_example_live_consumer.py",
        Path(__file__).parent / "scheduler_dags" / "modeswitch_lag_watch.py",
        Path(__file__).parent / "scheduler_dags" / "recording_notifier.py",
    ):
        (dags / dag_file.name).symlink_to(dag_file)
    port = _free_port()
    variables = {
        "pipeline": "sched",
        "source": str(sources["log"]),
        "warehouse": str(tmp / "warehouse"),
        "max_stream_runtime": "10s",
        "trigger_interval": "500ms",
        "storage_connection": "lake",
        "asset_event_interval": "5s",
        # A spark-submit per epoch under the real scheduler (the default on YARN, Kubernetes,
        # cluster deploy mode), unless the test asks for another.
        "engine": "submit",
        **settings,
    }
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": str(paused_at_creation),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__AUTH_MANAGER": (
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        # A minute's wait for another component's write lock (SQLite's default is 5 s).
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database.url
        if database is not None
        else f"sqlite:///{home}/airflow.db?timeout=60",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__WORKERS": "1",
        # Every component signs and checks the task tokens with the same secret.
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_hex(32),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
        "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[*]"}',
        "AIRFLOW_CONN_LAKE": json.dumps(
            {
                "conn_type": "generic",
                "extra": {"AWS_REGION": "eu-west-1", "AWS_SECRET_ACCESS_KEY": STORAGE_SECRET},
            }
        ),
        "PATH": f"{AIRFLOW.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYSPARK_PYTHON": sys.executable,
        # The alerts DAG runs when the test triggers it; its notifier writes here.
        "MODESWITCH_ALERTS_SCHEDULE": "none",
        "MODESWITCH_TEST_ALERTS_FILE": str(tmp / "alerts.jsonl"),
        # Where the tasks find (and start) the warm engine; stopped with the components.
        ENGINE_DIR_ENV: str(tmp / "engines"),
        **{f"AIRFLOW_VAR_MODESWITCH_{k.upper()}": v for k, v in variables.items()},
        **(environment or {}),
    }
    subprocess.run(
        [str(AIRFLOW), "db", "migrate"], env=env, check=True, capture_output=True, timeout=300
    )
    # One shell leads a new process group and starts the four components in it; the
    # group is killed as a whole, whatever each component started (task runners, Spark).
    if supervise:
        run = (
            'while true; do "$0" {name} >> "{out}" 2>&1; '
            'echo "restarting {name}" >> "{out}"; sleep 2; done'
        )
        script = " ".join(f"({run.format(name=n, out=home / f'{n}.out')}) &" for n in COMPONENTS)
    else:
        script = " ".join(f'"$0" {n} > "{home}/{n}.out" 2>&1 &' for n in COMPONENTS)
    script += " wait"
    leader = subprocess.Popen(["bash", "-c", script, str(AIRFLOW)], env=env, start_new_session=True)
    try:
        yield RunningAirflow(home, env, port, leader, database)
    finally:
        _stop_group(leader, home)
        stop_engines_in(tmp / "engines")  # as make airflow does, once no task can start one


def _live_reads(airflow: RunningAirflow, first_epoch: int) -> list[dict] | None:
    """What the live consumer's successful runs read (their events, in order), once they hold
    every fresh record: committed by the epochs after ``first_epoch``, a batch or a stream as
    the policy decides (ci27 saw a batch take them)."""
    values = airflow.query(
        "SELECT x.value FROM xcom x JOIN dag_run r ON r.run_id = x.run_id "
        "AND r.dag_id = x.dag_id WHERE x.dag_id = 'modeswitch_example_live_consumer' "
        "AND x.key = 'return_value' AND r.state = 'success' ORDER BY r.id"
    )
    events = [e for (value,) in values for e in json.loads(value)["epochs"]]
    fresh_rows = sum(e["rows"] for e in events if e["epoch"] > first_epoch)
    return events if fresh_rows >= LIVE_RECORDS else None


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=5
        ) as r:
            health = json.load(r)
    except OSError:
        return False
    return all(
        health.get(part, {}).get("status") == "healthy"
        for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")
    )


@pytest.mark.timeout(1800)  # its own waits add up past 600 s on a slow machine
def test_the_scheduler_runs_an_epoch_and_the_triggerer_resumes_the_lag_sensor(
    airflow_processes: RunningAirflow, sources: dict[str, Path]
) -> None:
    airflow = airflow_processes
    started = time.monotonic()
    with CommandLineWatch("AIRFLOW_HOME", str(airflow.home), STORAGE_SECRET) as command_lines:
        _run_and_check(airflow, sources, started)
    # The storage secret went to every task and job, and is in none of their command lines
    # nor in any file the run wrote: task logs, the components' output, the metadata DB
    # (XComs, rendered fields), the tables, Spark's checkpoints.
    assert len(command_lines.seen) > 10 and command_lines.holding == []
    assert files_holding(sources["tmp"], STORAGE_SECRET) == []
    assert any((airflow.home / "logs").rglob("*.log")), "the task logs are among the files"


def _trigger_alerts(
    airflow: RunningAirflow, sources: dict[str, Path], run_id: str, **settings: str
) -> None:
    """A run of the lag alerts DAG on the watched log, as a pipeline of its own."""
    overrides = {
        "pipeline": "watch",
        "source": str(sources["watched"]),
        "warehouse": str(sources["tmp"] / "watch-warehouse"),
        "alert_offset_lag": "500",
        "alert_after": "0s",
        "alert_notifiers": "recording_notifier:recorder",
        **settings,
    }
    airflow.trigger("modeswitch_lag_alerts", run_id, {"settings": overrides})


def _alert_runs(airflow: RunningAirflow, count: int) -> list[tuple] | None:
    """The alerts DAG's runs (id, state), once ``count`` of them have ended."""
    rows = airflow.query(
        "SELECT run_id, state FROM dag_run WHERE dag_id = 'modeswitch_lag_alerts' ORDER BY id"
    )
    ended = [row for row in rows if row[1] in ("success", "failed")]
    return rows if len(ended) >= count else None


def _run_and_check(airflow: RunningAirflow, sources: dict[str, Path], started: float) -> None:
    airflow.wait_for("the four components to be healthy", lambda: _healthy(airflow.port), 240)
    airflow.wait_for(
        "the DAGs to be parsed",
        lambda: (
            len(
                airflow.query(
                    f"SELECT dag_id FROM dag WHERE dag_id IN ({','.join('?' * len(DAG_IDS))})",
                    *DAG_IDS,
                )
            )
            == len(DAG_IDS)
        ),
        240,
    )
    airflow.unpause(*UNPAUSED_FIRST)

    # The sensor defers to the triggerer while the offset lag (50 records) is below 500.
    airflow.trigger("modeswitch_lag_watch", "watch", {"source": str(sources["watched"])})

    def sensor_state() -> str | None:
        rows = airflow.query(
            "SELECT state FROM task_instance WHERE dag_id = 'modeswitch_lag_watch' "
            "AND run_id = 'watch' AND task_id = 'wait_for_lag'"
        )
        return rows[0][0] if rows else None

    airflow.wait_for("the sensor to defer", lambda: sensor_state() == "deferred", 240)
    [(classpath,)] = airflow.query(
        "SELECT t.classpath FROM trigger t JOIN task_instance ti "
        "ON ti.trigger_id = t.id WHERE ti.dag_id = 'modeswitch_lag_watch'"
    )
    assert classpath == "modeswitch.airflow.triggers.LagThresholdTrigger"
    airflow.wait_for(
        "the triggerer to take the trigger",
        lambda: airflow.query(
            "SELECT triggerer_id FROM trigger WHERE classpath = ? AND triggerer_id IS NOT NULL",
            classpath,
        ),
        120,
    )
    time.sleep(3)  # a few polls below the threshold: it keeps waiting
    assert sensor_state() == "deferred"
    # Airflow 3.3's scheduler marks a resumed task FAILED if the trigger fires before it has
    # processed the executor event of the run that deferred ("finished with state success,
    # but the task instance's state attribute is queued"): seen here when the scheduler loop
    # lagged 5.5 s behind on 2 busy cores. Push the lag over only after that event.
    airflow.wait_for(
        "the scheduler to take in the deferral",
        lambda: (
            "Received executor event with state success for task instance "
            "TaskInstanceKey(dag_id='modeswitch_lag_watch'"
            in (airflow.home / "scheduler.out").read_text(errors="replace")
        ),
        120,
    )
    # Lag alerts on the watched log (50 records, nothing committed): under 500, nothing said.
    _trigger_alerts(airflow, sources, "alerts-1")
    airflow.wait_for("the first alerts run", lambda: _alert_runs(airflow, 1), 180)
    deferred_at = time.monotonic()
    watched = SegmentLog(str(sources["watched"]))
    watched.append(
        0,
        pa.table(
            {
                "event_time": [datetime.now(UTC) - timedelta(seconds=1)] * 1_000,
                "key": ["k"] * 1_000,
                "value": ["{}"] * 1_000,
            }
        ),
    )
    airflow.wait_for("the sensor to resume and succeed", lambda: sensor_state() == "success", 180)
    # 1 050 records behind: a breach, told once; still behind, nothing; the threshold raised
    # over the lag: the recovery, told once.
    _trigger_alerts(airflow, sources, "alerts-2")
    _trigger_alerts(airflow, sources, "alerts-3")
    _trigger_alerts(airflow, sources, "alerts-4", alert_offset_lag="5000")
    resumed_after = time.monotonic() - deferred_at
    [(value,)] = airflow.query(
        "SELECT value FROM xcom WHERE dag_id = 'modeswitch_lag_watch' AND key = 'return_value'"
    )
    event = json.loads(value)
    assert event["status"] == "crossed"
    assert event["offset_lag"] == 1_050
    assert event["reason"] == "offset lag 1050 records > 500"

    # Meanwhile the continuous pipeline DAG's first run drained the backlog in a batch epoch.
    def first_pipeline_run() -> tuple | None:
        rows = airflow.query(
            "SELECT run_id, state FROM dag_run WHERE dag_id = 'modeswitch_pipeline' "
            "ORDER BY id LIMIT 1"
        )
        return rows[0] if rows and rows[0][1] in ("success", "failed") else None

    run_id, state = airflow.wait_for("the first pipeline run to end", first_pipeline_run, 600)
    tasks = dict(
        airflow.query(
            "SELECT task_id, state FROM task_instance WHERE dag_id = 'modeswitch_pipeline' "
            "AND run_id = ?",
            run_id,
        )
    )
    assert state == "success", f"{tasks}\n{airflow.logs()}"
    assert tasks == {
        "decide": "success",
        "branch": "success",
        "backlog_batch": "success",
        "stream": "skipped",
        "close_epoch": "success",
    }
    variables = airflow.env
    store = warehouse_store(
        variables["AIRFLOW_VAR_MODESWITCH_WAREHOUSE"],
        "sched",
        f"{variables['AIRFLOW_VAR_MODESWITCH_WAREHOUSE']}/sched",
    )
    first = store.epochs.list()[0]
    assert (first.mode, first.status) == ("batch", "completed")
    assert first.end == first.boundary
    assert sum(first.end.values()) == RECORDS
    epoch_done = time.monotonic() - started
    airflow.unpause("modeswitch_backfill")

    # The closed epoch was an event on the sink's Asset: the scheduler ran the downstream DAG
    # scheduled on it, which read exactly the epoch's rows from the sink.
    def first_consumer_run() -> tuple | None:
        rows = airflow.query(
            "SELECT run_id, run_type, state FROM dag_run "
            "WHERE dag_id = 'modeswitch_example_consumer' ORDER BY id LIMIT 1"
        )
        return rows[0] if rows and rows[0][2] in ("success", "failed") else None

    consumer_run, run_type, state = airflow.wait_for(
        "the consumer DAG's first run to end", first_consumer_run, 300
    )
    assert (run_type, state) == ("asset_triggered", "success"), airflow.logs()
    [(value,)] = airflow.query(
        "SELECT value FROM xcom WHERE dag_id = 'modeswitch_example_consumer' AND run_id = ? "
        "AND key = 'return_value'",
        consumer_run,
    )
    landed = json.loads(value)
    assert landed["epochs"][0]["epoch"] == first.id
    assert all(e["rows"] == e["records"] for e in landed["epochs"]), landed
    assert (
        landed["epochs"][0]["rows"] == store.progress.epoch_summaries(first.id)[first.id]["records"]
    )

    # Records that arrive now are committed by the next epochs: the sink's live Asset, watched
    # in the triggerer, has events for them, whether or not those epochs have closed.
    produce_backlog(
        SegmentLog(str(sources["log"])), EventGenerator(seed=9, buckets=4), records=LIVE_RECORDS
    )

    # Airflow's own backfill of three daily windows, reprocessed while the pipeline runs on.
    airflow.wait_for(
        "a pipeline run to be running",
        lambda: airflow.query(
            "SELECT run_id FROM dag_run WHERE dag_id = 'modeswitch_pipeline' AND state = 'running'"
        ),
        120,
    )
    backfill_started = time.monotonic()
    airflow.cli(
        "backfill",
        "create",
        "--dag-id",
        "modeswitch_backfill",
        "--from-date",
        TODAY.subtract(days=4).to_date_string(),
        "--to-date",
        TODAY.subtract(days=2).to_date_string(),
        "--dag-run-conf",
        json.dumps({"mode": "reprocess"}),
    )

    def backfill_runs() -> list[tuple] | None:
        rows = airflow.query(
            "SELECT run_type, data_interval_start, state FROM dag_run "
            "WHERE dag_id = 'modeswitch_backfill' ORDER BY data_interval_start"
        )
        done = len(rows) == 4 and all(state in ("success", "failed") for *_, state in rows)
        return rows if done else None

    runs = airflow.wait_for("the backfill DAG's runs to end", backfill_runs, 900)
    alert_runs = airflow.wait_for("the alerts runs", lambda: _alert_runs(airflow, 4), 300)
    assert alert_runs == [(f"alerts-{i}", "success") for i in (1, 2, 3, 4)], airflow.logs()
    told = [json.loads(line) for line in (sources["tmp"] / "alerts.jsonl").read_text().splitlines()]
    assert told == [
        {"message": "breach: offset lag 1050 records > 500", "run_id": "alerts-2"},
        {
            "message": "recovery: recovered from offset lag 1050 records > 500",
            "run_id": "alerts-4",
        },
    ]
    live = airflow.wait_for(
        "the live consumer to read the fresh records", lambda: _live_reads(airflow, first.id), 300
    )
    assert all(e["live"] and e["rows"] == e["records"] for e in live), live
    assert [(kind, state) for kind, _, state in runs] == [("backfill", "success")] * 3 + [
        ("scheduled", "success")
    ], f"{runs}\n{airflow.logs()}"
    warehouse = variables["AIRFLOW_VAR_MODESWITCH_WAREHOUSE"]
    commits = sorted(backfill_commits(f"{warehouse}/sched", "sched"), key=lambda c: c.window.start)
    windows = [(TODAY.subtract(days=d), TODAY.subtract(days=d - 1)) for d in (4, 3, 2, 1)]
    assert [(c.mode, c.window.start, c.window.end) for c in commits] == [
        *(("reprocess", *window) for window in windows[:3]),
        ("fill", *windows[3]),  # the schedule's own run, with the default mode
    ]
    # The live pipeline read everything from the earliest offsets: nothing is left to fill.
    assert (commits[3].records, commits[3].ranges) == (0, {})
    commits = commits[:3]
    log = SegmentLog(str(sources["log"]))
    for commit, (start, end) in zip(commits, windows[:3], strict=True):
        in_window = records_in_window(log, start, end, first.end)
        assert commit.records + commit.quarantined == in_window > 0
    report = audit(
        str(sources["log"]), f"{warehouse}/sched", f"{warehouse}/sched_quarantine", "sched"
    )
    totals = report.totals
    assert (totals.missing, totals.duplicated, totals.out_of_range) == (0, 0, 0), report
    assert totals.expected == RECORDS + LIVE_RECORDS
    print(
        f"scheduler test: components healthy and DAGs parsed, sensor resumed "
        f"{resumed_after:.1f} s after the lag crossed, first epoch done {epoch_done:.0f} s "
        f"after start, three backfilled windows in {time.monotonic() - backfill_started:.0f} s"
    )


@pytest.mark.timeout(1800)  # its own waits add up past 600 s on a slow machine
def test_on_postgres_the_scheduler_runs_an_epoch_pair_and_a_control_command(
    airflow_on_postgres: RunningAirflow, sources: dict[str, Path]
) -> None:
    """Airflow's metadata on PostgreSQL: the continuous pipeline runs a batch epoch and then
    a stream epoch through the scheduler and the LocalExecutor, on the warm engine (the
    default here), the stream task deferred to the triggerer while the engine runs it. The
    database crashes under the stream epoch and comes back: the stream goes on committing, a
    command from the operator's path stops it at a commit boundary, the scheduler and the
    triggerer come back, the deferred task resumes, and a command sent through the control
    DAG is applied; nothing is lost or doubled."""
    airflow = airflow_on_postgres
    [(version,)] = airflow.wait_for(
        "the metadata database", lambda: airflow.query("SELECT version()"), 60
    )
    assert version.startswith("PostgreSQL")
    airflow.wait_for("the four components to be healthy", lambda: _healthy(airflow.port), 240)
    warehouse = airflow.env["AIRFLOW_VAR_MODESWITCH_WAREHOUSE"]
    store = warehouse_store(warehouse, "sched", f"{warehouse}/sched")

    def streaming() -> bool:
        with contextlib.suppress(Exception):  # the control tables are created by the first run
            return any(e.mode == "stream" and e.running for e in store.epochs.list())
        return False

    airflow.wait_for("the batch epoch, then a stream epoch to run", streaming, 600)

    def stream_committed() -> bool:
        return any(c.mode == "stream" for c in sink_commits(f"{warehouse}/sched", "sched"))

    airflow.wait_for("the stream's first commit", stream_committed, 240)
    [running] = [e for e in store.epochs.list() if e.running]
    # The warm engine runs the stream (it opened it at the batch's end); the stream task
    # handed it over and is deferred, its wait in the triggerer: no worker slot held.
    airflow.wait_for(
        "the stream task to defer to the engine's trigger",
        lambda: (
            airflow.query(
                "SELECT t.classpath FROM task_instance ti JOIN trigger t ON ti.trigger_id = t.id "
                "WHERE ti.dag_id = 'modeswitch_pipeline' AND ti.task_id = 'stream' "
                "AND ti.state = 'deferred'"
            )
            == [("modeswitch.airflow.triggers.EngineEpochTrigger",)]
        ),
        240,
    )

    # The metadata database crashes mid-epoch (SIGKILL, as when its machine is lost) and is
    # back 10 s later, recovering its data; PG_CRASHES times (``make soak-faults``: more).
    # The engine and the deferred task ride it out: records produced after each crash are
    # committed by the same epoch, while Airflow's scheduler and triggerer are out (their
    # loops ended on the lost database; their supervisor starts them again, and the
    # triggerer's trigger attaches to the epoch anew).
    assert airflow.database is not None
    log = SegmentLog(str(sources["log"]))
    for crash in range(PG_CRASHES):
        airflow.database.crash()
        time.sleep(10)
        airflow.database.start()
        produce_backlog(log, EventGenerator(seed=11 + crash, buckets=4), records=LIVE_RECORDS)
        latest = log.latest_offsets()
        airflow.wait_for(
            f"the stream to commit the records produced after crash {crash + 1}",
            lambda latest=latest: all(
                store.progress.committed_offsets().get(b, 0) >= n for b, n in latest.items()
            ),
            240,
        )
        if crash + 1 < PG_CRASHES:
            airflow.wait_for("the components to be healthy", lambda: _healthy(airflow.port), 300)
    assert [e.id for e in store.epochs.list() if e.running] == [running.id]
    # The operator's page queues commands without the scheduler (the same function as the
    # control DAG's task): the stream stops at its next commit boundary.
    variables = settings_from_airflow(
        get_variable=lambda key: airflow.env.get(f"AIRFLOW_VAR_{key.upper()}")
    )
    submit_control_command(
        {"command": "switch_to_batch", "note": "from the postgres test, database back"},
        # The tables are local: the storage Connection (the components') is not needed here.
        settings=dataclasses.replace(variables, storage_connection=""),
    )

    def stopped_stream():
        ended = [e for e in store.epochs.list() if e.mode == "stream" and not e.running]
        return ended[0] if ended else None

    stream = airflow.wait_for("the stream to stop on the command", stopped_stream, 240)
    assert stream.id == running.id  # the epoch the database crashed under, not a new one
    airflow.wait_for("the components to be healthy again", lambda: _healthy(airflow.port), 300)
    assert "restarting scheduler" in (airflow.home / "scheduler.out").read_text(errors="replace")

    # A command through the control DAG, once the scheduler is back.
    airflow.trigger(
        "modeswitch_control", "pause", {"command": "pause", "note": "from the postgres test"}
    )
    control = airflow.wait_for(
        "the control run to end",
        lambda: airflow.query(
            "SELECT state FROM dag_run WHERE dag_id = 'modeswitch_control' AND run_id = 'pause' "
            "AND state IN ('success', 'failed')"
        ),
        240,
    )
    assert control == [("success",)], airflow.logs()
    airflow.wait_for(
        "the pause to be applied",
        lambda: [c for c in store.commands.list() if c.kind == "pause" and c.status == "applied"],
        300,
    )
    batch = store.epochs.list()[0]
    assert (batch.mode, batch.status) == ("batch", "completed")
    assert sum(batch.end.values()) == RECORDS
    assert stream.status == "completed" and stream.start == batch.end  # the exact handoff
    [command] = [c for c in store.commands.list() if c.kind == "switch_to_batch"]
    assert command.status == "applied" and command.applied_epoch == stream.id
    assert "command" in (stream.end_reason or ""), stream.end_reason
    # The pipeline's task instances are Airflow's rows in PostgreSQL.
    states = airflow.query(
        "SELECT task_id, state FROM task_instance WHERE dag_id = 'modeswitch_pipeline' "
        "AND task_id IN ('backlog_batch', 'stream') AND state = 'success'"
    )
    assert {task for task, _ in states} == {"backlog_batch", "stream"}, airflow.logs()
    report = audit(
        str(airflow.env["AIRFLOW_VAR_MODESWITCH_SOURCE"]),
        f"{warehouse}/sched",
        f"{warehouse}/sched_quarantine",
        "sched",
    )
    totals = report.totals
    assert (totals.missing, totals.duplicated, totals.out_of_range) == (0, 0, 0), report
    assert totals.expected == RECORDS + PG_CRASHES * LIVE_RECORDS
