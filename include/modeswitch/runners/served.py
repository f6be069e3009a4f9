"""Reaching an engine from a process that did not start it: the deployment's served engine,
and the follower (an Airflow trigger) of an epoch that any engine runs.

**The served engine.** Where the deployment runs the engine as a service of its own (the
compose stack's ``engine`` container: ``jobs/engine.py --listen``), no task starts one and no
file says where it is: ``MODESWITCH_ENGINE_ADDRESS`` (``HOST:PORT``) names it for the epoch
tasks, the triggerer and the engine alike, and every request carries
``MODESWITCH_ENGINE_TOKEN``, which the engine requires (it refuses to listen without one, and
refuses a request without it). Its process is not on the task's host: whether it is up is
whether it answers a ``ping``. A task that cannot reach it fails naming the address
(:class:`~modeswitch.runners.engine.EngineLostError`) and Airflow's retry tries again; the
engine's own restart (the container's restart policy) re-attaches as after any lost engine.

**Following an epoch** (:func:`await_epoch`): where the runner's handle says
(:attr:`~modeswitch.runners.base.EpochHandle.follow_at`): an engine's address file on this
host, or ``tcp://HOST:PORT`` for a served engine (:func:`engine_at`). The token never travels
with it: the follower reads the served engine's from its own environment, the local engine's
from the address file, so it is never in Airflow's metadata database.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from modeswitch.control.settings import PipelineSettings
from modeswitch.environment import ENGINE_ADDRESS, ENGINE_TOKEN, env_value
from modeswitch.errors import ConfigError
from modeswitch.runners.base import EpochHandle, EpochKind
from modeswitch.runners.engine import (
    EngineAddress,
    EngineLostError,
    pid_alive,
    ping,
    start_on_engine,
    wait_on_engine,
)

SERVED = "tcp://"
"""How :attr:`EpochHandle.follow_at` names a served engine: ``tcp://HOST:PORT``."""


def served_engine() -> str | None:
    """``HOST:PORT`` of the deployment's served engine (``MODESWITCH_ENGINE_ADDRESS``), or None:
    what :func:`~modeswitch.runners.base.runner_choice` is told."""
    where = env_value(ENGINE_ADDRESS)
    return None if where is None else f"{where[0]}:{where[1]}"


def served_address(settings: PipelineSettings) -> EngineAddress | None:
    """The deployment's served engine for ``settings``' pipeline (``MODESWITCH_ENGINE_ADDRESS``
    and ``MODESWITCH_ENGINE_TOKEN`` of this process), or None where none is configured."""
    where = env_value(ENGINE_ADDRESS)
    if where is None:
        return None
    return EngineAddress(
        pipeline=settings.pipeline,
        state_root=settings.state_root,
        pid=0,
        pgid=0,
        host=where[0],
        port=where[1],
        token=env_value(ENGINE_TOKEN) or "",
    )


def engine_at(follow_at: str) -> EngineAddress | None:
    """The engine a follower finds at ``follow_at``: ``tcp://HOST:PORT`` (a served engine, its
    token from this process's ``MODESWITCH_ENGINE_TOKEN``), else an address file (None when it
    holds none)."""
    if follow_at.startswith(SERVED):
        host, _, port = follow_at.removeprefix(SERVED).rpartition(":")
        token = env_value(ENGINE_TOKEN) or ""
        return EngineAddress("", "", pid=0, pgid=0, host=host, port=int(port), token=token)
    return EngineAddress.read(Path(follow_at))


def reachable(address: EngineAddress) -> bool:
    """Whether the engine is up: its process where it runs here, its answer to a ``ping``
    where it is served from elsewhere."""
    if address.pid:
        return pid_alive(address.pid)
    try:
        ping(address)
        return True
    except (OSError, ValueError):
        return False


class ServedEngineRunner:
    """The ``served`` runner (:mod:`modeswitch.runners.base`): each epoch handed to the
    deployment's served engine, which the deployment starts, restarts and stops."""

    def __init__(self) -> None:
        self.address: EngineAddress | None = None

    def start(self, kind: EpochKind, settings: PipelineSettings, epoch: int) -> EpochHandle:
        """Hand ``kind`` epoch ``epoch`` to the served engine without waiting for its end;
        raises :class:`EngineLostError` naming the address if it does not answer."""
        address = self.address = served_address(settings)
        if address is None:
            raise EngineLostError(f"no served engine: {ENGINE_ADDRESS.name} is not set")
        try:
            ping(address)
        except (OSError, ValueError) as exc:
            raise EngineLostError(
                f"{address.who} ({ENGINE_ADDRESS.name}) is out of reach: {exc}; the task's "
                "retry tries again"
            ) from exc
        start_on_engine(address, kind, epoch, settings.to_json(), settings.pipeline)
        return EpochHandle(
            kind,
            epoch,
            wait=lambda: wait_on_engine(address, kind, epoch, settings.pipeline),
            follow_at=f"{SERVED}{address.host}:{address.port}",
            pipeline=settings.pipeline,
        )

    def alive(self) -> bool:
        return self.address is not None and reachable(self.address)

    def stop(self) -> None:
        """Nothing: the served engine is the deployment's."""


async def await_epoch(
    follow_at: str | Path,
    kind: EpochKind,
    epoch: int,
    *,
    check_every: float = 10.0,
    pipeline: str = "",
) -> dict[str, Any]:
    """Wait, in an event loop, for the end of ``kind`` epoch ``epoch`` in the engine found at
    ``follow_at`` (:func:`engine_at`): ``{"status": "done"}``, ``{"status": "failed", "error":
    ...}`` (``modeswitch``: whether it was the pipeline's own error), or ``{"status": "lost",
    "error": ...}`` if there is no engine, it has not run the epoch or it went away. Every
    ``check_every`` seconds without an answer, whether the engine is up is asked again
    (:func:`reachable`): an engine that is gone is lost even if its connection lingers.
    ``pipeline``: whose epoch it is, in an engine that several share (else the engine's own)."""
    where = f"{kind} epoch {epoch}"
    address = engine_at(str(follow_at))
    if address is None or not await asyncio.to_thread(reachable, address):
        return {"status": "lost", "error": f"no engine runs ({follow_at}) to wait for {where}"}
    try:
        reader, writer = await asyncio.open_connection(address.host, address.port, limit=1 << 20)
    except OSError as exc:
        return {"status": "lost", "error": f"{address.who} is out of reach: {exc}"}
    try:
        request = {"op": "wait", "kind": kind, "epoch": epoch, "token": address.token}
        request["pipeline"] = pipeline or None
        writer.write((json.dumps(request) + "\n").encode())
        await writer.drain()
        while True:
            try:
                line = await asyncio.wait_for(reader.readline(), check_every)
            except TimeoutError:
                if not await asyncio.to_thread(reachable, address):
                    return {"status": "lost", "error": f"{address.who} is gone"}
                continue
            if not line:
                return {"status": "lost", "error": f"{address.who} went away while running {where}"}
            answer = json.loads(line)
            event = answer.get("event")
            if event == "done":
                return {"status": "done"}
            if event == "failed":
                return {
                    "status": "failed",
                    "error": f"{where} failed in the engine: {answer.get('error')}",
                    "modeswitch": bool(answer.get("modeswitch")),
                }
            if event in ("unknown", "refused"):
                return {"status": "lost", "error": str(answer.get("error"))}
    except (OSError, ValueError) as exc:
        return {"status": "lost", "error": f"{address.who}: {exc}"}
    finally:
        writer.close()


def serve_command(
    pipeline: str,
    source: str,
    warehouse: str,
    master: str,
    host: str,
    conf: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The served engine's ``spark-submit`` (argv and the environment it adds) for the
    deployment's pipeline on ``master``, its driver reached at ``host``, with the deployment's
    own Spark ``conf`` (on a shared cluster, ``spark.cores.max``: how much of it the engine
    holds): the engine's submit as every job's (:func:`~modeswitch.runners.submit.submit_plan`),
    with ``--listen``."""
    from modeswitch.runners.submit import submit_plan, this_machine

    settings = PipelineSettings.from_mapping(
        {"pipeline": pipeline, "source": source, "warehouse": warehouse}
    )
    plan = submit_plan(
        "engine",
        settings,
        label="engine",
        target=["--listen"],
        config=settings.to_json(),
        machine=this_machine(master),
        own_conf={
            **(conf or {}),
            "spark.driver.host": host,
            "spark.driver.bindAddress": "0.0.0.0",
        },
    )
    confs = [part for key, value in plan.conf.items() for part in ("--conf", f"{key}={value}")]
    argv = ["spark-submit", "--master", master, "--name", plan.name, *confs, plan.application]
    return [*argv, *plan.application_args], plan.env_vars


def spark_conf_pair(pair: str) -> tuple[str, str]:
    """``KEY=VALUE`` as spark-submit's ``--conf`` takes it; anything else refused, naming it."""
    key, sep, value = pair.partition("=")
    if not sep or not key.startswith("spark."):
        raise ConfigError(f"--conf {pair!r}: expected spark.KEY=VALUE")
    return key, value


def main(argv: list[str] | None = None) -> int:
    """``python -m modeswitch.runners.served``: 0 if the served engine answers a ping (the
    container's health check), else 1 with the reason; ``... serve --pipeline P --source S
    --warehouse W``: become the served engine (the compose stack's ``engine`` command)."""
    import argparse
    import os
    import socket
    import sys

    from modeswitch.environment import SPARK_MASTER

    parser = argparse.ArgumentParser(prog="python -m modeswitch.runners.served")
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="run the served engine (spark-submit jobs/engine.py)")
    serve.add_argument("--pipeline", required=True)
    serve.add_argument("--source", required=True)
    serve.add_argument("--warehouse", required=True)
    serve.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark conf of the engine's application (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.command == "serve":
        master = env_value(SPARK_MASTER) or "local[*]"
        conf = dict(spark_conf_pair(pair) for pair in args.conf)
        command, env = serve_command(
            args.pipeline, args.source, args.warehouse, master, socket.gethostname(), conf
        )
        os.execvpe(command[0], command, {**os.environ, **env})
    where = served_engine()
    if where is None:
        print(f"{ENGINE_ADDRESS.name} is not set", file=sys.stderr)
        return 1
    host, _, port = where.rpartition(":")
    address = EngineAddress("", "", 0, 0, host, int(port), env_value(ENGINE_TOKEN) or "")
    try:
        answer = ping(address)
    except (OSError, ValueError) as exc:
        print(f"{address.who}: {exc}", file=sys.stderr)
        return 1
    print(f"{address.who}: up, running {answer.get('running') or 'nothing'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
