"""Child processes in their own process groups, stopped by the code that started them.

A Spark job, an Airflow standalone or a benchmark's job each start more processes than the one
we start: a JVM, Python workers, a scheduler and its children. Each is started here as the
leader of a new process group (:func:`start_group`), and stopped by that group
(:func:`stop_group`, :func:`wait_group`), so that nothing it started outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO


def start_group(
    command: list[str],
    env: Mapping[str, str] | None = None,
    output: BinaryIO | int | None = None,
    **popen: Any,
) -> subprocess.Popen:
    """Start ``command`` as the leader of a new process group, with ``env`` on top of this
    process's environment; its output (standard output and error) goes to ``output`` when
    given, else to this process's."""
    return subprocess.Popen(
        command,
        env={**os.environ, **(env or {})},
        start_new_session=True,
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
        **popen,
    )


@contextlib.contextmanager
def output_to(log_file: str | Path | None) -> Iterator[BinaryIO | None]:
    """``log_file`` opened for appending (None: no file, the caller's output)."""
    if log_file is None:
        yield None
        return
    with open(log_file, "ab") as output:
        yield output


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL every process left in ``process``'s group (nothing if none is)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def wait_group(process: subprocess.Popen, timeout: float) -> int:
    """Wait for ``process`` (a group leader) to exit; kill its group if it overruns
    (:class:`subprocess.TimeoutExpired` is raised then), and again once it has exited
    (whatever it left behind). Returns its exit status."""
    try:
        return process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            kill_group(process)
            process.wait()
        kill_group(process)


def stop_group(process: subprocess.Popen, *, grace: float = 0.0) -> int:
    """Stop ``process``'s whole group: SIGTERM and up to ``grace`` seconds to exit (none
    when 0), then SIGKILL for whatever is left. Returns the leader's exit status."""
    if grace > 0 and process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
    kill_group(process)
    return process.wait()


def run_process_group(
    command: list[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float,
    log_file: str | Path | None = None,
) -> int:
    """Run ``command`` in its own process group and return its exit status.

    The group is killed if the command overruns, and again after it exits, so that nothing
    it started (a Spark JVM, Python workers) outlives it. Output goes to ``log_file`` when
    given, else to this process's.
    """
    with output_to(log_file) as output:
        return wait_group(start_group(command, env, output), timeout)


class SparkScratch:
    """A folder for the Spark processes a runner starts: their local dirs (``spark-*``,
    ``blockmgr-*``: fetched files, shuffle and block files) and their driver JVM's
    ``java.io.tmpdir`` (native libraries it unpacks, ``artifacts-*``), instead of the
    machine's ``/tmp``. Spark removes its folders when a JVM stops cleanly; a SIGKILLed job
    leaves them, and here whoever started it removes them with :meth:`remove`. Made when
    first asked for; the environment's own ``SPARK_LOCAL_DIRS`` and a ``java.io.tmpdir`` in
    its ``SPARK_SUBMIT_OPTS`` win. ``at``: a fixed folder (made when first asked for), for a
    process that outlives whoever started it (the warm engine's, beside its address file)."""

    def __init__(self, prefix: str = "modeswitch-spark-", *, at: str | Path | None = None) -> None:
        self.prefix = prefix
        self.at = Path(at) if at is not None else None  # a fixed folder instead of a new one
        self.folder: Path | None = None

    def environment(self) -> dict[str, str]:
        """What to add to a child's environment (spark-submit reads both)."""
        import tempfile

        if self.folder is None and self.at is not None:
            self.at.mkdir(parents=True, exist_ok=True)
            self.folder = self.at
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix=self.prefix))
        env = {}
        if not os.environ.get("SPARK_LOCAL_DIRS"):
            env["SPARK_LOCAL_DIRS"] = str(self.folder)
        options = os.environ.get("SPARK_SUBMIT_OPTS", "")
        if "java.io.tmpdir" not in options:
            env["SPARK_SUBMIT_OPTS"] = f"{options} -Djava.io.tmpdir={self.folder}".strip()
        return env

    def remove(self) -> None:
        """Remove the folder and whatever the processes left in it; stop them first."""
        import shutil

        folder, self.folder = self.folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
