"""What both spark-submit entrypoints do: parse ``--pipeline --epoch --config``, build the
session, run the epoch, stop the session. ``jobs/backlog_batch.py`` and ``jobs/stream.py``
are one line on top of this.

The stream job can also start in standby (``--standby`` instead of ``--epoch``): it starts its
session, warms it up (:func:`modeswitch.modes.warmup.warm_up`) and then waits for one line on its
standard input, :func:`standby_request`: the epoch to run and its settings. At the end of its
input without a request it stops its session and exits 0. The local runner
(:class:`modeswitch.runners.local.StreamStandby`) starts it while a batch epoch runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from modeswitch.control.settings import PipelineSettings
from modeswitch.control.settings_layers import load_job_settings
from modeswitch.errors import ModeswitchError, UnknownSchemaIdError

if TYPE_CHECKING:  # the modes import pyspark: only where a job runs
    from modeswitch.modes.job import JobKind, JobPlan
    from modeswitch.modes.wave_path import WavePath
    from modeswitch.transforms.schema_ids import SchemaIdLearned

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JOBS = Path(__file__).resolve().parents[3] / "jobs"
"""The spark-submit entrypoints' folder (``jobs/`` at the repository's top)."""
JOB_SCRIPTS: dict[str, str] = {
    "batch": "backlog_batch.py",
    "stream": "stream.py",
    "backfill": "backfill.py",
    "engine": "engine.py",
}


def job_script(kind: str) -> Path:
    """The spark-submit entrypoint of a ``batch``, ``stream`` or ``backfill`` job, or of the
    pipeline's warm ``engine``."""
    if kind not in JOB_SCRIPTS:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(JOB_SCRIPTS)}")
    return JOBS / JOB_SCRIPTS[kind]


log = logging.getLogger("modeswitch.jobs")


def _parse_arguments(
    description: str,
    argv: list[str] | None = None,
    *,
    standby: bool = False,
    backfill: bool = False,
) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--pipeline", required=True, help="the pipeline id")
    if backfill:
        parser.add_argument(
            "--command", type=int, required=True, help="the backfill command to run"
        )
        parser.set_defaults(epoch=None)
    target = parser.add_mutually_exclusive_group(required=True) if standby else parser
    if not backfill:
        target.add_argument("--epoch", type=int, required=not standby, help="the epoch to run")
    if standby:
        target.add_argument(
            "--standby",
            action="store_true",
            help="start and warm up now; run the epoch named on standard input "
            '(one JSON line: {"epoch": N, "config": "<settings JSON>"}); exit 0 at its end',
        )
    parser.add_argument(
        "--config", required=True, help="resolved settings: a JSON/TOML file, or inline JSON"
    )
    return parser.parse_args(argv)


def standby_request(epoch: int, settings: PipelineSettings) -> str:
    """The line that hands ``epoch`` to a standby job: one JSON object and a newline."""
    return json.dumps({"epoch": epoch, "config": settings.to_json()}) + "\n"


def read_standby_request(stream: TextIO) -> tuple[int, str] | None:
    """The epoch and settings a standby job was handed, or None at the end of its input."""
    line = stream.readline()
    if not line.strip():
        return None
    try:
        request = json.loads(line)
        epoch, config = request["epoch"], request["config"]
    except (json.JSONDecodeError, TypeError, KeyError) as exc:
        raise ModeswitchError(f"standby request {line[:80]!r} is not valid: {exc!r}") from exc
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not isinstance(config, str):
        raise ModeswitchError(f"standby request {line[:80]!r}: expected an epoch and settings")
    return epoch, config


def job_spark_conf(
    kind: JobKind, settings: PipelineSettings, waves: WavePath | None = None
) -> dict[str, str]:
    """The Spark conf a job's settings ask for, to be set before its driver JVM starts (by
    :func:`create_spark_session` when the job starts it, by spark-submit under Airflow);
    ``waves``: the batch's wave path where it is known then (:func:`driver_jit`)."""
    conf: dict[str, str] = {}
    java = list(driver_jit(waves))
    if kind in ("batch", "backfill") and settings.batch_driver_memory:
        conf["spark.driver.memory"] = settings.batch_driver_memory
        # A fixed-size heap: taken at the start and never grown, whatever the backlog.
        java.insert(0, f"-Xms{settings.batch_driver_memory}")
    if java:
        conf["spark.driver.extraJavaOptions"] = " ".join(java)
    return conf


QUICK_JIT = "-XX:TieredStopAtLevel=1"
"""The JVM's first JIT tier only (C1): quick to compile, no C2 compiler threads."""


def driver_jit(waves: WavePath | None) -> tuple[str, ...]:
    """The driver JVM's JIT options for a job whose waves take ``waves`` (None: unknown, or
    not a batch): :data:`QUICK_JIT` on Arrow waves, the JVM's defaults elsewhere.

    On Arrow waves the JVM runs no record: each wave is ``spark.range(n).mapInArrow`` over
    Python tasks that read, parse and write, and the JVM's own work is starting up and
    scheduling, which C2 compiles for and never repays in a job of seconds; its compiler
    threads take the Python tasks' cores meanwhile. The cold batch job over 10 M records took
    13.7 and 13.8 s with C1 only against 15.9 and 16.7 s with the defaults (20 against 25-27
    CPU-s, alternating, 2026-11-30). Where Spark's readers, ``from_json`` or writers run the
    records, C2 earns its keep: with C1 only the stream job with availableNow took 77.3 s
    against 41.8 s, Spark's native read and write 47.9 s against 35.8 s (the same hour)."""
    return (QUICK_JIT,) if waves is not None and waves.reader == "arrow" else ()


def _create_spark_session(
    kind: JobKind, args: argparse.Namespace, settings: PipelineSettings, job: JobPlan
):
    from modeswitch.runners.session import create_spark_session  # pyspark: only where a job runs

    name = _target(args).replace(" ", "-")
    return create_spark_session(
        f"modeswitch-{args.pipeline}-{kind}-{name}",
        conf=job_spark_conf(kind, settings, job.waves),
        data_sources=False,  # each path registers the one it uses, where it uses it
    )


def _wait_in_standby(
    spark, args: argparse.Namespace, settings: PipelineSettings, requests: TextIO
) -> PipelineSettings | None:
    """Warm the session up, then wait for the epoch to run; sets ``args.epoch`` and returns
    that epoch's settings, or None if released without one."""
    from concurrent.futures import ThreadPoolExecutor

    from modeswitch.modes.warmup import warm_up

    # The request is read while the warm-up runs: an epoch that comes early cuts it short.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="standby-request") as reader:
        pending = reader.submit(read_standby_request, requests)
        warm_up(spark, settings, should_stop=pending.done)
        log.info("standby: warm; waiting for a stream epoch")
        request = pending.result()
    if request is None:
        log.info("standby: released without an epoch")
        return None
    args.epoch, config = request
    log.info("standby: running stream epoch %d", args.epoch)
    return load_job_settings(config, pipeline=args.pipeline)


def _target(args: argparse.Namespace) -> str:
    """What a job runs, for names and messages: ``epoch 7``, ``command 3`` or ``standby``."""
    if getattr(args, "command", None) is not None:
        return f"command {args.command}"
    return "standby" if args.epoch is None else f"epoch {args.epoch}"


def run(
    kind: JobKind,
    spark,
    settings: PipelineSettings,
    *,
    epoch: int | None = None,
    command: int | None = None,
    job: JobPlan | None = None,
) -> None:
    """Run a ``kind`` job in ``spark``: batch or stream ``epoch``, or backfill ``command``. Its
    settings are resolved once (:func:`~modeswitch.modes.job.resolve_job`; ``job``: already,
    from these ``settings``), before anything is read or written, and its mode runs the plan;
    again for each schema id its values name that it did not know."""
    from modeswitch.modes.job import resolve_job

    target = command if kind == "backfill" else epoch
    assert target is not None, (
        f"a {kind} job needs its {'command' if kind == 'backfill' else 'epoch'}"
    )
    seen: dict = {}  # what the runs learned of each decoded column's schema ids
    for attempt in range(1, SCHEMA_ATTEMPTS + 1):
        job = job if attempt == 1 and job is not None else resolve_job(settings, kind, seen)
        try:
            JOB_RUNS[kind](spark, job, target)
            return
        except Exception as exc:
            from modeswitch.transforms.schema_ids import SchemaIdsSeen, learn_schema_id, unknown_id

            # The Spark form's message is in a failed query's plan too, without its values.
            said = [m for m in modeswitch_errors(exc, UnknownSchemaIdError) if unknown_id(m)]
            if not said or attempt == SCHEMA_ATTEMPTS:
                raise
            column = unknown_id(said[-1]).column  # the value's subject, or the key's
            source = job.payload.schema_sources.get(column)
            if source is None:
                raise
            # Nothing of the wave or micro-batch that met the id was committed: the registry,
            # asked, says what it is, and the job resolved again reads it (or stops, ``fail``).
            learned = learn_schema_id(said[-1], source, seen.get(column, SchemaIdsSeen()))
            seen = {**seen, column: learned.seen}
            log.warning("%s job: %s; %s", kind, said[-1], learned.said)
            record_schema_change(settings, kind, epoch, learned)


SCHEMA_ATTEMPTS = 8
"""How many times a job is resolved and run when its values name schema ids it did not know:
each version registered while it runs, and each id foreign to its subject, costs one."""


def record_schema_change(
    settings: PipelineSettings, kind: JobKind, epoch: int | None, learned: SchemaIdLearned
) -> None:
    """``learned`` in the decision log (``decided_by = schema``), beside the newest decision
    as a lag alert is (:meth:`~modeswitch.state.decisions.DecisionTable.record_beside_newest`),
    with the job and the schema id."""
    from modeswitch.state import StateStore

    schema = {
        "job": kind,
        "epoch": epoch,
        "schema_id": learned.schema_id,
        "version": learned.version,
    }
    StateStore.from_settings(settings).decisions.record_beside_newest(
        learned.said,
        {"schema": schema},
        decided_by="schema",
        first_mode=lambda: "stream" if kind == "stream" else "batch",
    )


def modeswitch_errors(exc: BaseException, kind: type[ModeswitchError]) -> list[str]:
    """The messages of the ``kind`` errors behind ``exc``: raised on the driver, or in a Spark
    task (a Python worker's, or a Spark expression's ``raise_error``) and carried in the error
    Spark gave the driver (its text, where each is a line of its own); empty when there is
    none. The first error in the chain that holds one gives them, in the order of its text."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return [str(seen)]
        found = [
            said.strip() for name, said in _TASK_ERROR.findall(str(seen)) if name == kind.__name__
        ]
        if found:
            return found
        seen = seen.__cause__ or seen.__context__
    return []


def run_backfill_job(spark, job, command: int) -> None:
    """A backfill command's run (:func:`modeswitch.modes.backfill_job.run_backfill`), logged."""
    from modeswitch.modes.backfill_job import run_backfill

    report = run_backfill(spark, job, command)
    log.info(
        "backfill command %d: %d records, %d quarantined; sink version %d",
        report.command,
        report.records,
        report.quarantined,
        report.sink_version,
    )


def run_batch_job(spark, job, epoch: int) -> None:
    """A batch epoch's run (:func:`modeswitch.modes.batch.run_batch_epoch`), logged."""
    from modeswitch.modes.batch import run_batch_epoch

    report = run_batch_epoch(spark, job, epoch)
    log.info(
        "batch epoch %d: %d waves, %d records; committed %s",
        report.epoch,
        report.waves,
        report.records,
        report.committed,
    )


def run_stream_job(spark, job, epoch: int) -> None:
    """A stream epoch's run (:func:`modeswitch.modes.stream.run_stream_epoch`), logged."""
    from modeswitch.modes.stream import run_stream_epoch

    report = run_stream_epoch(spark, job, epoch)
    log.info(
        "stream epoch %d stopped (%s) after %d micro-batches, %d records; end %s; next %s",
        report.epoch,
        report.reason,
        report.micro_batches,
        report.records,
        report.end,
        report.next_mode,
    )


JOB_RUNS = {"batch": run_batch_job, "stream": run_stream_job, "backfill": run_backfill_job}
"""What each kind of job runs, once its settings are resolved."""


_TASK_ERROR = re.compile(r"^modeswitch\.errors\.(\w+): (.+)$", re.MULTILINE)


def task_failure(exc: BaseException) -> str | None:
    """The message of a modeswitch error raised in a Spark task's Python worker, from the
    error Spark gave the driver for it (a ``PythonException`` carrying the worker's traceback,
    whose last line is the error); None for any other error."""
    from pyspark.errors import PySparkException

    if not isinstance(exc, PySparkException):
        return None
    found = _TASK_ERROR.findall(str(exc))
    return found[-1][1].strip() if found else None


def main(
    kind: JobKind, description: str, argv: list[str] | None = None, requests: TextIO | None = None
) -> int:
    """Run one epoch; exit status 0 on success, 1 with a clear message on a modeswitch error
    (anything else propagates with its traceback). The session is stopped in every case.

    A stream job in standby reads its epoch from ``requests`` (standard input by default)."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    args = _parse_arguments(
        description, argv, standby=kind == "stream", backfill=kind == "backfill"
    )
    spark = None
    try:
        # Read (and check) the settings first: some of them size the JVM the session starts.
        settings = load_job_settings(args.config, pipeline=args.pipeline)
        from modeswitch.modes.job import resolve_job  # pyspark: only where a job runs

        # Resolved before the session: its wave path chooses the driver JVM's JIT, and a
        # setting that cannot work is refused before a JVM starts.
        job = resolve_job(settings, kind)
        spark = _create_spark_session(kind, args, settings, job)
        if getattr(args, "standby", False):
            chosen = _wait_in_standby(spark, args, settings, requests or sys.stdin)
            if chosen is None:
                return 0
            settings, job = chosen, None  # the epoch's own settings, resolved by run()
        run(
            kind,
            spark,
            settings,
            epoch=args.epoch,
            command=getattr(args, "command", None),
            job=job,
        )
        return 0
    except ModeswitchError as exc:
        log.error("%s %s failed: %s", kind, _target(args), exc)
        return 1
    except Exception as exc:
        said = task_failure(exc)
        if said is None:
            raise
        # A modeswitch error raised in a Spark task (a wave's read of a broker that is down):
        # the same clear failure as the driver's own, the task's traceback above in the log.
        log.error("%s %s failed: %s (raised in a Spark task)", kind, _target(args), said)
        return 1
    finally:
        if spark is not None:
            spark.stop()
