"""The warm engine's server: the long-lived Spark application (``spark-submit jobs/engine.py``)
that runs the epochs of one pipeline, or of every pipeline that shares it, in one session. What
an engine is, how it is found, its protocol, its handoff and its faults:
:mod:`modeswitch.runners.engine`, the client side that the epoch tasks and ``modeswitch run``
use.

**Lanes.** Each pipeline the engine serves is a lane (:class:`Engine`: one epoch at a time,
a retry attaches, the handoff after a batch) run by a thread of its own, named after the
pipeline, whose Spark jobs go to the pipeline's own scheduler pool (the session's scheduler is
FAIR): one pipeline's batch waves cannot hold back another's micro-batches, and one pipeline's
stuck or failing epoch holds up only its own lane. A thread that runs Spark for the session
must first make the session its JVM thread's active one (:func:`bind_thread`): Spark finds a
Python data source (the ``modeswitch_delta`` sink) through the active session only, a JVM
thread-local that only the thread that built the session has (without it, measured with pyspark
4.2: ``DATA_SOURCE_NOT_FOUND modeswitch_delta`` at the writer's start); the stream execution
thread a query starts inherits both the session and the pool. An engine started for one
pipeline (``MODESWITCH_ENGINE_SHARING=pipeline``) refuses the others'; a shared one, or the
deployment's served one, opens a lane for each pipeline that comes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import secrets
import signal
import socketserver
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

from modeswitch.control.settings import PipelineSettings
from modeswitch.control.settings_layers import load_job_settings
from modeswitch.errors import ModeswitchError
from modeswitch.runners.engine import (
    EngineAddress,
    EngineLostError,
    credentials_fingerprint,
)
from modeswitch.runners.fork_server import SourceRunnerForks
from modeswitch.runners.lanes import Engine, Lanes, bind_thread, run_epoch
from modeswitch.runners.worker_python import worker_python

log = logging.getLogger(__name__)

ENGINE_CONF = {"spark.scheduler.mode": "FAIR"}
"""An engine's session: its lanes' jobs share the executors fairly, pool by pool (a pool per
pipeline, :func:`bind_thread`; pools made when first named get weight 1)."""


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        lanes = self.server.lanes
        try:
            request = json.loads(self.rfile.readline() or b"{}")
            token = request.get("token") if isinstance(request, dict) else None
            if not isinstance(token, str) or not secrets.compare_digest(token, self.server.token):
                return self._send(event="refused", error="engine: bad or missing token")
            op, pipeline = request.get("op"), request.get("pipeline")
            if op == "ping":
                running = lanes.running()
                asked = running.get(pipeline or lanes.first) or next(iter(running.values()), None)
                return self._send(
                    event="pong", pid=os.getpid(), running=asked, lanes=running, shared=lanes.shared
                )
            if op not in ("run", "wait"):
                return self._send(event="refused", error=f"engine: unknown op {op!r}")
            kind, epoch, config = request.get("kind"), request.get("epoch"), request.get("config")
            if kind not in ("batch", "stream") or not isinstance(epoch, int):
                return self._send(event="refused", error=f"engine: bad {op} request {request!r}")
            engine = lanes.lane(pipeline if isinstance(pipeline, str) else None)
            if op == "wait":  # attach only: a deferred task's trigger
                future = engine.attached(kind, epoch)
                if future is None:
                    return self._send(
                        event="unknown",
                        error=f"engine pid {os.getpid()} has not run {kind} epoch {epoch}",
                    )
                log.info("engine: a deferred task waits for %s epoch %d", kind, epoch)
            else:
                future = engine.submit(kind, epoch, str(config))
        except (ModeswitchError, ValueError) as exc:
            return self._send(event="refused", error=str(exc))
        self._send(event="running", kind=kind, epoch=epoch)
        try:
            error = future.exception()
        except CancelledError:
            error = EngineLostError(f"the engine stopped before it ran {kind} epoch {epoch}")
        if error is None:
            self._send(event="done", kind=kind, epoch=epoch)
        else:
            detail = "".join(traceback.format_exception_only(error)).strip()
            self._send(
                event="failed",
                kind=kind,
                epoch=epoch,
                error=detail,
                modeswitch=isinstance(error, ModeswitchError),
            )

    def _send(self, **message: Any) -> None:
        with contextlib.suppress(OSError):  # the client went away: the epoch goes on
            self.wfile.write((json.dumps(message) + "\n").encode())
            self.wfile.flush()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, engine: Engine | Lanes, token: str, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        super().__init__((host, port), _Handler)
        self.lanes = engine if isinstance(engine, Lanes) else Lanes.single(engine)
        self.token = token


class StreamPath:
    """Whether the engine's stream path is warm, and the warm-up stream that makes it so
    (:func:`modeswitch.modes.warmup.start_warm_up`): started at the engine's start, it runs in
    Spark's threads beside the first batch epoch, whose request comes at once, instead of
    giving way to it, and beside the first stream epoch if it has not ended by then: stopping
    it cost that stream 0.8 s, and what it had started (the Python workers of the source and
    the sink, the JVM's first compilations) is what the stream needs
    (``bench/bench_airflow_handoff.py``: the first handoff 4.2 s → 2.0 s, medians of 3). It is
    collected once it has ended. The path is warm once a warm-up read the pipeline's own
    source or a stream epoch ran; until then, a warm-up starts beside each batch epoch and
    whenever the engine is left idle after one.

    A Kafka topic that holds nothing yet (the compose stack's engine starts 77 s before its
    demo creates the topic) gets a warm-up on generated events, which warms all but Spark's
    Kafka source (``stand_in``); the path then waits for the topic's records, and the idle
    engine asks for them every :data:`WARM_UP_RETRY_SECONDS`: without that, the first stream
    on the topic started cold, 4.3-5.2 s from the batch's last commit to its first."""

    def __init__(self, spark: Any, runner: Callable[..., None] = run_epoch) -> None:
        self.spark = spark
        self._runner = runner
        self.warming: Any = None  # a WarmingUp
        self.warm = False
        self.awaits_source = False  # a stand-in warmed the rest: the topic's records awaited
        self.asked_at = -math.inf  # when a warm-up was last started or asked for
        self._lock = threading.RLock()  # the first lane's thread, and the main one at the end

    def start(self, settings: PipelineSettings, *, at_once: bool = True) -> None:
        """Start a warm-up if one is due (:func:`warm_up_due`): ``at_once`` at the engine's
        start, beside a batch epoch and when idle after one; otherwise only the periodic ask
        of a path that awaits its topic's records."""
        from modeswitch.modes.warmup import start_warm_up

        with self._lock:
            now = time.monotonic()
            since = now - self.asked_at
            if warm_up_due(self.warm, self.warming is not None, at_once, self.awaits_source, since):
                self.asked_at = now
                self.warming = start_warm_up(self.spark, settings, stand_in=not self.awaits_source)

    def collect(self, *, stop: bool = False) -> None:
        """Collect a warm-up that has ended (or stop it first with ``stop``)."""
        with self._lock:
            if self.warming is not None and (stop or self.warming.ended()):
                warming, self.warming = self.warming, None
                done = warming.finish()
                read = done is not None and done.records > 0
                self.warm = self.warm or (read and not warming.stand_in)
                # Awaited from a stand-in that read its events (none runs while awaiting) to
                # a warm-up on the topic's records, whatever came of it: one that failed
                # leaves the path merely cold, never asked for on a clock.
                self.awaits_source = warming.stand_in and read

    def run(self, kind: str, spark: Any, epoch: int, settings: PipelineSettings) -> None:
        """The engine's epoch runner: a batch epoch of a path not warm yet has a warm-up
        beside it (on Kafka, the batch is the sign that the topic has records)."""
        try:
            if kind == "batch":
                self.start(settings)
            self._runner(kind, spark, epoch, settings)
        finally:
            self.warm = self.warm or kind == "stream"


WARM_UP_RETRY_SECONDS = 10.0
"""How often an idle engine whose stream path awaits its Kafka topic's records asks for them
(a metadata request and each partition's offsets; no Spark job until there are some)."""


def warm_up_due(
    warm: bool, warming: bool, at_once: bool, awaits_source: bool, since_asked: float
) -> bool:
    """Whether to start a warm-up now: the path is not warm and none runs, and either the
    moment asks for one at once (the engine's start, a batch epoch, idle after an epoch) or
    the path awaits its topic's records and last asked :data:`WARM_UP_RETRY_SECONDS` ago or
    more. A path that is merely cold (a warm-up that failed) is not retried on a clock: a
    fault that fails every warm-up would fail one every few seconds."""
    return (
        not warm
        and not warming
        and (at_once or (awaits_source and since_asked >= WARM_UP_RETRY_SECONDS))
    )


def run_lane(
    spark: Any,
    lane: Engine,
    stop: threading.Event,
    path: StreamPath | None = None,
    settings: PipelineSettings | None = None,
) -> None:
    """A lane's thread: bound to the session as its pipeline (:func:`bind_thread`), it runs the
    lane's epochs as they come until ``stop``. The first lane also keeps the stream path warm
    (``path``): a warm-up at once (with ``settings``), beside the first epoch, whose request
    comes at once, and, while the path is not warm, in each idle turn it asks the path
    whether another is due (:meth:`StreamPath.start`). Anything but an epoch's own failure
    (which its future carries) stops the engine."""
    try:
        bind_thread(spark, lane.pipeline)
        latest = settings  # the settings of the lane's latest epoch: a warm-up's
        if path is not None and latest is not None:
            path.start(latest)
        while not stop.is_set():
            if path is not None:
                path.collect()
            ran = lane.run_next(timeout=0.5)
            latest = ran[1] if ran is not None else latest
            if path is not None and latest is not None and not lane.pending():
                path.start(latest, at_once=ran is not None)  # idle: a warm-up if one is due
    except BaseException:
        log.exception("engine: the lane of pipeline %s stopped; stopping the engine", lane.pipeline)
        stop.set()


def serve(
    spark: Any,
    settings: PipelineSettings,
    address_file: Path | None,
    *,
    listen: tuple[str, int] | None = None,
    token: str | None = None,
    shared: bool = False,
) -> None:
    """Serve epochs until SIGTERM or SIGINT: open the first pipeline's lane (its warm-up at
    once), bind, write the address, open a lane for each pipeline that comes (``shared``).
    A warm engine binds a free port on loopback with a token of its own and writes both to
    ``address_file``; a served one binds ``listen`` and requires ``token``
    (:mod:`modeswitch.runners.served`)."""
    path = StreamPath(spark)
    stop = threading.Event()

    def make(pipeline: str) -> Engine:
        return Engine(spark, pipeline, path.run if pipeline == settings.pipeline else run_epoch)

    def start(lane: Engine) -> None:
        first = lane.pipeline == settings.pipeline
        threading.Thread(
            target=run_lane,
            args=(spark, lane, stop, path if first else None, settings if first else None),
            name=f"lane-{lane.pipeline}",
            daemon=True,
        ).start()

    lanes = Lanes(settings.pipeline, make, start, shared=shared)
    lanes.lane(settings.pipeline)
    server = (
        _Server(lanes, secrets.token_urlsafe(24))
        if listen is None
        else _Server(lanes, str(token), *listen)
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    thread = threading.Thread(target=server.serve_forever, name="engine-server", daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    address = EngineAddress(
        pipeline=settings.pipeline,
        state_root=settings.state_root,
        pid=os.getpid(),
        pgid=os.getpgid(0),
        host=str(host),
        port=int(port),
        token=server.token,
        credentials=credentials_fingerprint(os.environ),
        shared=shared,
    )
    if address_file is not None:
        address.write(address_file)
    log.info(
        "engine of pipeline %s%s: listening on %s:%d",
        settings.pipeline,
        " (shared)" if shared else "",
        host,
        port,
    )
    try:
        while not stop.wait(0.5):
            pass
    finally:
        log.info("engine: stopping")
        stop.set()
        server.shutdown()
        if address_file is not None and EngineAddress.read(address_file) == address:
            address_file.unlink(missing_ok=True)
        lanes.close()
        path.collect(stop=True)


def main(argv: list[str] | None = None) -> int:
    """``spark-submit jobs/engine.py --pipeline P --config SETTINGS --address-file PATH``, or
    ``--listen`` (at ``MODESWITCH_ENGINE_ADDRESS``, with ``MODESWITCH_ENGINE_TOKEN``) for the
    deployment's served engine."""
    from modeswitch.environment import ENGINE_ADDRESS, ENGINE_TOKEN, env_value
    from modeswitch.runners.jobs import LOG_FORMAT, job_spark_conf
    from modeswitch.runners.session import create_spark_session

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    parser = argparse.ArgumentParser(description="the pipeline's warm engine")
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--config", required=True, help="resolved settings (file or JSON)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--address-file", help="where to write the address")
    parser.add_argument(
        "--shared", action="store_true", help="serve every pipeline that comes, a lane each"
    )
    where.add_argument(
        "--listen",
        action="store_true",
        help=f"serve at ${ENGINE_ADDRESS.name} (all interfaces on its port), with "
        f"${ENGINE_TOKEN.name}",
    )
    args = parser.parse_args(argv)
    listen, token = None, None
    if args.listen:
        address, token = env_value(ENGINE_ADDRESS), env_value(ENGINE_TOKEN)
        if address is None or not token:
            parser.error(f"--listen needs {ENGINE_ADDRESS.name} and {ENGINE_TOKEN.name}")
        listen = ("0.0.0.0", address[1])
    spark = None
    try:
        settings = load_job_settings(args.config, pipeline=args.pipeline)
        shared = args.shared or args.listen  # the deployment's served engine serves them all
        spark = create_spark_session(
            f"modeswitch-{'shared' if shared else args.pipeline}-engine",
            conf={**job_spark_conf("batch", settings), **ENGINE_CONF},
        )
        file = Path(args.address_file) if args.address_file else None
        with SourceRunnerForks(spark, worker_python()):  # each query's source runner, forked
            serve(spark, settings, file, listen=listen, token=token, shared=shared)
        return 0
    except ModeswitchError as exc:
        log.error("engine of pipeline %s failed: %s", args.pipeline, exc)
        return 1
    finally:
        if spark is not None:
            spark.stop()


if __name__ == "__main__":
    sys.exit(main())
