"""The fork server of the stream's source runners: a forked child is the process the client
stands for (its arguments, environment, folder, streams, exit status and signals), the client
runs the module itself where no server listens, and the launcher routes only the source
runner to a server. Real processes, a probe module in place of Spark's runner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from modeswitch.runners import fork_client
from modeswitch.runners.fork_server import FORKED_MODULES, socket_path
from modeswitch.runners.worker_python import worker_python

PROBE = """
import json, os, sys, time

if __name__ == "__main__":
    print(json.dumps({
        "argv": sys.argv,
        "pid": os.getpid(),
        "parent": os.getppid(),
        "cwd": os.getcwd(),
        "asked": os.environ.get("PROBE"),
        "preloaded": "modeswitch.sources.spark" in sys.modules,
    }), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if os.environ.get("PROBE") == "sleep":
        time.sleep(60)
    sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "fork_probe.py").write_text(PROBE)
    return folder


@pytest.fixture
def server(tmp_path: Path, probe: Path):
    """A fork server for the probe module, at a socket of its own."""
    path = tmp_path / "server.sock"
    process = subprocess.Popen(
        [sys.executable, "-m", "modeswitch.runners.fork_server", str(path), "fork_probe"],
        env={**os.environ, "PYTHONPATH": str(probe)},
    )
    try:
        deadline = time.monotonic() + 30
        while not path.exists():
            assert process.poll() is None, "the fork server exited"
            assert time.monotonic() < deadline, "the fork server did not listen in 30 s"
            time.sleep(0.02)
        yield path, process
    finally:
        process.terminate()
        process.wait(timeout=10)


def client(path: Path, probe: Path, cwd: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-I", "-S", fork_client.__file__, str(path), "-m", "fork_probe"],
        env={**os.environ, "PYTHONPATH": str(probe), **env},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_forked_child_is_the_process_its_client_stands_for(server, probe, tmp_path) -> None:
    path, process = server
    folder = tmp_path / "work"
    folder.mkdir()
    started = client(path, probe, folder, PROBE="hello", PROBE_EXIT="3")
    out, err = started.communicate(timeout=30)
    assert started.returncode == 3
    shown = json.loads(out)
    assert shown["parent"] == process.pid  # forked by the server
    assert shown["preloaded"]  # with the server's imports
    assert shown["asked"] == "hello"  # the client's environment, not the server's
    assert shown["cwd"] == str(folder)
    assert Path(shown["argv"][0]).name == "fork_probe.py"
    assert "to stderr" in err


def test_a_signal_to_the_client_reaches_its_child(server, probe, tmp_path) -> None:
    path, process = server
    started = client(path, probe, tmp_path, PROBE="sleep")
    child = json.loads(started.stdout.readline())
    assert child["parent"] == process.pid
    started.send_signal(signal.SIGTERM)
    assert started.wait(timeout=30) == -signal.SIGTERM
    deadline = time.monotonic() + 30
    while psutil.pid_exists(child["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)  # the server reaps it
    assert not psutil.pid_exists(child["pid"])  # the child ended too, not only its client
    started.stdout.close()
    started.stderr.close()


def test_without_a_server_the_client_runs_the_module_itself(probe, tmp_path) -> None:
    started = client(tmp_path / "nobody.sock", probe, tmp_path, PROBE="alone", PROBE_EXIT="4")
    out, _ = started.communicate(timeout=60)
    assert started.returncode == 4
    shown = json.loads(out)
    assert shown["asked"] == "alone"
    assert not shown["preloaded"]


def test_a_request_for_another_module_is_refused(server, probe, tmp_path) -> None:
    path, _ = server
    started = subprocess.run(
        [sys.executable, "-I", "-S", fork_client.__file__, str(path), "-m", "json.tool"],
        capture_output=True,
        text=True,
        timeout=30,
        input="",
    )
    assert started.returncode == 1
    assert "closed before starting" in started.stderr


def test_the_launcher_hands_only_the_source_runner_to_its_jvms_server(
    tmp_path, monkeypatch
) -> None:
    """The launcher's parent stands for the JVM: a server at that parent's socket gets the
    source runner; anything else, and everything when no server listens, starts as usual."""
    monkeypatch.setenv("MODESWITCH_CACHE", str(tmp_path / "cache"))
    launcher = worker_python()
    path = socket_path(os.getpid())
    path.parent.mkdir(parents=True)
    seen = tmp_path / "seen"
    # A stand-in server: records that a client connected, and with what, then closes.
    listener = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1)\n"
            "c, _ = s.accept()\n"
            "_, fds, _, _ = socket.recv_fds(c, 1, 3)\n"
            "n = int.from_bytes(c.recv(4, socket.MSG_WAITALL), 'big')\n"
            "open(sys.argv[2], 'wb').write(c.recv(n, socket.MSG_WAITALL))\n",
            str(path),
            str(seen),
        ]
    )
    try:
        deadline = time.monotonic() + 30
        while not path.exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        other = subprocess.run(
            [launcher, "-c", "print('plain')"], capture_output=True, text=True, check=True
        )
        assert other.stdout.strip() == "plain"
        assert not seen.exists()
        routed = subprocess.run(
            [launcher, "-m", FORKED_MODULES[0]], capture_output=True, text=True, timeout=30
        )
        assert routed.returncode == 1  # the stand-in closed without starting anything
        assert json.loads(seen.read_bytes())["argv"] == ["-m", FORKED_MODULES[0]]
    finally:
        listener.kill()
        listener.wait()


def test_no_server_starts_where_its_socket_path_would_be_too_long(tmp_path, monkeypatch, caplog):
    """A cache folder too deep for a Unix socket: the engine says so and starts no server
    (its runners start as without one)."""
    from modeswitch.runners.fork_server import SourceRunnerForks

    monkeypatch.setenv("MODESWITCH_CACHE", str(tmp_path / ("deep" * 30)))
    launcher = worker_python()
    monkeypatch.setenv("PYSPARK_PYTHON", launcher)

    handle = SimpleNamespace(pid=lambda: 4242)  # all it asks of a session: its JVM's pid
    lang = SimpleNamespace(ProcessHandle=SimpleNamespace(current=lambda: handle))
    session = SimpleNamespace(_jvm=SimpleNamespace(java=SimpleNamespace(lang=lang)))

    with caplog.at_level("WARNING"), SourceRunnerForks(session, launcher) as forks:
        assert forks.process is None
    assert "longer than a Unix socket's path may be" in caplog.text
