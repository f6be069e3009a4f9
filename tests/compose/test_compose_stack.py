"""The compose stack, started for real (make test-compose): every service healthy, one batch ->
stream cycle through the stack's own Airflow and its served engine, the audit exactly once,
the engine refusing a request without its token, and nothing published beyond loopback.
The stack is stopped by its compose project whatever happens."""

from __future__ import annotations

import json
import subprocess

import pytest
from rich.console import Console

from modeswitch.devtools.compose import Stack, epochs, host_settings, run_cycle

pytestmark = [pytest.mark.compose, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def stack():
    stack = Stack(console=Console(width=120))
    try:
        stack.up(fresh=True)
        yield stack
    finally:
        stack.down()


def test_every_published_port_binds_loopback_and_the_engine_is_not_published(stack) -> None:
    ids = stack.run("ps", "--quiet", capture=True).split()
    inspected = json.loads(subprocess.check_output(["docker", "inspect", *ids], text=True))
    published = {}
    for container in inspected:
        service = container["Config"]["Labels"]["com.docker.compose.service"]
        for bindings in (container["HostConfig"]["PortBindings"] or {}).values():
            published[service] = [binding["HostIp"] for binding in bindings]
        assert container["Config"]["User"] == "50000:0" or service in ("postgres",), service
    assert published and all(ips == ["127.0.0.1"] for ips in published.values()), published
    assert "engine" not in published


def test_the_engine_refuses_a_request_without_its_token(stack) -> None:
    probe = (
        "import json, socket; s = socket.create_connection(('engine', 7788), 10); "
        "s.sendall(json.dumps({'op': 'ping', 'token': 'guess'}).encode() + b'\\n'); "
        "print(s.makefile().readline())"
    )
    answer = stack.run("exec", "-T", "airflow-scheduler", "python", "-c", probe, capture=True)
    assert '"refused"' in answer and "token" in answer
    healthy = stack.run(
        "exec", "-T", "airflow-scheduler", "python", "-m", "modeswitch.runners.served",
        capture=True,
    )  # fmt: skip
    assert "engine at engine:7788: up" in healthy


def test_a_batch_then_stream_cycle_lands_every_record_once(stack) -> None:
    status = run_cycle(stack, burst=False, records=200_000, console=stack.console)
    assert status == 0  # the audit: 0 missing, 0 duplicated
    ran = epochs(host_settings(stack.source))
    assert [epoch.mode for epoch in ran][:2] == ["batch", "stream"]
    assert ran[0].end == ran[1].start  # the handoff, exact
    engine_log = stack.logs(["engine"], lines=2000)
    assert "running batch epoch 1" in engine_log or "batch epoch 1" in engine_log


def test_the_engine_leaves_cores_for_a_backfills_job(stack) -> None:
    """The served engine's application holds MODESWITCH_ENGINE_CORES of the cluster, one
    executor core per worker, so that another application (a backfill's spark-submit) gets
    executors while the engine runs, instead of waiting for it to end."""
    status = ["curl", "--silent", "http://localhost:8080/json/"]
    master = json.loads(stack.run("exec", "-T", "spark-master", *status, capture=True))
    engine = [app for app in master["activeapps"] if app["name"].endswith("-engine")]
    assert len(engine) == 1 and engine[0]["state"] == "RUNNING", master["activeapps"]
    assert engine[0]["cores"] == 2
    assert master["cores"] - master["coresused"] >= 2, master
