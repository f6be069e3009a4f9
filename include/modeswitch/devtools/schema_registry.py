"""A schema registry on loopback for tests and demos: Apicurio Registry, started and stopped here.

Registry-framed payloads (Avro whose every record starts with a magic byte and a 4-byte schema
id) need a registry that speaks the Confluent Schema Registry API; Apicurio Registry serves it
at ``/apis/ccompat/v7``, and is what ``make install`` unpacks into ``.schema-registry/``
(``jvm/schema-registry/pom.xml``, which says why 2.6.13; ``$MODESWITCH_SCHEMA_REGISTRY_APP``
names another folder). One JVM, its storage in memory (a registry started again is empty), its
HTTP port on 127.0.0.1. Measured here: it answers 5 s after its start, ~220 MB resident.

:class:`SchemaRegistry` starts the application as the leader of a new process group, waits
until its API answers, and stops the group (SIGTERM, then SIGKILL) on
:meth:`~SchemaRegistry.stop` or at the end of its ``with`` block. :attr:`SchemaRegistry.config`
is the pipeline's client configuration that reaches it (``MODESWITCH_SCHEMA_REGISTRY_CONFIG``).

``python -m modeswitch.devtools.schema_registry --dir /tmp/registry`` runs one until it is
stopped (SIGTERM or Ctrl-C) and prints ``{"url": "http://127.0.0.1:PORT/apis/ccompat/v7"}`` on
its first line.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from modeswitch.devtools.standalone import free_ports
from modeswitch.environment import SCHEMA_REGISTRY_APP, env_value
from modeswitch.errors import ModeswitchError
from modeswitch.runners.jvm import java_executable
from modeswitch.runners.processes import start_group, stop_group

JVM_OPTIONS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
READY_TIMEOUT = 90.0
STOP_GRACE = 20.0
CCOMPAT_PATH = "/apis/ccompat/v7"
"""Where Apicurio Registry serves the Confluent Schema Registry API."""


def registry_application() -> Path:
    """The registry's runnable jar; :class:`ModeswitchError` when it was not unpacked."""
    folder = env_value(SCHEMA_REGISTRY_APP)
    jars = sorted(folder.glob("apicurio-registry-app-*-runner.jar"))
    if not jars:
        raise ModeswitchError(
            f"no Apicurio Registry application in {folder}: run `make install` (it unpacks "
            f"jvm/schema-registry/pom.xml there), or set {SCHEMA_REGISTRY_APP.name} to a "
            "folder that holds it"
        )
    return jars[-1]


class SchemaRegistry:
    """One Apicurio Registry on loopback; its logs under ``directory``."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).resolve()
        (self.port,) = free_ports(1)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    @property
    def config(self) -> dict[str, str]:
        """The client configuration that reaches this registry."""
        return {"url": self.url}

    def _command(self) -> list[str]:
        scratch = self.directory / "tmp"
        scratch.mkdir(parents=True, exist_ok=True)
        return [
            str(java_executable() or "java"),
            *JVM_OPTIONS,
            f"-Djava.io.tmpdir={scratch}",
            "-Dquarkus.http.host=127.0.0.1",
            f"-Dquarkus.http.port={self.port}",
            # Its management interface (health, metrics) stays on the HTTP port, on loopback.
            "-Dquarkus.management.enabled=false",
            "-jar",
            str(registry_application()),
        ]

    def start(self) -> str:
        """Start the registry and wait until its API answers; returns :attr:`url`."""
        if self.process is not None and self.process.poll() is None:
            return self.url
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "registry.log", "ab") as output:
            self.process = start_group(self._command(), output=output, cwd=self.directory)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.url

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise ModeswitchError(
                    f"the schema registry in {self.directory} exited with status "
                    f"{self.process.returncode} while starting:\n{self._tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ModeswitchError(
                    f"the schema registry at {self.url} did not answer within "
                    f"{READY_TIMEOUT:.0f} s:\n{self._tail()}"
                )
            time.sleep(0.2)

    def _tail(self, lines: int = 30) -> str:
        path = self.directory / "registry.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def stop(self) -> None:
        """Stop the registry's process group: SIGTERM, then SIGKILL."""
        if self.process is not None:
            stop_group(self.process, grace=STOP_GRACE)
            self.process = None

    def __enter__(self) -> SchemaRegistry:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modeswitch.devtools.schema_registry")
    parser.add_argument("--dir", required=True, help="the registry's folder (its log)")
    args = parser.parse_args(argv)
    stopped = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stopped.set())
    with SchemaRegistry(args.dir) as registry:
        print(json.dumps({"url": registry.url}), flush=True)
        stopped.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
