"""Faults across containers (make soak-compose): during a live cycle on the compose stack, at
seeded random moments, each of the scheduler, the triggerer, the engine, a Spark worker and
PostgreSQL (and the broker, on a topic) is SIGKILLed and started again, and a Spark worker and
the engine are cut from the compose network for 20-60 s and joined again. After the last
fault the pipeline converges: every container healthy, a stream epoch running, then a pause
that closes it within a bounded time, and the audit finds every record exactly once.

Seeds: MODESWITCH_COMPOSE_FAULT_SEEDS (comma-separated; default one). The table of what ran
is printed (-rP) and kept in docs/RELIABILITY.md."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import time

import pytest
from rich.console import Console

from modeswitch.devtools.compose import (
    PROJECT,
    Stack,
    demo_variables,
    epochs,
    host_settings,
    live_producer,
    pause,
    prepare,
    summary_in_stack,
    wait_for,
)
from modeswitch.ops.verify import audit

pytestmark = [pytest.mark.compose, pytest.mark.soak, pytest.mark.timeout(3600)]

SEEDS = [int(s) for s in os.environ.get("MODESWITCH_COMPOSE_FAULT_SEEDS", "500").split(",")]
KILLED = ["airflow-scheduler", "airflow-triggerer", "engine", "spark-worker-1", "postgres"]
PARTITIONED = ["spark-worker-2", "engine"]
CONVERGE_WITHIN = 900.0


def container(stack: Stack, service: str) -> str:
    return f"{PROJECT}_{service}_1"


def docker(*args: str) -> None:
    subprocess.run(["docker", *args], check=True, capture_output=True)


ERROR_PATTERN = (
    r'"exc_type": ?"[A-Za-z_.]+", ?"exc_value": ?"[^"]{0,140}'
    r'|[A-Za-z_.]*(Error|Exception): [^"\\]{0,140}'
)
"""An error in a task's log: Airflow's JSON lines (``exc_type``, ``exc_value``) or plain text."""


def task_errors(stack: Stack) -> str:
    """The errors the pipeline's failed task tries logged (in the scheduler's container: its
    LocalExecutor runs them), counted: each names what it could not reach."""
    return stack.run(
        "exec", "-T", "-e", f"PATTERN={ERROR_PATTERN}", "airflow-scheduler", "sh", "-c",
        'grep -rhoE "$PATTERN" /opt/airflow/logs | sort | uniq -c | sort -rn | head -12',
        capture=True, check=False,
    )  # fmt: skip


def kill_and_start(stack: Stack, service: str, rng: random.Random) -> str:
    docker("kill", "--signal", "KILL", container(stack, service))
    down = rng.uniform(2, 10)
    time.sleep(down)
    docker("start", container(stack, service))
    return f"SIGKILL, started {down:.0f} s later"


def partition(stack: Stack, service: str, rng: random.Random) -> str:
    network = f"{PROJECT}_default"
    docker("network", "disconnect", "--force", network, container(stack, service))
    cut = rng.uniform(20, 60)
    time.sleep(cut)
    docker("network", "connect", "--alias", service, network, container(stack, service))
    return f"cut from the network for {cut:.0f} s"


@pytest.mark.parametrize("seed", SEEDS)
def test_the_pipeline_converges_exactly_once_after_faults_in_every_container(seed) -> None:
    console = Console(width=120)
    rng = random.Random(seed)
    kafka = seed % 2 == 1  # odd seeds on a topic, with the broker among the killed
    stack = Stack(kafka=kafka, console=console)
    faults = [(s, kill_and_start) for s in KILLED + (["kafka"] if kafka else [])]
    faults += [(s, partition) for s in PARTITIONED]
    rng.shuffle(faults)
    settings = host_settings(stack.source, demo_variables())
    table = []
    try:
        stack.up(fresh=True)
        prepare(stack, ["--records", "300000", "--span", "1h", "--seed", "7"])
        with live_producer(stack):
            for dag in ("modeswitch_control", "modeswitch_pipeline"):
                stack.airflow("dags", "unpause", dag)
            for service, fault in faults:
                time.sleep(rng.uniform(5, 30))
                running = [e.id for e in epochs(settings) if e.running]
                what = fault(stack, service, rng)
                table.append((service, what, f"epoch {running[0] if running else '-'}"))
                console.print(f"fault: {service}: {what} (running: {running})")
            last_fault = time.monotonic()
            stack.wait_healthy(CONVERGE_WITHIN)
            newest = max((e.id for e in epochs(settings)), default=0)
            wait_for(
                "a stream epoch running after the faults",
                lambda: (
                    any(e.running and e.mode == "stream" for e in epochs(settings))
                    and max(e.id for e in epochs(settings)) >= newest
                ),
                console,
                timeout=CONVERGE_WITHIN,
            )
        pause(stack, settings, "faults: the end", console, CONVERGE_WITHIN)
        converged = time.monotonic() - last_fault
        ran = epochs(settings)
        for before, after in itertools.pairwise(ran):
            assert before.end == after.start, (before.id, after.id)  # every handoff exact
        if kafka:  # the topic is on the compose network: the audit runs there
            assert summary_in_stack(stack) == 0
        else:
            report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
            assert report.ok, report.totals
        console.print(f"seed {seed}: {len(ran)} epochs, converged {converged:.0f} s after")
        console.print(f"errors of the failed task tries, counted:\n{task_errors(stack)}")
        for row in table:
            console.print(" | ".join(row))
    finally:
        if os.environ.get("MODESWITCH_KEEP_STACK") != "1":
            stack.down()
