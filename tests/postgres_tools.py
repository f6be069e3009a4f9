"""A throwaway PostgreSQL server on loopback for the tests: Debian's binaries
(``tools/ensure-postgres.sh``), a fresh data folder and a free port, started as the leader of
its own process group and stopped by it, the folder removed after. As root (PostgreSQL refuses
to run as root) the server runs as the ``postgres`` user."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from modeswitch.runners.processes import start_group, stop_group


def _bin_dir() -> Path:
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    found.sort(key=lambda path: int(path.split("/")[4]))  # the newest major version last
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RuntimeError("PostgreSQL's initdb is not installed: run tools/ensure-postgres.sh")
    return Path(initdb).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def throwaway_postgres(database: str = "airflow") -> Iterator[str]:
    """Yields a SQLAlchemy URL (psycopg2) of ``database`` on a fresh server."""
    bin_dir = _bin_dir()
    as_user: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="modeswitch-pg-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = folder / "data", _free_port()
    server = None
    try:
        where = ["-D", str(data)]
        setup = ["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"]
        subprocess.run(
            [*as_user, str(bin_dir / "initdb"), *where, *setup],
            check=True,
            capture_output=True,
            timeout=120,
        )
        # Loopback only; its socket file in the throwaway folder; no fsync (a test's data).
        listen = ["-h", "127.0.0.1", "-k", str(folder), "-c", "fsync=off"]
        log = open(folder / "server.log", "ab")  # noqa: SIM115 (the server's output)
        try:
            server = start_group(
                [*as_user, str(bin_dir / "postgres"), *where, "-p", str(port), *listen],
                output=log,
            )
        finally:
            log.close()
        deadline = time.monotonic() + 60
        while subprocess.run(
            [str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)], capture_output=True
        ).returncode:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "PostgreSQL did not start: " + (folder / "server.log").read_text()[-2000:]
                )
            time.sleep(0.2)
        client = ["-h", "127.0.0.1", "-p", str(port), "-U", "postgres"]
        subprocess.run(
            [str(bin_dir / "psql"), *client, "-c", f"CREATE DATABASE {database}"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/{database}"
    finally:
        if server is not None:
            stop_group(server, grace=15.0)
        shutil.rmtree(folder, ignore_errors=True)
