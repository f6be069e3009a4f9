"""Test tiers: every test is marked by the folder it lives in (unit, spark, airflow, ...)."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# No per-example deadline: on this 2-core machine a property test's examples are slowed by
# whatever else runs (a Spark job), and Hypothesis's default 200 ms deadline then fails a
# correct test (seen: a plan of 12 000 one-record partitions while an end-to-end test ran).
settings.register_profile("modeswitch", deadline=None)
settings.load_profile("modeswitch")

# Every JVM the tests start (Spark drivers in this process and in job processes, spark-submit
# under Airflow, the standalone cluster's master and workers) lives seconds to a few minutes
# and handles little data: C1 alone and the serial collector spend less of the two cores on
# compiling and collecting than the server defaults do. Measured with the batch-kill and
# standby-kill tests of tests/faults/test_job_crashes.py, alternating: 96.2 and 96.9 s against
# 102.6 and 114.9 s; the end-to-end handoff test 159 s against 181 s. The JVMs of the product
# (make demo, the benchmarks, a user's run) keep the defaults. Set JAVA_TOOL_OPTIONS to
# override (an empty value gives every JVM its defaults).
#
# Each JVM also unpacks native libraries into its java.io.tmpdir, and a Spark driver given no
# local dirs makes its own there (``spark-*``, ``blockmgr-*``, ``artifacts-*``: 23 MB a
# driver); one SIGKILLed, as the fault tests do, leaves them. The product's runners give
# their jobs a scratch of their own (SparkScratch); every other JVM (the Spark sessions in
# the test processes, a test's own Spark programs) gets the test session's folder, made by the
# first process (the xdist controller, whose environment its workers inherit) and removed by
# it at the end (the workers' lock files below are there too). Before, a `make test` left some
# 35 Spark folders and 40 files in /tmp (250 MB).
if "MODESWITCH_TESTS_TMP" not in os.environ:
    os.environ["MODESWITCH_TESTS_TMP"] = tempfile.mkdtemp(prefix="modeswitch-tests-")
    atexit.register(shutil.rmtree, os.environ["MODESWITCH_TESTS_TMP"], ignore_errors=True)
TEST_JAVA_OPTIONS = (
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
    f"-Djava.io.tmpdir={os.environ['MODESWITCH_TESTS_TMP']}"
)
os.environ.setdefault("JAVA_TOOL_OPTIONS", TEST_JAVA_OPTIONS)

TIERS = ("unit", "spark", "airflow", "e2e", "faults", "browser", "kafka", "cluster")


FILE_SECONDS = {
    "faults/test_random_faults.py": 368,
    "airflow/test_scheduler_run.py": 355,
    "faults/test_job_crashes.py": 245,
    "kafka/test_kafka_pipeline.py": 205,
    "airflow/test_scheduler_faults.py": 196,
    "kafka/test_broker_faults.py": 147,
    "kafka/test_kafka_demo_cycle.py": 129,
    "spark/test_user_delta_commands.py": 119,
    "spark/test_avro_forms.py": 25,
    "cluster/test_cluster_cycle.py": 115,
    "airflow/test_warm_engine.py": 114,
    "e2e/test_handoff.py": 99,
    "browser/test_operator_page.py": 95,
    "airflow/test_stream_retry.py": 82,
    "faults/test_fleet_faults.py": 90,
    "faults/test_storage_faults.py": 76,
    "spark/test_delta_sink.py": 71,
    "cluster/test_cluster_kafka.py": 62,
    "airflow/test_backfill_run.py": 59,
    "e2e/test_run_fleet.py": 50,
    "e2e/test_rewind_pipeline.py": 47,
    "kafka/test_kafka_cli.py": 47,
    "spark/test_arrow_parse.py": 62,
    "spark/test_maintenance_beside_stream.py": 37,
    "kafka/test_kafka_auth.py": 36,
    "kafka/test_schema_registry.py": 175,
    "airflow/test_pipeline_run.py": 33,
    "spark/test_delta_spark_writer.py": 33,
    "e2e/test_run_engine.py": 33,
    "spark/test_three_readers.py": 33,
    "unit/test_state_concurrency.py": 31,
    "airflow/test_kafka_under_airflow.py": 30,
    "kafka/test_real_broker.py": 28,
    "kafka/test_compacted_topic.py": 24,
    "spark/test_backfill.py": 23,
    "e2e/test_new_buckets.py": 22,
    "kafka/test_kafka_log.py": 19,
    "airflow/test_web_api.py": 18,
    "kafka/test_spark_kafka_source.py": 18,
    "spark/test_bucketlog_source.py": 18,
    "unit/test_maintenance.py": 16,
    "browser/test_page_zoom_paging.py": 16,
    "kafka/test_kafka_backfill.py": 15,
    "airflow/test_demo_runs.py": 15,
    "kafka/test_kafka_spark.py": 13,
    "spark/test_native_writer.py": 12,
    "spark/test_event_time_backfill.py": 12,
    "spark/test_delta_spark.py": 12,
    "unit/test_exit_after_reading.py": 12,
    "unit/test_sink_commits.py": 12,
    "unit/test_state_store.py": 12,
    "spark/test_user_payload.py": 11,
    "unit/test_engine_protocol.py": 10,
}
"""Seconds each test file took in a whole ``make test`` (setup, calls and teardown under two
workers; ci41, 2026-11-27, ``--durations=0`` summed by file; three files changed after it
scaled by what they gained alone); files not named took less.
Refresh it when a file's time moves by a minute."""


ONE_WORKER_TIERS = ("browser",)
"""Tiers whose files one worker runs, one after the other: their session fixtures (an API
server over a pipeline that ran, 28-48 s to set up in ci41) are set up once for the tier
instead of once per worker that draws one of its files. (The cluster tier's standalone cluster
is started per module: grouping its files gains nothing.)"""


def work_unit(path: str) -> str:
    """What pytest-xdist hands a worker at a time: the test file (``--dist loadfile``), or its
    folder for :data:`ONE_WORKER_TIERS`. ``path`` is the file's path or node id."""
    file = path.split("::", 1)[0]
    folder = file.rpartition("/")[0]
    return folder if folder.rpartition("/")[2] in ONE_WORKER_TIERS else file


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile`` with :func:`work_unit` as its unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class WorkUnitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnitScheduling(config, log)


def _file_order(items: list[pytest.Item]) -> dict[Path, int]:
    """The order two workers take the test files in (``make test`` passes pytest-xdist
    ``--dist loadfile --no-loadscope-reorder``, so a work unit, a file or a tier's folder
    (:func:`work_unit`), is handed out whole, and the workers take them in the order of the
    collected items).

    First the files with an ``exclusive`` test, one after the other, and beside them the unit
    files, which take no lock: the worker running an exclusive test holds the next exclusive
    file too (xdist hands a worker its next file when it has two tests or fewer left), the other
    works through the unit files instead of waiting on the lock. Then every other work unit,
    longest first, so that the two workers end together (the shortest last fill the gap)."""
    marked: dict[Path, set[str]] = {}  # each file, in collection order: its tests' markers
    for item in items:
        names = marked.setdefault(item.path, set())
        names.update(m for m in ("exclusive", "unit") if item.get_closest_marker(m))
    units: dict[str, list[Path]] = {}
    for path in marked:
        units.setdefault(work_unit(path.as_posix()), []).append(path)

    def seconds(path: Path) -> int:
        name = path.as_posix()
        return next((n for f, n in FILE_SECONDS.items() if name.endswith(f"tests/{f}")), 5)

    def longest_first(paths: Iterable[Path]) -> list[Path]:
        """Whole work units, the longest first (stable among equals)."""
        # In collection order, not a set's: every worker must compute the same order.
        chosen = dict.fromkeys(work_unit(path.as_posix()) for path in paths)
        ranked = sorted(chosen, key=lambda unit: -sum(seconds(p) for p in units[unit]))
        return [path for unit in ranked for path in units[unit]]

    exclusive = longest_first(p for p, names in marked.items() if "exclusive" in names)
    unit = longest_first(p for p, names in marked.items() if names == {"unit"})
    rest = longest_first(p for p, names in marked.items() if not names & {"exclusive", "unit"})
    order = [*exclusive[:1], *unit[:1], *exclusive[1:], *unit[1:], *rest]
    return {path: at for at, path in enumerate(order)}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
    order = _file_order(items)
    items.sort(key=lambda item: order[item.path])  # stable: the order within a file is kept


# --- two workers, and tests that run alone ------------------------------------------------------
# `make test` runs the suite in two pytest-xdist workers, a test file to a worker. A test marked
# `exclusive` (its timing is part of what it proves: a latency, a liveness bound, a policy
# threshold scaled to this machine) runs alone, unit tests aside: around its whole protocol
# (setup, call, teardown, so the module and session fixtures it starts or stops too) it holds an
# exclusive lock that every other test but the unit tests holds shared. A gate in front of the
# lock keeps the exclusive test from waiting behind an endless line of shared ones. Unit tests
# take no lock (no JVM, no Spark, no broker, a core at most): they run at the lowest CPU
# priority instead (nice 19, restored after each), so that an exclusive test beside them has
# the machine as if alone and they take only what it leaves idle, and the other worker works
# through the unit files instead of waiting. (ci37: at normal priority beside them, both
# exclusive tests' watermark lags crossed their thresholds.) Only root may restore a priority,
# so elsewhere unit tests hold the lock shared like the others. Without xdist nothing is locked.


@contextlib.contextmanager
def _run_lock(exclusive: bool) -> Iterator[None]:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        yield
        return
    folder = Path(os.environ["MODESWITCH_TESTS_TMP"])
    with (
        open(folder / f"modeswitch-tests-{run}.gate", "a") as gate,
        open(folder / f"modeswitch-tests-{run}.lock", "a") as lock,
    ):
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (every core, /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def _cpu_record(item: pytest.Item) -> Iterator[None]:
    """With MODESWITCH_TEST_CPU=FILE, append each test's wall seconds and the machine's busy
    CPU seconds over it (serial runs on an otherwise idle machine: what the test costs, its
    JVMs included), its start (Unix time), its xdist worker, and the CPU seconds of the test's
    own process and of its children that ended during it (its job processes, its brokers) as a
    tab-separated line to FILE: where the suite's time goes, waiting or working, and when. (In
    session 42's profile the test processes themselves were a quarter of the suite's CPU.)"""
    record = os.environ.get("MODESWITCH_TEST_CPU")
    if not record:
        yield
        return
    began, busy, at = time.monotonic(), _machine_busy_seconds(), time.time()
    own, children = _cpu_seconds(resource.RUSAGE_SELF), _cpu_seconds(resource.RUSAGE_CHILDREN)
    try:
        yield
    finally:
        wall, cpu = time.monotonic() - began, _machine_busy_seconds() - busy
        own = _cpu_seconds(resource.RUSAGE_SELF) - own
        children = _cpu_seconds(resource.RUSAGE_CHILDREN) - children
        with open(record, "a") as out:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
            out.write(
                f"{item.nodeid}\t{wall:.1f}\t{cpu:.1f}\t{at:.0f}\t{worker}"
                f"\t{own:.1f}\t{children:.1f}\n"
            )


def _cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if item.get_closest_marker("unit") is not None and os.geteuid() == 0:
        lock = _lowest_priority()
    else:
        lock = _run_lock(item.get_closest_marker("exclusive") is not None)
    with lock, _cpu_record(item):
        return (yield)


@contextlib.contextmanager
def _lowest_priority() -> Iterator[None]:
    """This thread (the test's) and what it starts at nice 19 for a while, under xdist."""
    if not os.environ.get("PYTEST_XDIST_TESTRUNUID"):
        yield
        return
    before = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, 19)
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)
