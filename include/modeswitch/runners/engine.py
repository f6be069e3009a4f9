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
  was killed); any other ``run`` while one runs is ``refused``. ``wait`` (``kind``, ``epoch``)
  only attaches: ``running``, then ``done`` or ``failed``, or ``unknown`` if this engine has
  not run that epoch (it was restarted since).
- **Deferred tasks.** An Airflow task hands its epoch over (:func:`start_on_engine`: back once
  the engine answers ``running``) and defers to :class:`~modeswitch.airflow.triggers.
  EngineEpochTrigger`, which waits in the triggerer
  (:func:`~modeswitch.runners.served.await_epoch`): the task holds no
  worker slot while the engine runs the epoch. The trigger reads the address file where it
  runs; the engine's token is never in the metadata database.
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
  configuration, the tables' storage options, the schema registry's client configuration). Its
  address file holds a fingerprint of them (:func:`credentials_fingerprint`, a hash); a task
  whose own differ (a Connection edited, a secret rotated) restarts an idle engine before
  handing it the epoch, and leaves a busy one to its epoch, with a warning.
- **Stopping it.** It runs until stopped: :func:`stop_engine` (SIGTERM to its process group,
  then SIGKILL) by whatever runs the deployment (``make demo`` and the tests stop theirs).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from modeswitch.control.settings import PipelineSettings
from modeswitch.environment import ENGINE_DIR, ENGINE_SHARING, env_value
from modeswitch.errors import ModeswitchError
from modeswitch.runners.base import EpochHandle, EpochKind

log = logging.getLogger(__name__)

ENGINE_DIR_ENV = ENGINE_DIR.name
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
    shared: bool = False  # serves every pipeline that comes, a lane each

    @property
    def who(self) -> str:
        """The engine, in words for a message: its process where it runs here (``pid`` > 0),
        else where a served engine is reached."""
        return (
            f"the engine (pid {self.pid})" if self.pid else f"the engine at {self.host}:{self.port}"
        )

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
    """A hash of the credentials an engine started with ``environ`` would use (its driver's and
    its executors', :data:`modeswitch.runners.session.CREDENTIAL_ENVIRONMENT`): equal
    fingerprints, same credentials. The values themselves never leave the process."""
    from modeswitch.runners.session import CREDENTIAL_ENVIRONMENT

    chosen = {name: environ.get(name, "") for name in CREDENTIAL_ENVIRONMENT}
    return hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()


SHARED_FILE = "shared.json"
"""The address file of the engine every pipeline shares (``MODESWITCH_ENGINE_SHARING`` =
``deployment``), in the engines' folder."""


def engine_file(settings: PipelineSettings) -> Path:
    """Where the pipeline's engine writes its address: one per pipeline and state root, or the
    deployment's one engine (:data:`SHARED_FILE`)."""
    if shared_engines():
        return env_value(ENGINE_DIR) / SHARED_FILE
    digest = hashlib.sha256(settings.state_root.encode()).hexdigest()[:12]
    return env_value(ENGINE_DIR) / f"{settings.pipeline}-{digest}.json"


def shared_engines() -> bool:
    """Whether the warm engine is the deployment's, shared by its pipelines."""
    return env_value(ENGINE_SHARING) == "deployment"


def engine_target(address_file: Path) -> list[str]:
    """The engine job's target arguments: where it writes its address, and whether it serves
    every pipeline (``--shared``)."""
    return ["--address-file", str(address_file), *(["--shared"] if shared_engines() else [])]


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
    if not pid_alive(address.pid):
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


def engine_scratch(address_file: Path) -> Path:
    """The engine's Spark scratch (its local dirs and its JVM's ``java.io.tmpdir``,
    :class:`~modeswitch.runners.processes.SparkScratch`) on a local master: a folder beside
    its address file, removed when the engine is stopped, and before a new engine starts (what
    a SIGKILLed one left)."""
    return address_file.with_suffix(".scratch")


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
            if busy and address.shared:
                raise EngineRefusedError(
                    f"pipeline {settings.pipeline!r}: the shared engine (pid {address.pid}) runs "
                    "with other credentials (Kafka configuration, storage options) than this "
                    "pipeline's, and is busy; pipelines that share an engine share their "
                    "credentials (an engine each: MODESWITCH_ENGINE_SHARING=pipeline)"
                )
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
        shutil.rmtree(engine_scratch(path), ignore_errors=True)  # a dead engine's, if any
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


def run_on_engine(
    address: EngineAddress, kind: EpochKind, epoch: int, config: str, pipeline: str = ""
) -> None:
    """Have the engine run ``kind`` epoch ``epoch`` and wait for its end; raises
    :class:`ModeswitchError` if it failed, :class:`EngineRefusedError` if the engine runs
    another epoch, :class:`EngineLostError` if the engine went away first."""
    request = {"op": "run", "kind": kind, "epoch": epoch, "config": config}
    follow_on_engine(address, {**request, "pipeline": pipeline or None})


def wait_on_engine(address: EngineAddress, kind: EpochKind, epoch: int, pipeline: str = "") -> None:
    """Wait for the end of ``kind`` epoch ``epoch``, which the engine was handed
    (:func:`start_on_engine`), without running it again: a run that failed is reported, not
    retried. Raises as :func:`run_on_engine` does, and :class:`EngineLostError` if this engine
    has not run it (it was restarted since)."""
    request = {"op": "wait", "kind": kind, "epoch": epoch, "pipeline": pipeline or None}
    follow_on_engine(address, request)


def follow_on_engine(address: EngineAddress, request: Mapping[str, Any]) -> None:
    """Send ``request`` (``run`` or ``wait`` an epoch) and follow the engine's answers to the
    epoch's end (see :func:`run_on_engine`)."""
    kind, epoch = request["kind"], request["epoch"]
    try:
        for answer in _exchange(address, dict(request), None):
            event = answer.get("event")
            if event == "running":
                log.info("%s: running %s epoch %d", address.who, kind, epoch)
            elif event == "done":
                return
            elif event == "failed":
                raise ModeswitchError(
                    f"{kind} epoch {epoch} failed in the engine: {answer['error']}"
                )
            elif event == "refused":
                raise EngineRefusedError(answer.get("error", "refused"))
            elif event == "unknown":
                raise EngineLostError(
                    f"{answer.get('error', 'the engine does not know the epoch')}; the task's "
                    "retry starts a new one and re-attaches the epoch"
                )
    except OSError as exc:
        raise EngineLostError(
            f"{address.who} went away while running {kind} epoch {epoch}: "
            f"{exc}; the task's retry starts a new one and re-attaches the epoch"
        ) from exc
    raise EngineLostError(
        f"{address.who} went away while running {kind} epoch {epoch}; the "
        "task's retry starts a new one and re-attaches the epoch"
    )


def start_on_engine(
    address: EngineAddress, kind: EpochKind, epoch: int, config: str, pipeline: str = ""
) -> None:
    """Hand ``kind`` epoch ``epoch`` to the engine (or attach to it) and return once the engine
    has taken it, without waiting for its end (:func:`~.served.await_epoch` waits); raises
    :class:`EngineRefusedError` if the engine runs another epoch, :class:`EngineLostError` if
    it went away first."""
    request = {"op": "run", "kind": kind, "epoch": epoch, "config": config}
    request["pipeline"] = pipeline or None  # a shared engine's lane (else the engine's own)
    try:
        answers = _exchange(address, request, PING_TIMEOUT)
        answer = next(answers, {})
        answers.close()  # the engine runs the epoch on: the client going away is not a stop
    except OSError as exc:
        raise EngineLostError(
            f"{address.who} went away before it took {kind} epoch {epoch}: {exc}"
        ) from exc
    if answer.get("event") == "refused":
        raise EngineRefusedError(answer.get("error", "refused"))
    if answer.get("event") != "running":
        raise EngineLostError(f"{address.who} answered {answer!r} to {kind} epoch {epoch}")
    log.info("%s: running %s epoch %d", address.who, kind, epoch)


def stop_engine(settings: PipelineSettings, *, grace: float = 20.0) -> bool:
    """Stop the pipeline's engine: SIGTERM to its driver, which stops its session (and so its
    JVM) and exits; then, after at most ``grace`` seconds, SIGKILL to its whole process group,
    whatever is left. Returns whether there was one."""
    path = engine_file(settings)
    address = EngineAddress.read(path)
    return address is not None and _stop_engine_at(path, address, grace)


def stop_engines_in(folder: str | Path, *, grace: float = 20.0) -> list[str]:
    """Stop every engine whose address file is in ``folder`` (as :func:`stop_engine`): what a
    deployment that set ``MODESWITCH_ENGINE_DIR`` for its tasks does when it stops (``make
    airflow``). Returns the pipelines stopped."""
    stopped = []
    for path in sorted(Path(folder).glob("*.json")):
        address = EngineAddress.read(path)
        if address is not None and _stop_engine_at(path, address, grace):
            stopped.append(address.pipeline)
    return stopped


def _stop_engine_at(path: Path, address: EngineAddress, grace: float) -> bool:
    # Not the group first: a JVM that receives SIGTERM beside its driver leaves the driver's
    # session stop waiting on it (seen: the whole grace).
    with contextlib.suppress(ProcessLookupError):
        os.kill(address.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pid_alive(address.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(address.pgid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    shutil.rmtree(engine_scratch(path), ignore_errors=True)
    return True


def start_local_engine(
    settings: PipelineSettings,
    *,
    env: Mapping[str, str] | None = None,
    log_dir: str | Path | None = None,
) -> Callable[[Path], Any]:
    """How ``modeswitch run`` starts an engine: ``jobs/engine.py`` with this Python, on the
    local master (as the local runner's jobs), in its own process group, its output in
    ``log_dir`` (else beside its address file), its Spark scratch :func:`engine_scratch`. For
    :func:`ensure_engine`."""

    def start(address_file: Path) -> Any:
        from modeswitch.runners.jobs import job_script
        from modeswitch.runners.processes import SparkScratch, start_group
        from modeswitch.runners.submit import job_arguments

        command = [
            sys.executable,
            str(job_script("engine")),
            *job_arguments(
                settings.pipeline,
                engine_target(address_file),
                settings.to_json(),
            ),
        ]
        output = (
            Path(log_dir) / f"engine-{settings.pipeline}.log"
            if log_dir
            else address_file.with_suffix(".log")
        )
        output.parent.mkdir(parents=True, exist_ok=True)
        scratch = SparkScratch(at=engine_scratch(address_file)).environment()
        with open(output, "ab") as out:
            return start_group(command, env={**scratch, **(env or {})}, output=out)

    return start


class EngineRunner:
    """The ``engine`` runner (:mod:`modeswitch.runners.base`): each epoch handed to the
    pipeline's warm engine, started with ``start`` (:func:`ensure_engine`) when none runs.

    ``credentials``: the :func:`credentials_fingerprint` a new engine would have (an idle
    engine with others is restarted). ``owns_engine``: :meth:`stop` stops an engine this
    runner started (``modeswitch run`` stops what it started); an Airflow task leaves it to the
    next task, and the deployment stops it (:func:`stop_engine`)."""

    def __init__(
        self,
        start: Callable[[Path], Any],
        *,
        credentials: str | None = None,
        owns_engine: bool = False,
    ) -> None:
        self.start_engine = start
        self.credentials = credentials
        self.owns_engine = owns_engine
        self.settings: PipelineSettings | None = None
        self.started = False  # whether this runner started the engine that runs

    def _start(self, address_file: Path) -> Any:
        self.started = True
        return self.start_engine(address_file)

    def start(self, kind: EpochKind, settings: PipelineSettings, epoch: int) -> EpochHandle:
        """Hand ``kind`` epoch ``epoch`` to the engine (started if none runs) without waiting
        for its end. The handle's ``wait`` attaches to it until it ends; its address file lets
        a trigger do the same (:func:`~modeswitch.runners.served.await_epoch`)."""
        self.settings = settings
        address = ensure_engine(settings, self._start, credentials=self.credentials)
        start_on_engine(address, kind, epoch, settings.to_json(), settings.pipeline)
        return EpochHandle(
            kind,
            epoch,
            wait=lambda: wait_on_engine(address, kind, epoch, settings.pipeline),
            follow_at=str(engine_file(settings)),
            pipeline=settings.pipeline,
        )

    def alive(self) -> bool:
        return self.settings is not None and live_engine(self.settings) is not None

    def stop(self) -> None:
        if self.owns_engine and self.started and self.settings is not None:
            stop_engine(self.settings)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs here (a zombie does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
