"""A Spark standalone cluster on loopback, from pip's pyspark: a master and N workers, each its
own JVM (``bin/spark-class``) in its own process group, each worker with its own cores,
memory and work folder. What the ``cluster`` test tier and the cluster benchmark run the
pipeline on (``spark_default`` = :attr:`StandaloneCluster.master_url`); started and stopped
here, by process group.

    with StandaloneCluster(workdir, workers=2, cores=1) as cluster:
        ...  # spark-submit --master cluster.master_url

Executors run in the workers' JVMs and start their Python workers with the driver's
interpreter (``spark.pyspark.python``): the package reaches them as an environment both sides
have, as in the Docker image of ``docker-compose.yaml``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modeswitch.errors import ModeswitchError
from modeswitch.runners.processes import start_group, stop_group
from modeswitch.runners.session import EXECUTOR_ENVIRONMENT

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> str:
    """pip's pyspark folder: it holds ``bin/spark-class`` and Spark's jars."""
    import pyspark

    return str(Path(pyspark.__file__).resolve().parent)


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports on loopback: each probe stays bound until all are
    chosen, so the kernel cannot hand the same port out twice (two ``free_port()`` calls
    can, and a Kafka node with both listeners on one port refuses to start)."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]


@dataclass
class StandaloneCluster:
    """``workers`` workers of ``cores`` cores and ``memory`` each, logs and work folders under
    ``workdir``."""

    workdir: Path
    workers: int = 2
    cores: int = 1
    memory: str = "2g"
    timeout: float = 120.0
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    _processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def state(self) -> dict[str, Any]:
        """The master's JSON status (workers, running and completed applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as page:
            return json.load(page)

    def worker_dirs(self) -> list[Path]:
        return [self.workdir / f"worker-{n}" for n in range(1, self.workers + 1)]

    def _start(self, name: str, arguments: list[str], scratch: Path | None = None) -> None:
        """Start a daemon; ``scratch``: a worker's local folder (its executors' shuffle files
        and fetched jars), under ``workdir`` rather than the machine's ``/tmp``, so that
        whoever removes ``workdir`` removes them too, also after a killed executor."""
        home = spark_home()
        env = {"SPARK_HOME": home, "SPARK_LOG_DIR": str(self.workdir)}
        if scratch is not None:
            env["SPARK_LOCAL_DIRS"] = str(scratch)
        output = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 (the child's)
        try:
            # The daemons (and so the executors they start) get none of the driver's
            # credentials from this process: as on a real cluster, only what the session sends.
            unset = [flag for name in EXECUTOR_ENVIRONMENT for flag in ("-u", name)]
            self._processes.append(
                start_group(
                    ["env", *unset, f"{home}/bin/spark-class", *arguments],
                    env=env,
                    output=output,
                )
            )
        finally:
            output.close()

    def __enter__(self) -> StandaloneCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            address = ["--host", "127.0.0.1", "--port", str(self.port)]
            self._start("master", [MASTER, *address, "--webui-port", str(self.ui_port)])
            for folder in self.worker_dirs():
                folder.mkdir(exist_ok=True)
                size = ["--cores", str(self.cores), "--memory", self.memory]
                place = ["--work-dir", str(folder), "--webui-port", str(free_port())]
                (folder / "local").mkdir(exist_ok=True)
                self._start(
                    folder.name,
                    [WORKER, self.master_url, "--host", "127.0.0.1", *size, *place],
                    scratch=folder / "local",
                )
            self._wait_for_workers()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + self.timeout
        seen: Any = None
        while time.monotonic() < deadline:
            for process in self._processes:
                if process.poll() is not None:
                    raise ModeswitchError(
                        f"standalone cluster: {process.args[1]} exited with status "
                        f"{process.returncode} (logs in {self.workdir})"
                    )
            try:
                seen = self.state()
                alive = [w for w in seen.get("workers", []) if w.get("state") == "ALIVE"]
                if len(alive) == self.workers:
                    return
            except (OSError, ValueError):
                # Not up yet; or up, but its /json/ answered with the HTML page (seen once,
                # ci33: the master had bound the port a second before).
                pass
            time.sleep(0.5)
        raise ModeswitchError(
            f"standalone cluster: {self.workers} workers not alive within {self.timeout:.0f} s "
            f"(master said {seen!r}; logs in {self.workdir})"
        )

    def stop(self) -> None:
        """Stop every daemon started here by its process group (workers first)."""
        for process in reversed(self._processes):
            stop_group(process, grace=10.0)
        self._processes.clear()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def application_names(cluster: StandaloneCluster) -> list[str]:
    """The names of the applications the master ran or runs, oldest first."""
    state = cluster.state()
    apps = [*state.get("completedapps", []), *state.get("activeapps", [])]
    return [app["name"] for app in sorted(apps, key=lambda a: a.get("starttime", 0))]


def executor_folders(cluster: StandaloneCluster) -> dict[str, list[str]]:
    """Per worker, the executors it ran (``app-id/executor-id`` folders of its work dir)."""
    return {
        folder.name: sorted(
            f"{app.name}/{executor.name}"
            for app in folder.glob("app-*")
            for executor in app.iterdir()
            if executor.is_dir()
        )
        for folder in cluster.worker_dirs()
    }


__all__ = ["StandaloneCluster", "application_names", "executor_folders", "spark_home"]
