"""Running epochs without Airflow: each epoch's job as a child process, and the stream standby.

The ``local`` runner (:mod:`modeswitch.runners.base`): :class:`LocalRunner` runs each
epoch's job as a child process in its own process group (:mod:`modeswitch.runners.processes`),
and starts the next stream job in standby (:class:`StreamStandby`) while a batch epoch runs,
by :class:`BatchEndWatch`'s estimate of the batch's end. The lifecycle around it (decide, run,
close) is :mod:`modeswitch.runners.lifecycle`'s.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ModeswitchError
from modeswitch.runners.base import EpochHandle, EpochKind
from modeswitch.runners.jobs import job_script, job_spark_conf, standby_request
from modeswitch.runners.processes import (
    SparkScratch,
    output_to,
    run_process_group,
    start_group,
    wait_group,
)
from modeswitch.sinks.commits import commits_after, sink_version
from modeswitch.state import StateStore

log = logging.getLogger(__name__)


def job_command(kind: str, settings: PipelineSettings, epoch: int) -> list[str]:
    """The command line of ``jobs/backlog_batch.py`` or ``jobs/stream.py`` for one epoch, or
    of ``jobs/backfill.py`` for one backfill command (``epoch`` is then the command's id)."""
    return [
        sys.executable,
        str(job_script(kind)),
        "--pipeline",
        settings.pipeline,
        "--command" if kind == "backfill" else "--epoch",
        str(epoch),
        "--config",
        settings.to_json(),
    ]


def run_job_process(
    kind: str,
    settings: PipelineSettings,
    epoch: int,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 1800,
    log_file: str | Path | None = None,
) -> None:
    """Run the epoch's job as a child process in its own process group; stop it (and the JVM
    it started) by that group if it overruns or anything goes wrong. Its output goes to
    ``log_file`` when given, else to this process's. Its Spark scratch is a folder of its own
    (:class:`~modeswitch.runners.processes.SparkScratch`), removed once the group is gone, even
    when the job was killed, unless ``env`` brings one (a runner's)."""
    command = job_command(kind, settings, epoch)
    since = _size(log_file)
    scratch = SparkScratch()
    try:
        job_env = {**scratch.environment(), **(env or {})}
        code = run_process_group(command, env=job_env, timeout=timeout, log_file=log_file)
    finally:
        scratch.remove()
    _check_exit(Path(command[1]).name, epoch, code, log_file=log_file, since=since)


JOB_FAILED = " ERROR modeswitch.jobs: "
"""How a job's failure line reads in its output (:func:`modeswitch.runners.jobs.main`'s
``log.error`` in :data:`~modeswitch.runners.jobs.LOG_FORMAT`)."""


def _size(log_file: str | Path | None) -> int:
    """The bytes ``log_file`` holds now (0 if none): where a job's own output will start."""
    try:
        return Path(log_file).stat().st_size if log_file else 0
    except FileNotFoundError:
        return 0


def job_failure(log_file: str | Path | None, since: int = 0) -> str | None:
    """What a job said when it failed: its last failure line (``<kind> epoch N failed: ...``)
    in what it wrote to ``log_file`` after byte ``since`` (an epoch's tries append to one
    file); None without a file or such a line (a job killed, or one that crashed)."""
    if not log_file:
        return None
    try:
        with open(log_file, "rb") as output:
            output.seek(max(since, _size(log_file) - 1_000_000))
            text = output.read().decode(errors="replace")
    except FileNotFoundError:
        return None
    lines = [line for line in text.splitlines() if JOB_FAILED in line]
    return lines[-1].split(JOB_FAILED, 1)[1].strip() if lines else None


def _check_exit(
    job: str, epoch: int, code: int, *, log_file: str | Path | None = None, since: int = 0
) -> None:
    """Raise :class:`ModeswitchError` if the job exited with an error; its message ends with
    the status, then what the job said of its failure (:func:`job_failure`), if anything."""
    if code != 0:
        said = job_failure(log_file, since)
        raise ModeswitchError(
            f"{job} for epoch {epoch} exited with status {code}" + (f": {said}" if said else "")
        )


class StreamStandby:
    """A stream job started ahead of its epoch: ``jobs/stream.py --standby``.

    A stream epoch's job spends most of its first seconds starting up: its JVM and session,
    then a Python process for each step of the source and the sink, all cold. Started while a
    batch epoch runs, the standby does all that (:func:`modeswitch.modes.warmup.warm_up`) and waits;
    when ``decide`` opens a stream epoch, :meth:`hand_over` gives it the epoch and its settings
    (one line on its standard input) and the epoch starts warm. :meth:`release` ends it
    unused. The standby runs in its own process group, killed when it ends, like any job.
    """

    def __init__(
        self,
        settings: PipelineSettings,
        *,
        env: Mapping[str, str] | None = None,
        log_file: str | Path | None = None,
    ) -> None:
        self.settings = settings
        self.log_file = Path(log_file) if log_file else None
        command = [
            sys.executable,
            str(job_script("stream")),
            "--pipeline",
            settings.pipeline,
            "--standby",
            "--config",
            settings.to_json(),
        ]
        self.started_at = time.time()  # wall clock, as the sink's commit timestamps
        self.log_from = _size(log_file)
        with output_to(log_file) as output:
            self.process = start_group(command, env, output, stdin=subprocess.PIPE)

    def can_run(self, settings: PipelineSettings) -> bool:
        """Whether it is alive and its JVM suits a job with ``settings``."""
        return (
            self.process.poll() is None
            and settings.pipeline == self.settings.pipeline
            and job_spark_conf("stream", settings) == job_spark_conf("stream", self.settings)
        )

    def hand_over(self, epoch: int, settings: PipelineSettings) -> bool:
        """Give it stream epoch ``epoch``; False if it has already exited (nothing handed)."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(standby_request(epoch, settings).encode())
            self.process.stdin.close()
        except BrokenPipeError:
            return False
        return True

    def wait(self, epoch: int, *, timeout: float) -> None:
        """Wait for the epoch it was handed to end, as :func:`run_job_process` does."""
        code = wait_group(self.process, timeout)
        _check_exit("stream.py (standby)", epoch, code, log_file=self.log_file, since=self.log_from)

    def release(self, *, timeout: float = 60) -> int:
        """End it without an epoch: it stops its session and exits; killed after ``timeout``."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
        try:
            return wait_group(self.process, timeout)
        except subprocess.TimeoutExpired:
            return self.process.wait()


WATCH_EVERY = timedelta(milliseconds=500)


class BatchEndWatch:
    """Estimates when a running batch epoch will end, from the sink's commits so far.

    :meth:`due` says when a standby should start: ``lead`` before the epoch's expected end. The
    pace is the records the epoch's commits carry per second of their own timestamps: between
    the first and the newest commit seen once there are two, and over the first wave alone
    before that, timed from when the job planned it (the split ledger's ``recorded_at`` for
    that wave) to its commit, so the job's Spark start-up does not count. The end is expected
    that long after the newest commit was seen. Before a wave commits there is no estimate and
    no standby: an epoch of one wave runs without one (measured: a one-wave batch of 240 000
    records took 28 s beside a starting standby instead of about 5 s, and the lag it left was
    then over the exit threshold). Each call reads only the new commit files of the sink's log
    (:func:`commits_after`), and the ledger once, at the first commit.
    """

    def __init__(
        self,
        settings: PipelineSettings,
        epoch: int,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = StateStore.from_settings(settings)
        found = self.store.epochs.get(epoch)
        self.settings = settings
        self.epoch = epoch
        self.clock = clock
        self.boundary = dict(found.boundary or {})
        self.committed = {**found.start, **self.store.progress.committed_offsets()}
        self.version = sink_version(settings.sink)
        self.total = self._left()
        self.began: tuple[float, int] | None = None  # (ms, records left): the first wave's plan
        self.commits: list[tuple[float, int]] = []  # (ms, records left after): the epoch's
        self.last_seen: float | None = None  # clock() when the newest of them was seen
        self.estimate: float | None = None  # seconds left, at the last call of due()

    def _left(self) -> int:
        return sum(max(0, end - self.committed.get(b, 0)) for b, end in self.boundary.items())

    def remaining(self) -> int:
        """Records still below the boundary, by the commits seen so far."""
        found, self.version = commits_after(
            self.settings.sink, self.settings.pipeline, self.version
        )
        mine = [c for c in found if c.epoch == self.epoch and not c.is_rewind]
        for commit in mine:
            if self.began is None:
                self.began = self._planned(commit.sequence)
            self.committed.update(commit.end)
            if commit.committed_at_ms is not None:
                self.commits.append((float(commit.committed_at_ms), self._left()))
        if mine:
            self.last_seen = self.clock()
        return self._left()

    def _planned(self, wave: int) -> tuple[float, int] | None:
        """When the job planned ``wave`` (ms) and the records left then; None if unrecorded."""
        planned = [s.recorded_at for s in self.store.ledger.splits(self.epoch) if s.wave == wave]
        if not planned:
            return None
        return max(planned).timestamp() * 1000, self._left()

    def seconds_left(self) -> float | None:
        """The expected seconds to the epoch's end; None before its first wave commits."""
        left = self.remaining()
        if left == 0:
            return 0.0
        if not self.commits or self.last_seen is None:
            return None
        if len(self.commits) >= 2:
            (first_ms, first_left), (last_ms, last_left) = self.commits[0], self.commits[-1]
        elif self.began is not None:
            (first_ms, first_left), (last_ms, last_left) = self.began, self.commits[0]
        else:
            return None
        moved, seconds = first_left - last_left, (last_ms - first_ms) / 1000
        if moved <= 0 or seconds <= 0:
            return None
        return left / (moved / seconds) - (self.clock() - self.last_seen)

    def due(self, lead: timedelta) -> bool:
        """Whether the epoch is expected to end within ``lead``; the estimate is kept in
        :attr:`estimate`."""
        self.estimate = self.seconds_left()
        return self.estimate is not None and self.estimate <= lead.total_seconds()


class LocalRunner:
    """Runs each epoch's job as a child process, as the Airflow tasks do, with a standby.

    With ``stream_standby`` on, a :class:`StreamStandby` starts ``stream_standby_lead`` before
    a batch epoch is expected to end (:class:`BatchEndWatch`; not for a one-wave epoch) and is
    handed the next stream epoch. Not earlier: a batch epoch may last hours, and on a small
    machine the standby's start-up takes CPU from the batch. A standby that has exited, or
    whose JVM settings do not suit the stream epoch's, is released and the stream job starts
    as usual. Use it as a context manager (or call :meth:`close`): a standby still waiting is
    released at the end.
    """

    def __init__(
        self,
        *,
        log_dir: str | Path | None = None,
        timeout: float = 1800,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.log_dir = Path(log_dir) if log_dir else None
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        self.timeout = timeout
        self.env = dict(env or {})
        self.scratch = SparkScratch()
        self.standby: StreamStandby | None = None
        self.logs: dict[int, Path] = {}
        self.handed_over: list[int] = []

    def start(self, kind: EpochKind, settings: PipelineSettings, epoch: int) -> EpochHandle:
        """The epoch's job, run by the handle's ``wait`` as a child process of this one."""
        return EpochHandle(kind, epoch, wait=lambda: self.run(kind, settings, epoch))

    def run(self, kind: str, settings: PipelineSettings, epoch: int) -> None:
        """Run the epoch's job as a child process (a stream epoch by the standby, if one
        waits and suits it); raise :class:`ModeswitchError` if it exited with an error."""
        log_file = self.log_dir / f"epoch-{epoch}-{kind}.log" if self.log_dir else None
        if kind == "stream" and self.standby is not None:
            standby, self.standby = self.standby, None
            usable = settings.stream_standby and standby.can_run(settings)
            if usable and standby.hand_over(epoch, settings):
                if standby.log_file:
                    self.logs[epoch] = standby.log_file
                self.handed_over.append(epoch)
                log.info("stream epoch %d handed to the standby stream job", epoch)
                standby.wait(epoch, timeout=self.timeout)
                return
            log.warning("the standby stream job cannot run epoch %d: released", epoch)
            standby.release()
        if log_file:
            self.logs[epoch] = log_file
        if kind == "batch" and settings.stream_standby:
            self._run_batch_with_standby(settings, epoch, log_file)
            return
        run_job_process(
            kind, settings, epoch, env=self._job_env(), timeout=self.timeout, log_file=log_file
        )

    def _job_env(self) -> dict[str, str]:
        """The environment of a job this runner starts: its own, with the Spark scratch."""
        return {**self.scratch.environment(), **self.env}

    def _run_batch_with_standby(
        self, settings: PipelineSettings, epoch: int, log_file: Path | None
    ) -> None:
        """Run a batch epoch's job; start the standby ``stream_standby_lead`` before its
        expected end."""
        command = job_command("batch", settings, epoch)
        deadline = time.monotonic() + self.timeout
        since = _size(log_file)
        with output_to(log_file) as output:
            process = start_group(command, self._job_env(), output)
            try:
                watch = BatchEndWatch(settings, epoch)
                # One standby per batch epoch at most (one that dies is not restarted here).
                waiting = not self._standby_suits(settings)
                while waiting and process.poll() is None and time.monotonic() < deadline:
                    if watch.due(settings.stream_standby_lead):
                        self._start_standby(settings, after=epoch, expected_end=watch.estimate)
                        waiting = False
                    else:
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            process.wait(timeout=WATCH_EVERY.total_seconds())
            except BaseException:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    wait_group(process, 0)
                raise
            code = wait_group(process, max(0.0, deadline - time.monotonic()))
        _check_exit(Path(command[1]).name, epoch, code, log_file=log_file, since=since)

    def _standby_suits(self, settings: PipelineSettings) -> bool:
        return self.standby is not None and self.standby.can_run(settings)

    def _start_standby(
        self, settings: PipelineSettings, *, after: int, expected_end: float | None
    ) -> None:
        self.close()
        log_file = (
            self.log_dir / f"stream-standby-after-epoch-{after}.log" if self.log_dir else None
        )
        self.standby = StreamStandby(settings, env=self._job_env(), log_file=log_file)
        log.info(
            "stream job started in standby alongside batch epoch %d (expected to end in %s s)",
            after,
            "?" if expected_end is None else f"{expected_end:.1f}",
        )

    def log_file(self, epoch: int) -> Path | None:
        """Where the output of ``epoch``'s job went (None without ``log_dir``)."""
        return self.logs.get(epoch)

    def alive(self) -> bool:
        """Always: each epoch's job is started when it runs."""
        return True

    def stop(self) -> None:
        """Release a standby that is still waiting, and remove the Spark scratch of the jobs
        (what killed ones left there)."""
        self.close()
        self.scratch.remove()

    def close(self) -> None:
        """Release a standby that is still waiting."""
        standby, self.standby = self.standby, None
        if standby is not None:
            standby.release()

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
