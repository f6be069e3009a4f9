"""The warm engine: one long-lived Spark application per pipeline that runs its epochs.

Every epoch job started with spark-submit pays for a JVM, a Spark session, Python workers and
its first queries' compilation before its first commit (22-34 s from a batch's last commit to
the next stream's first on the Airflow path). With the ``engine`` setting ``warm`` the epoch
tasks hand their epoch to the pipeline's engine instead: ``spark-submit jobs/engine.py`` (the
same connection, conf and environment as an epoch job), whose session runs a warm-up stream
at its start and then every batch and stream epoch it is given, one at a time. What the first
epoch paid for, the next does not.

- **Finding it.** The engine listens on loopback and writes its address, process group and a
  token to :func:`engine_file` (a local file, mode 0600; ``MODESWITCH_ENGINE_DIR`` sets the
  folder). A task that finds no live engine there starts one (under a file lock: one start at
  a time) and waits for it to answer.
- **Protocol.** One JSON line per request, answered with JSON lines: ``ping`` → ``pong``;
  ``run`` (``kind``, ``epoch``, ``config``) → ``running``, then ``done`` or ``failed`` with the
  error. A ``run`` of the epoch already running attaches to it (an Airflow retry after its task
  was killed); any other ``run`` while one runs is ``refused``.
- **The handoff.** When a batch epoch ends in the engine, the engine closes it and, if
  ``decide`` chooses stream, opens the stream epoch and starts it at once (decided by
  ``engine``), all before it tells the batch's task it is done: the next DAG run's ``decide``
  re-attaches that epoch and its ``stream`` task attaches to it. The batch's last commit is
  then followed by the stream's first within the engine, not after five Airflow tasks. A
  decision for batch or a pause is left to the DAG.
- **Faults.** The engine is a process like any job: killed, its connections close, the task
  that waited fails with :class:`EngineLostError`, and its retry starts a new engine and runs
  the epoch again: ``decide`` re-attaches the running epoch, a stream resumes from its
  checkpoint, a batch from the sink's committed offsets; the sink's fencing keeps it exactly
  once. A live process that does not answer is stopped (its process group) and replaced.
- **Credentials.** The engine keeps the environment it started with (a Kafka source's client
  configuration, the tables' storage options). Its address file holds a fingerprint of them
  (:func:`credentials_fingerprint`, a hash); a task whose own differ (a Connection edited,
  a secret rotated) restarts an idle engine before handing it the epoch, and leaves a busy
  one to its epoch, with a warning.
- **Stopping it.** It runs until stopped: :func:`stop_engine` (SIGTERM to its process group,
  then SIGKILL) by whatever runs the deployment (``make demo`` and the tests stop theirs).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import queue
import secrets
import signal
import socket
import socketserver
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import CancelledError, Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from modeswitch.control.settings import PipelineSettings, load_job_settings
from modeswitch.errors import ModeswitchError

log = logging.getLogger(__name__)

ENGINE_DIR_ENV = "MODESWITCH_ENGINE_DIR"
EpochKind = Literal["batch", "stream"]
START_TIMEOUT = 300.0
"""How long a task waits for an engine it started to answer (a JVM, a session, its bind)."""
PING_TIMEOUT = 10.0


class EngineLostError(ModeswitchError):
    """The engine went away (killed, crashed) before it said how the epoch ended."""


class EngineRefusedError(ModeswitchError):
    """The engine is running another epoch."""


@dataclass(frozen=True)
class EngineAddress:
    """What a running engine writes to :func:`engine_file`."""

    pipeline: str
    state_root: str
    pid: int
    pgid: int
    host: str
    port: int
    token: str
    credentials: str = ""  # credentials_fingerprint() of the engine's environment

    @classmethod
    def read(cls, path: Path) -> EngineAddress | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(self), out)
        os.replace(temporary, path)


def credentials_fingerprint(environ: Mapping[str, str]) -> str:
    """A hash of the credentials an engine started with ``environ`` would use (the variables
    the session hands its executors, :data:`modeswitch.runners.session.EXECUTOR_ENVIRONMENT`): equal
    fingerprints, same credentials. The values themselves never leave the process."""
    from modeswitch.runners.session import EXECUTOR_ENVIRONMENT

    chosen = {name: environ.get(name, "") for name in EXECUTOR_ENVIRONMENT}
    return hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()


def engine_file(settings: PipelineSettings) -> Path:
    """Where the pipeline's engine writes its address: one per pipeline and state root."""
    default = Path.home() / ".cache" / "modeswitch" / "engines"
    folder = os.environ.get(ENGINE_DIR_ENV) or str(default)
    digest = hashlib.sha256(settings.state_root.encode()).hexdigest()[:12]
    return Path(folder) / f"{settings.pipeline}-{digest}.json"


# -- the engine (in its spark-submit'ed driver) ----------------------------------------------


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
        self.requested = threading.Event()  # any request: the warm-up gives way
        self._runner = runner or _run_epoch
        self._lock = threading.Lock()
        self._running: tuple[str, int, Future] | None = None
        self._queue: queue.Queue[tuple[str, int, PipelineSettings, Future]] = queue.Queue()

    def running(self) -> tuple[str, int] | None:
        with self._lock:
            if self._running is None or self._running[2].done():
                return None
            return self._running[0], self._running[1]

    def submit(self, kind: str, epoch: int, config: str) -> Future:
        with self._lock:
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
        from modeswitch.runners.lifecycle import close_epoch, decide

        try:
            status, _ = close_epoch(settings, batch_epoch)
            if status != "completed" or decide(settings, dry_run=True).mode != "stream":
                return None
            plan = decide(settings, decided_by="engine")
            if plan.mode == "stream" and plan.epoch is not None:
                return plan.epoch
        except Exception as exc:  # the next DAG run decides as always
            log.warning("engine: no handoff after batch epoch %d: %s", batch_epoch, exc)
        return None

    def close(self) -> None:
        while not self._queue.empty():
            self._queue.get_nowait()[3].cancel()


def _run_epoch(kind: str, spark: Any, epoch: int, settings: PipelineSettings) -> None:
    from modeswitch.runners.jobs import run

    run(kind, spark, argparse.Namespace(epoch=epoch, command=None), settings)  # type: ignore[arg-type]


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        engine = self.server.engine
        try:
            request = json.loads(self.rfile.readline() or b"{}")
            if not isinstance(request, dict) or request.get("token") != self.server.token:
                return self._send(event="refused", error="engine: bad or missing token")
            engine.requested.set()
            op = request.get("op")
            if op == "ping":
                return self._send(event="pong", pid=os.getpid(), running=engine.running())
            if op != "run":
                return self._send(event="refused", error=f"engine: unknown op {op!r}")
            kind, epoch, config = request.get("kind"), request.get("epoch"), request.get("config")
            if kind not in ("batch", "stream") or not isinstance(epoch, int):
                return self._send(event="refused", error=f"engine: bad run request {request!r}")
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

    def __init__(self, engine: Engine, token: str, host: str = "127.0.0.1") -> None:
        super().__init__((host, 0), _Handler)
        self.engine = engine
        self.token = token


def serve(spark: Any, settings: PipelineSettings, address_file: Path) -> None:
    """Serve epochs until SIGTERM or SIGINT: bind, write the address, warm up, wait."""
    from modeswitch.modes.warmup import warm_up

    engine = Engine(spark, settings.pipeline)
    server = _Server(engine, secrets.token_urlsafe(24))
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
    address.write(address_file)
    log.info("engine of pipeline %s: listening on %s:%d", settings.pipeline, host, port)
    try:
        # The stream path is warm once a warm-up ran to its end or a stream epoch ran; a
        # warm-up cut short by the first epoch runs again after it, while the tasks between
        # two epochs (close, decide) run.
        warmed = warm_up(spark, settings, should_stop=engine.requested.is_set)
        stream_warm = warmed is not None and warmed.records > 0
        while not stop.is_set():
            ran = engine.run_next(timeout=0.5)
            if ran is None or stream_warm:
                continue
            kind, latest = ran
            if kind == "stream":
                stream_warm = True
            elif not engine.pending():
                warmed = warm_up(spark, latest, should_stop=engine.pending)
                stream_warm = warmed is not None and warmed.records > 0
    finally:
        log.info("engine: stopping")
        server.shutdown()
        if EngineAddress.read(address_file) == address:
            address_file.unlink(missing_ok=True)
        engine.close()


def main(argv: list[str] | None = None) -> int:
    """``spark-submit jobs/engine.py --pipeline P --config SETTINGS --address-file PATH``."""
    from modeswitch.runners.jobs import LOG_FORMAT, job_spark_conf
    from modeswitch.runners.session import create_spark_session

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    parser = argparse.ArgumentParser(description="the pipeline's warm engine")
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--config", required=True, help="resolved settings (file or JSON)")
    parser.add_argument("--address-file", required=True, help="where to write the address")
    args = parser.parse_args(argv)
    spark = None
    try:
        settings = load_job_settings(args.config, pipeline=args.pipeline)
        spark = create_spark_session(
            f"modeswitch-{args.pipeline}-engine", conf=job_spark_conf("batch", settings)
        )
        serve(spark, settings, Path(args.address_file))
        return 0
    except ModeswitchError as exc:
        log.error("engine of pipeline %s failed: %s", args.pipeline, exc)
        return 1
    finally:
        if spark is not None:
            spark.stop()


# -- the client (in an epoch task) -----------------------------------------------------------


def _exchange(
    address: EngineAddress, request: dict[str, Any], timeout: float | None
) -> Iterator[dict]:
    """Send one request; yield the answers until the engine closes the connection."""
    with socket.create_connection((address.host, address.port), timeout=timeout) as conn:
        conn.sendall((json.dumps({**request, "token": address.token}) + "\n").encode())
        with conn.makefile("rb") as answers:
            for line in answers:
                yield json.loads(line)


def ping(address: EngineAddress) -> dict[str, Any]:
    """The engine's answer to a ping (``pid``, ``running``: the epoch it runs, if any)."""
    answers = list(_exchange(address, {"op": "ping"}, PING_TIMEOUT))
    if not answers or answers[0].get("event") != "pong":
        raise OSError(f"engine on {address.host}:{address.port} answered {answers!r}")
    return answers[0]


def live_engine(settings: PipelineSettings) -> EngineAddress | None:
    """The pipeline's engine if it runs and answers; a process that runs but does not answer
    is stopped. None if there is none."""
    path = engine_file(settings)
    address = EngineAddress.read(path)
    if address is None:
        return None
    if not _alive(address.pid):
        path.unlink(missing_ok=True)
        return None
    try:
        ping(address)
        return address
    except (OSError, ValueError):
        pass
    log.warning(
        "engine pid %d does not answer on %s:%d: stopping it",
        address.pid,
        address.host,
        address.port,
    )
    stop_engine(settings)
    return None


def ensure_engine(
    settings: PipelineSettings,
    start: Callable[[Path], Any],
    *,
    credentials: str | None = None,
    timeout: float = START_TIMEOUT,
) -> EngineAddress:
    """The pipeline's live engine, started with ``start(address_file)`` if there is none (one
    process at a time starts it: a lock file beside the address). ``credentials``: the
    :func:`credentials_fingerprint` ``start`` would give a new engine; an idle engine with
    other credentials is stopped and started anew."""
    path = engine_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        address = live_engine(settings)
        if address is not None and credentials not in (None, address.credentials):
            busy = ping(address).get("running")
            if busy:
                log.warning(
                    "engine pid %d started with other credentials than this task's; it runs "
                    "%s epoch %s, so it keeps them until it is restarted",
                    address.pid,
                    *busy,
                )
            else:
                log.info("engine pid %d: its credentials changed; restarting it", address.pid)
                stop_engine(settings)
                address = None
        if address is not None:
            return address
        path.unlink(missing_ok=True)
        log.info("starting the engine of pipeline %s", settings.pipeline)
        process = start(path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            address = live_engine(settings)
            if address is not None:
                log.info("engine of pipeline %s is up (pid %d)", settings.pipeline, address.pid)
                return address
            if process is not None and process.poll() is not None:
                raise EngineLostError(
                    f"the engine of pipeline {settings.pipeline!r} exited with status "
                    f"{process.returncode} before it answered"
                )
            time.sleep(0.5)
        raise EngineLostError(
            f"the engine of pipeline {settings.pipeline!r} did not answer within {timeout:.0f} s"
        )


def run_on_engine(address: EngineAddress, kind: EpochKind, epoch: int, config: str) -> None:
    """Have the engine run ``kind`` epoch ``epoch`` and wait for its end; raises
    :class:`ModeswitchError` if it failed, :class:`EngineRefusedError` if the engine runs
    another epoch, :class:`EngineLostError` if the engine went away first."""
    request = {"op": "run", "kind": kind, "epoch": epoch, "config": config}
    try:
        for answer in _exchange(address, request, None):
            event = answer.get("event")
            if event == "running":
                log.info("engine pid %d: running %s epoch %d", address.pid, kind, epoch)
            elif event == "done":
                return
            elif event == "failed":
                raise ModeswitchError(
                    f"{kind} epoch {epoch} failed in the engine: {answer['error']}"
                )
            elif event == "refused":
                raise EngineRefusedError(answer.get("error", "refused"))
    except OSError as exc:
        raise EngineLostError(
            f"the engine (pid {address.pid}) went away while running {kind} epoch {epoch}: "
            f"{exc}; the task's retry starts a new one and re-attaches the epoch"
        ) from exc
    raise EngineLostError(
        f"the engine (pid {address.pid}) went away while running {kind} epoch {epoch}; the "
        "task's retry starts a new one and re-attaches the epoch"
    )


def stop_engine(settings: PipelineSettings, *, grace: float = 20.0) -> bool:
    """Stop the pipeline's engine: SIGTERM to its driver, which stops its session (and so its
    JVM) and exits; then, after at most ``grace`` seconds, SIGKILL to its whole process group,
    whatever is left. Returns whether there was one."""
    path = engine_file(settings)
    address = EngineAddress.read(path)
    if address is None:
        return False
    # Not the group first: a JVM that receives SIGTERM beside its driver leaves the driver's
    # session stop waiting on it (seen: the whole grace).
    with contextlib.suppress(ProcessLookupError):
        os.kill(address.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(address.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(address.pgid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    return True


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


if __name__ == "__main__":
    sys.exit(main())
