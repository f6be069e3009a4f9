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


class PostgresServer:
    """A PostgreSQL server on a data folder and port of its own; :meth:`crash` and
    :meth:`start` again give a database that restarts under its clients (crash recovery on
    the same data)."""

    def __init__(self, folder: Path, port: int, database: str) -> None:
        self.bin_dir = _bin_dir()
        self.folder, self.port, self.database = folder, port, database
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(folder, user.pw_uid, user.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.server: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The SQLAlchemy URL (psycopg2) of the database."""
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{self.database}"

    def init(self) -> None:
        setup = ["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"]
        subprocess.run(
            [*self.as_user, str(self.bin_dir / "initdb"), "-D", str(self.folder / "data"), *setup],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> None:
        """Start the server (as the leader of its own process group) and wait until it takes
        connections."""
        # Loopback only; its socket file in the throwaway folder; no fsync (a test's data).
        listen = ["-h", "127.0.0.1", "-k", str(self.folder), "-c", "fsync=off"]
        where = ["-D", str(self.folder / "data"), "-p", str(self.port)]
        log = open(self.folder / "server.log", "ab")  # noqa: SIM115 (the server's output)
        try:
            self.server = start_group(
                [*self.as_user, str(self.bin_dir / "postgres"), *where, *listen], output=log
            )
        finally:
            log.close()
        deadline = time.monotonic() + 60
        ready = [str(self.bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)]
        while subprocess.run(ready, capture_output=True).returncode:
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "PostgreSQL did not start: " + (self.folder / "server.log").read_text()[-2000:]
                )
            time.sleep(0.2)

    def create_database(self) -> None:
        client = ["-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"]
        subprocess.run(
            [str(self.bin_dir / "psql"), *client, "-c", f"CREATE DATABASE {self.database}"],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def crash(self) -> None:
        """SIGKILL the server and every backend (its process group): what a lost machine does
        to it. :meth:`start` recovers the data."""
        if self.server is not None:
            stop_group(self.server)
            self.server = None

    def stop(self) -> None:
        if self.server is not None:
            stop_group(self.server, grace=15.0)
            self.server = None


@contextmanager
def throwaway_postgres(database: str = "airflow") -> Iterator[PostgresServer]:
    """Yields a started :class:`PostgresServer` holding an empty ``database``; stopped and its
    folder removed after."""
    folder = Path(tempfile.mkdtemp(prefix="modeswitch-pg-"))
    server = PostgresServer(folder, _free_port(), database)
    try:
        server.init()
        server.start()
        server.create_database()
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
