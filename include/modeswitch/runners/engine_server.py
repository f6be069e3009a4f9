"""The warm engine's server: the long-lived Spark application (``spark-submit jobs/engine.py``)
that runs a pipeline's epochs one at a time in one session. What an engine is, how it is found,
its protocol, its handoff and its faults: :mod:`modeswitch.runners.engine`, the client side
that the epoch tasks and ``modeswitch run`` use."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import queue
import secrets
import signal
import socketserver
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from pathlib import Path
from typing import Any

from modeswitch.control.settings import PipelineSettings
from modeswitch.control.settings_layers import load_job_settings
from modeswitch.errors import ModeswitchError
from modeswitch.runners.engine import (
    EngineAddress,
    EngineLostError,
    EngineRefusedError,
    credentials_fingerprint,
)

log = logging.getLogger(__name__)

ENDED_KEPT = 16
"""Epochs that ran to their end, remembered so that a task that comes for one after its end
is told it is done (:meth:`Engine.submit`); epoch ids only grow, so a few suffice."""


class Engine:
    """Runs one epoch at a time in one session; a ``run`` of the running epoch attaches.

    The epochs run in the thread that calls :meth:`run_next` (the driver's main thread: a
    stream started from another Python thread does not find the session's Python data
    sources, measured with pyspark 4.2); the request handlers only queue them and wait."""

    def __init__(
        self,
        spark: Any,
        pipeline: str,
        runner: Callable[..., None] | None = None,
        *,
        handoff: bool = True,
    ):
        self.spark = spark
        self.pipeline = pipeline
        self.handoff = handoff
        self._runner = runner or _run_epoch
        self._lock = threading.Lock()
        self._running: tuple[str, int, Future] | None = None
        self._ended: dict[tuple[str, int], Future] = {}  # the last epochs that ran to their end
        self._queue: queue.Queue[tuple[str, int, PipelineSettings, Future]] = queue.Queue()

    def running(self) -> tuple[str, int] | None:
        with self._lock:
            if self._running is None or self._running[2].done():
                return None
            return self._running[0], self._running[1]

    def submit(self, kind: str, epoch: int, config: str) -> Future:
        """Run ``kind`` epoch ``epoch``, or attach to it: while it runs, and once it has run
        to its end here (a stream the engine handed a batch over to may stop, on a command or
        its policy, before the next DAG run's task comes for it; running it again would lose
        why it stopped). An epoch whose run failed runs again (a task's retry)."""
        with self._lock:
            ended = self._ended.get((kind, epoch))
            if ended is not None:
                log.info("engine: %s epoch %d already ran to its end here", kind, epoch)
                return ended
            if self._running is not None and not self._running[2].done():
                running_kind, running_epoch, future = self._running
                if (running_kind, running_epoch) == (kind, epoch):
                    log.info("engine: attached to %s epoch %d, still running", kind, epoch)
                    return future
                raise EngineRefusedError(
                    f"engine of pipeline {self.pipeline!r} is running {running_kind} epoch "
                    f"{running_epoch}; {kind} epoch {epoch} waits for it to end"
                )
            return self._enqueue(kind, epoch, load_job_settings(config, pipeline=self.pipeline))

    def attached(self, kind: str, epoch: int) -> Future | None:
        """The run of ``kind`` epoch ``epoch`` here, to wait on: the one running, the last one
        that ended (failed or not), or one of the epochs that ran to their end; None if this
        engine has not run it (it was restarted since, or was never asked)."""
        with self._lock:
            ended = self._ended.get((kind, epoch))
            if ended is not None:
                return ended
            if self._running is not None and self._running[:2] == (kind, epoch):
                return self._running[2]
            return None

    def _enqueue(self, kind: str, epoch: int, settings: PipelineSettings) -> Future:
        """Make ``kind`` epoch ``epoch`` the running one and queue it (``_lock`` held)."""
        future: Future = Future()
        self._running = (kind, epoch, future)
        self._queue.put((kind, epoch, settings, future))
        return future

    def pending(self) -> bool:
        """Whether an epoch waits to run."""
        return not self._queue.empty()

    def run_next(self, timeout: float) -> tuple[str, PipelineSettings] | None:
        """Run the next queued epoch, if one comes within ``timeout`` seconds; returns its
        kind and settings."""
        try:
            kind, epoch, settings, future = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if not future.set_running_or_notify_cancel():
            return None
        log.info("engine: running %s epoch %d", kind, epoch)
        try:
            self._runner(kind, self.spark, epoch, settings)
        except BaseException as exc:
            future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return kind, settings
        stream = self._hand_off(epoch, settings) if kind == "batch" and self.handoff else None
        with self._lock:
            self._ended[(kind, epoch)] = future
            while len(self._ended) > ENDED_KEPT:
                del self._ended[next(iter(self._ended))]
            if stream is not None:
                log.info("engine: handing off to stream epoch %d at once", stream)
                self._enqueue("stream", stream, settings)
        # Told done only now: the batch's task ends with its epoch closed and the stream
        # queued, so the next DAG run's decide re-attaches what the engine opened.
        future.set_result(None)
        return kind, settings

    def _hand_off(self, batch_epoch: int, settings: PipelineSettings) -> int | None:
        """After a batch epoch: close it and, if the policy (or a pending command) chooses
        stream, open the stream epoch, without waiting for the next DAG run; returns its id
        (the caller queues it at once). That run's ``decide`` re-attaches the open epoch and
        its ``stream`` task attaches to the run queued; a ``close_epoch`` task finds the batch
        epoch closed. Whatever decides batch or pause is left to the next DAG run."""
        from modeswitch.runners.lifecycle import hand_off_to_stream

        try:
            return hand_off_to_stream(settings, batch_epoch, decided_by="engine")
        except Exception as exc:  # the next DAG run decides as always
            log.warning("engine: no handoff after batch epoch %d: %s", batch_epoch, exc)
        return None

    def close(self) -> None:
        while not self._queue.empty():
            self._queue.get_nowait()[3].cancel()


def _run_epoch(kind: str, spark: Any, epoch: int, settings: PipelineSettings) -> None:
    from modeswitch.runners.jobs import run

    run(kind, spark, settings, epoch=epoch)  # type: ignore[arg-type]


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        engine = self.server.engine
        try:
            request = json.loads(self.rfile.readline() or b"{}")
            token = request.get("token") if isinstance(request, dict) else None
            if not isinstance(token, str) or not secrets.compare_digest(token, self.server.token):
                return self._send(event="refused", error="engine: bad or missing token")
            op = request.get("op")
            if op == "ping":
                return self._send(event="pong", pid=os.getpid(), running=engine.running())
            if op not in ("run", "wait"):
                return self._send(event="refused", error=f"engine: unknown op {op!r}")
            kind, epoch, config = request.get("kind"), request.get("epoch"), request.get("config")
            if kind not in ("batch", "stream") or not isinstance(epoch, int):
                return self._send(event="refused", error=f"engine: bad {op} request {request!r}")
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

    def __init__(self, engine: Engine, token: str, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), _Handler)
        self.engine = engine
        self.token = token


class StreamPath:
    """Whether the engine's stream path is warm, and the warm-up stream that makes it so
    (:func:`modeswitch.modes.warmup.start_warm_up`): started at the engine's start, it runs in
    Spark's threads beside the first batch epoch, whose request comes at once, instead of
    giving way to it, and beside the first stream epoch if it has not ended by then: stopping
    it cost that stream 0.8 s, and what it had started (the Python workers of the source and
    the sink, the JVM's first compilations) is what the stream needs
    (``bench/bench_airflow_handoff.py``: the first handoff 4.2 s → 2.0 s, medians of 3). It is
    collected once it has ended. The path is warm once a warm-up read its records or a stream
    epoch ran; until then, an engine left idle after a batch starts another warm-up."""

    def __init__(self, spark: Any, runner: Callable[..., None] = _run_epoch) -> None:
        self.spark = spark
        self._runner = runner
        self.warming: Any = None  # a WarmingUp
        self.warm = False

    def start(self, settings: PipelineSettings) -> None:
        from modeswitch.modes.warmup import start_warm_up

        if not self.warm and self.warming is None:
            self.warming = start_warm_up(self.spark, settings)

    def collect(self, *, stop: bool = False) -> None:
        """Collect a warm-up that has ended (or stop it first with ``stop``)."""
        if self.warming is not None and (stop or self.warming.ended()):
            done, self.warming = self.warming.finish(), None
            self.warm = self.warm or (done is not None and done.records > 0)

    def run(self, kind: str, spark: Any, epoch: int, settings: PipelineSettings) -> None:
        """The engine's epoch runner."""
        try:
            self._runner(kind, spark, epoch, settings)
        finally:
            self.warm = self.warm or kind == "stream"


def serve(
    spark: Any,
    settings: PipelineSettings,
    address_file: Path | None,
    *,
    listen: tuple[str, int] | None = None,
    token: str | None = None,
) -> None:
    """Serve epochs until SIGTERM or SIGINT: bind, start the warm-up, write the address,
    run what comes. A warm engine binds a free port on loopback with a token of its own and
    writes both to ``address_file``; a served one binds ``listen`` and requires ``token``
    (:mod:`modeswitch.runners.served`)."""
    path = StreamPath(spark)
    engine = Engine(spark, settings.pipeline, path.run)
    server = (
        _Server(engine, secrets.token_urlsafe(24))
        if listen is None
        else _Server(engine, str(token), *listen)
    )
    stop = threading.Event()
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
    )
    if address_file is not None:
        address.write(address_file)
    log.info("engine of pipeline %s: listening on %s:%d", settings.pipeline, host, port)
    try:
        path.start(settings)  # beside the first epoch, which its task asks for at once
        while not stop.is_set():
            path.collect()
            ran = engine.run_next(timeout=0.5)
            if ran is not None and not engine.pending():
                path.start(ran[1])  # idle after an epoch and not warm yet: warm it now
    finally:
        log.info("engine: stopping")
        server.shutdown()
        if address_file is not None and EngineAddress.read(address_file) == address:
            address_file.unlink(missing_ok=True)
        engine.close()
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
        spark = create_spark_session(
            f"modeswitch-{args.pipeline}-engine", conf=job_spark_conf("batch", settings)
        )
        file = Path(args.address_file) if args.address_file else None
        serve(spark, settings, file, listen=listen, token=token)
        return 0
    except ModeswitchError as exc:
        log.error("engine of pipeline %s failed: %s", args.pipeline, exc)
        return 1
    finally:
        if spark is not None:
            spark.stop()


if __name__ == "__main__":
    sys.exit(main())
