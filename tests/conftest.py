"""Test tiers: every test is marked by the folder it lives in (unit, spark, airflow, ...)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
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
TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("JAVA_TOOL_OPTIONS", TEST_JAVA_OPTIONS)

TIERS = ("unit", "spark", "airflow", "e2e", "faults", "browser", "kafka", "cluster")


LONGEST_FIRST = (
    "kafka/test_kafka_pipeline.py",
    "faults/test_random_faults.py",
    "faults/test_job_crashes.py",
    "airflow/test_scheduler_run.py",
    "cluster/test_cluster_cycle.py",
    "spark/test_user_delta_commands.py",
    "browser/test_operator_page.py",
    "e2e/test_handoff.py",
    "airflow/test_warm_engine.py",
    "kafka/test_broker_faults.py",
    "airflow/test_backfill_run.py",
    "spark/test_three_readers.py",
    "cluster/test_cluster_kafka.py",
    "spark/test_bucketlog_source.py",
    "airflow/test_stream_retry.py",
    "spark/test_delta_sink.py",
    "spark/test_arrow_parse.py",
    "kafka/test_kafka_cli.py",
    "e2e/test_rewind_pipeline.py",
    "spark/test_maintenance_beside_stream.py",
    "unit/test_state_concurrency.py",
    "unit/test_maintenance.py",
    "e2e/test_new_buckets.py",
    "spark/test_transforms.py",
)
"""Test files that take half a minute or more, longest first (their wall time under two
workers, measured in a whole run). In one process they run first. Two workers take files in
this order only among files of as many tests: pytest-xdist hands out the files with the most
tests first unless given ``--no-loadscope-reorder`` (tried on 2026-11-26, not measured whole)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))

    def rank(item: pytest.Item) -> int:
        path = Path(str(item.fspath)).as_posix()
        return next(
            (at for at, name in enumerate(LONGEST_FIRST) if path.endswith(name)),
            len(LONGEST_FIRST),
        )

    items.sort(key=rank)  # stable: the order within a file, and of the other files, is kept


# --- two workers, and tests that run alone ------------------------------------------------------
# `make test` runs the suite in two pytest-xdist workers, a test file to a worker. A test marked
# `exclusive` (its timing is part of what it proves: a latency, a liveness bound, a policy
# threshold scaled to this machine) runs alone, unit tests aside: around its whole protocol
# (setup, call, teardown, so the module and session fixtures it starts or stops too) it holds an
# exclusive lock that every other test but the unit tests holds shared. A gate in front of the
# lock keeps the exclusive test from waiting behind an endless line of shared ones. Unit tests
# take no lock: no JVM, no Spark, no broker, a core at most, so an exclusive test beside one
# still has a core and more to itself, and the other worker works through the unit files
# instead of waiting. Without xdist nothing is locked.


@contextlib.contextmanager
def _run_lock(exclusive: bool) -> Iterator[None]:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        yield
        return
    folder = Path(tempfile.gettempdir())
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
    JVMs included), its start (Unix time) and its xdist worker as a tab-separated line to
    FILE: where the suite's time goes, waiting or working, and when."""
    record = os.environ.get("MODESWITCH_TEST_CPU")
    if not record:
        yield
        return
    began, busy, at = time.monotonic(), _machine_busy_seconds(), time.time()
    try:
        yield
    finally:
        wall, cpu = time.monotonic() - began, _machine_busy_seconds() - busy
        with open(record, "a") as out:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
            out.write(f"{item.nodeid}\t{wall:.1f}\t{cpu:.1f}\t{at:.0f}\t{worker}\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if item.get_closest_marker("unit") is not None:
        lock = contextlib.nullcontext()
    else:
        lock = _run_lock(item.get_closest_marker("exclusive") is not None)
    with lock, _cpu_record(item):
        return (yield)
