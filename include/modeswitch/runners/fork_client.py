"""What Spark starts for a stream's Python source runner on a driver with a fork server.

Run as ``python -I -S fork_client.py SOCKET -m MODULE`` by the worker launcher
(:mod:`modeswitch.runners.worker_python`) in place of ``python -m MODULE``: it hands its
arguments, environment, working directory and standard streams to the fork server listening
at ``SOCKET`` (:mod:`modeswitch.runners.fork_server`), whose forked child runs ``MODULE``
with them, its imports already done. It then stands for that child, as the process Spark
holds: the signals Spark sends it are passed on, and it exits with the child's status. When
no server answers at ``SOCKET``, it becomes ``python -m MODULE`` itself (``exec``): the same
runner, started the slow way.

Standard library only, no ``site``: it starts in milliseconds, which is its point.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

FRAME = struct.Struct("!I")
"""A message's length before it: the request (JSON), then the child's pid, then its status."""

STREAMS = b"\0"
"""The one byte that carries the client's standard streams (``SCM_RIGHTS``), before the
request."""


def receive(sock: socket.socket) -> bytes | None:
    """One length-prefixed message, or None when the peer closed first."""
    head = _exactly(sock, FRAME.size)
    return None if head is None else _exactly(sock, FRAME.unpack(head)[0])


def _exactly(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        part = sock.recv(size - len(data))  # an interrupted recv is retried by Python itself
        if not part:
            return None
        data += part
    return data


def frame(payload: bytes) -> bytes:
    return FRAME.pack(len(payload)) + payload


def main(argv: list[str]) -> int:
    path, command = argv[0], argv[1:]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        os.execv(sys.executable, [sys.executable, *command])
    request = json.dumps({"argv": command, "env": dict(os.environ), "cwd": os.getcwd()})
    socket.send_fds(sock, [STREAMS], [0, 1, 2])
    sock.sendall(frame(request.encode()))
    answer = receive(sock)
    if answer is None:
        print(f"fork server at {path} closed before starting {command}", file=sys.stderr)
        return 1
    child = int(answer)
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, lambda signum, _frame: os.kill(child, signum))
    status = receive(sock)
    if status is None:
        print(f"fork server at {path} closed while child {child} ran", file=sys.stderr)
        return 1
    code = int(status)
    if code < 0:  # killed by a signal: end the same way
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
