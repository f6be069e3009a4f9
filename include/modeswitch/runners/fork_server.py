"""A fork server for the Python process Spark starts for each stream query's source.

Spark runs a Python data source's streaming reader (``bucketlog``'s) in a process of its own
on the driver, started afresh for every query: ``python -m
pyspark.sql.streaming.python_streaming_source_runner``, a "simple worker", never one forked
from Spark's Python daemon. Its imports alone (pyspark, pyarrow, numpy, the source's module)
took 0.19-0.23 s here, and a query's first micro-batch waits for them: 0.29 s of the warm
engine's 1.4 s handoff passed between the query's start and its first trigger (2026-11-30),
where Spark's own Kafka source, which runs in the JVM, takes about 20 ms.

The server imports those modules once and forks a child per request; the child runs the
module with the requester's arguments, environment, working directory and standard streams,
so it is the process Spark would have started, minus the imports. Spark starts
:mod:`~modeswitch.runners.fork_client` in its place (the worker launcher does, for exactly
the modules in :data:`FORKED_MODULES`), which passes the request on and stands for the child
until it exits. Where no server listens, the client runs the module the usual way: a server
is a speed-up, never a dependency.

One server per driver JVM: it listens at :func:`socket_path` of the JVM's pid (the client
finds it from its parent, the JVM that started it), so sessions in other processes never
share it. :class:`SourceRunnerForks` starts it beside a session and stops it (its process,
by pid, and its socket) when the session ends; the server also leaves by itself once its
parent process is gone. Children are not killed with the server: each ends when Spark closes
its connection, as an unforked runner does.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any

from modeswitch.runners.fork_client import STREAMS, frame, receive
from modeswitch.runners.jvm import cache_root

log = logging.getLogger(__name__)

FORKED_MODULES = ("pyspark.sql.streaming.python_streaming_source_runner",)
"""The modules the launcher hands to a fork server: what Spark starts as a simple worker on
the driver for each stream query whose source is a Python data source."""

PRELOADED = ("modeswitch.sources.spark",)
"""What the server imports before it forks, beside the modules it runs: ``bucketlog``'s
module, which each source runner imports when it unpickles the source."""

READY_TIMEOUT_S = 30.0
MAX_SOCKET_PATH = 107
"""The longest path a Unix socket may have on Linux (``sun_path`` holds 108 bytes)."""


def socket_dir() -> Path:
    """Where fork servers listen: one socket per driver JVM."""
    return cache_root() / "forks"


def socket_path(jvm_pid: int) -> Path:
    """The socket of the fork server for the driver JVM with pid ``jvm_pid``."""
    return socket_dir() / f"{jvm_pid}.sock"


class SourceRunnerForks:
    """A fork server for the Python source runners of ``spark``'s driver JVM, for the span of
    a ``with`` block (or :meth:`start` / :meth:`stop`). Starting does not wait for the server
    to be ready: until it is, runners start unforked."""

    def __init__(self, spark: Any, launcher: str) -> None:
        self.jvm_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
        self.path = socket_path(self.jvm_pid)
        self.launcher = launcher
        self.process: subprocess.Popen | None = None

    def start(self) -> SourceRunnerForks:
        """Start the server, unless Spark's Python workers here do not start through
        ``launcher`` (``PYSPARK_PYTHON``, :func:`~modeswitch.runners.worker_python.worker_python`),
        which alone hands runners to a server."""
        launcher = self.launcher
        if os.environ.get("PYSPARK_PYTHON") != launcher:
            log.info("no fork server: Python workers start as %s", os.environ.get("PYSPARK_PYTHON"))
            return self
        if len(os.fsencode(self.path)) > MAX_SOCKET_PATH:
            log.warning(
                "no fork server: its socket %s is longer than a Unix socket's path may be "
                "(%d bytes); set MODESWITCH_CACHE to a shorter folder",
                self.path,
                MAX_SOCKET_PATH,
            )
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a dead JVM's, whose pid came round again
        # Through the launcher: the server imports what the runners it stands for would.
        self.process = subprocess.Popen(
            [launcher, "-m", __name__, str(self.path)], stdin=subprocess.DEVNULL
        )
        log.info("fork server %d for the source runners of JVM %d", self.process.pid, self.jvm_pid)
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        """Whether the server listens within ``timeout`` seconds (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(self.path))
                return True
            time.sleep(0.02)
        return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def __enter__(self) -> SourceRunnerForks:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


# -- the server --------------------------------------------------------------------------------


def serve(path: str, modules: tuple[str, ...] = FORKED_MODULES) -> None:
    """Import ``modules`` and :data:`PRELOADED`, listen at ``path`` and run each request for
    one of ``modules`` in a forked child, until SIGTERM or until the parent process is
    gone."""
    import importlib

    for module in (*modules, *PRELOADED):
        importlib.import_module(module)
    for module in modules:
        # Its imports stay; its own code runs afresh as each child's __main__ (runpy).
        del sys.modules[module]
    gc.collect()
    gc.freeze()  # the children's reference counting leaves these pages shared
    parent = os.getppid()
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    aside = f"{path}.{os.getpid()}"
    listener.bind(aside)
    os.chmod(aside, 0o600)
    listener.listen(16)
    os.replace(aside, path)  # clients see the socket only once it listens
    children: dict[int, socket.socket] = {}
    with selectors.DefaultSelector() as selector:
        selector.register(listener, selectors.EVENT_READ)
        while not stopping and os.getppid() == parent:
            for _key, _events in selector.select(timeout=0.2):
                connection, _ = listener.accept()
                child = _fork(connection, modules, [listener, *children.values()])
                if child is not None:
                    children[child] = connection
            _reap(children)
    listener.close()


def _fork(
    connection: socket.socket, modules: tuple[str, ...], others: list[socket.socket]
) -> int | None:
    """Fork a child for the request on ``connection`` if it asks for one of ``modules``; its
    pid (also sent back), or None for a request refused (the connection closed). ``others``:
    the server's other sockets, which the child closes."""
    fds: list[int] = []
    try:
        streams, fds, _flags, _address = socket.recv_fds(connection, len(STREAMS), 3)
        if not streams:  # a probe of whether the server listens (SourceRunnerForks.wait_ready)
            connection.close()
            return None
        body = receive(connection)
        if body is None:
            raise ValueError("request cut short")
        request = json.loads(body)
        argv = request["argv"]
        if len(fds) != 3 or len(argv) != 2 or argv[0] != "-m" or argv[1] not in modules:
            raise ValueError(f"not a request to run one of {modules}: {argv}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("fork server: refused a request: %s", exc)
        for fd in fds:
            os.close(fd)
        connection.close()
        return None
    pid = os.fork()
    if pid == 0:
        _run_child(request, fds, [connection, *others])
    for fd in fds:
        os.close(fd)
    connection.sendall(frame(str(pid).encode()))
    return pid


def _run_child(request: dict, fds: list[int], inherited: list[socket.socket]) -> None:
    """In the forked child: become the requested process, run its module, exit."""
    import runpy

    status = 1
    try:
        for sock in inherited:
            sock.close()
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(number, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = [request["argv"][1]]
        runpy.run_module(request["argv"][1], run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


def _reap(children: dict[int, socket.socket]) -> None:
    """Send each exited child's status to its client and close the connection."""
    while children:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = children.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.sendall(frame(str(os.waitstatus_to_exitcode(wait_status)).encode()))
            connection.close()


if __name__ == "__main__":
    serve(sys.argv[1], tuple(sys.argv[2:]) or FORKED_MODULES)
