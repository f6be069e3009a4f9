"""Deciding and closing epochs: what the Airflow ``decide`` and ``close_epoch`` tasks do.

No Spark here: the control tables and the source's offsets are read with deltalake and the
log itself, in milliseconds. :func:`decide` calls the same :func:`~modeswitch.policy.decide_mode`
as the stream job, opens the next epoch with its exact start offsets (the sink's committed
offsets: the handoff) and, for a batch epoch, its boundary (the source's latest offsets now).
:func:`close_epoch` checks that a batch epoch reached its boundary, or records where a stream
epoch stopped and why. Pending ``rewind`` commands are applied by :func:`decide` between
epochs, before it opens the next one at the rewound offsets (:func:`apply_rewinds`); a running
batch epoch finishes first, a running stream stops at its next commit boundary.

:func:`run_locally` strings them together with the Spark jobs run as child processes: the
pipeline without Airflow, for tests and the demo.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO, Literal

import pendulum

from modeswitch.config import PipelineSettings
from modeswitch.errors import (
    InvalidOffsetsError,
    InvalidStateTransitionError,
    ModeswitchError,
    RewindRefusedError,
)
from modeswitch.jobrunner import job_spark_conf, standby_request
from modeswitch.offsets import OffsetsMap, offsets_from_dict, offsets_to_json
from modeswitch.policy import Decision, Observation, OperatorCommand, PolicyState, decide_mode
from modeswitch.sinks.commits import commits_after, latest_sink_commit, sink_version
from modeswitch.sinks.rewind import check_rewind, rewind_quarantine, rewind_sink
from modeswitch.sources import open_log
from modeswitch.state import StateStore

log = logging.getLogger(__name__)

ForceMode = Literal["auto", "batch", "stream"]
_COMMAND_OVERRIDES = {
    "switch_to_batch": "force_batch",
    "switch_to_stream": "force_stream",
    "pause": "pause",
}
JOBS = Path(__file__).resolve().parents[2] / "jobs"


@dataclass(frozen=True)
class EpochPlan:
    """What :func:`decide` chose: the epoch to run (or None: nothing to run)."""

    epoch: int | None
    mode: str
    reason: str
    start: OffsetsMap
    boundary: OffsetsMap | None
    attached: bool = False
    commands: tuple[int, ...] = field(default_factory=tuple)
    decision: dict | None = None


def _previous_state(store: StateStore) -> PolicyState | None:
    latest = store.latest_decision()
    if latest is None:
        return None
    state = latest.inputs.get("state")
    if not state:
        return None
    return PolicyState(
        mode=state["mode"],
        mode_since=pendulum.parse(state["mode_since"]),
        backlog_since=pendulum.parse(state["backlog_since"]) if state["backlog_since"] else None,
    )


def observe(
    settings: PipelineSettings, store: StateStore, now: datetime
) -> tuple[Observation, OffsetsMap]:
    """The policy's inputs now, and the offsets the next epoch starts from."""
    source = open_log(settings.source)
    earliest, latest = source.earliest_offsets(), source.latest_offsets()
    committed = {**earliest, **store.committed_offsets()}
    max_event = store.max_event_times()
    observation = Observation(
        now=now,
        committed=committed,
        latest=latest,
        max_event_time={b: datetime.fromtimestamp(us / 1e6, tz=UTC) for b, us in max_event.items()},
        # Unread data keeps a bucket from being idle; between epochs nothing else is known.
        last_data_at={b: now for b in latest if latest[b] > committed.get(b, 0)},
    )
    return observation, committed


@dataclass(frozen=True)
class AppliedRewind:
    """A rewind command that :func:`apply_rewinds` applied (or, in a dry run, would apply):
    the offsets it asked for and the sink's committed offsets after it."""

    command: int
    offsets: OffsetsMap
    end: OffsetsMap

    def describe(self) -> str:
        return f"command #{self.command} rewind to {offsets_to_json(self.offsets)}"


def apply_rewinds(
    settings: PipelineSettings, store: StateStore, *, dry_run: bool = False
) -> list[AppliedRewind]:
    """Apply the pending ``rewind`` commands, oldest first, between epochs.

    Each one is one sink commit (:func:`modeswitch.sinks.rewind.rewind_sink`: the rows at or
    above its offsets deleted from the sink and the quarantine) and then marked applied with
    the newest epoch and the new committed offsets; a bad one is marked rejected with the
    reason, and nothing is written for it. A rewind found already in the sink (a crash before
    it was acknowledged) is only acknowledged. With ``dry_run`` nothing is written: the
    rewinds are checked and returned as they would be applied. Refused while an epoch is
    running (its job may be committing): a running epoch ends first.
    """
    running = store.current_epoch()
    if running is not None:
        raise InvalidStateTransitionError(
            f"rewinds are applied between epochs; epoch {running.id} ({running.mode}) is "
            "still running"
        )
    options = store.storage_options
    if not dry_run:
        newest = latest_sink_commit(settings.sink, settings.pipeline, storage_options=options)
        if newest is not None and newest.is_rewind:
            # A crash may have come between a rewind's sink and quarantine commits.
            rewind_quarantine(
                settings.quarantine, settings.pipeline, newest, storage_options=options
            )
    pending = [c for c in store.pending_commands() if c.kind == "rewind"]
    if not pending:
        return []
    source = open_log(settings.source)
    earliest, buckets = source.earliest_offsets(), source.buckets()
    applied: list[AppliedRewind] = []
    for command in pending:
        try:
            offsets = offsets_from_dict(
                command.args.get("offsets"), source=f"rewind command #{command.id} offsets"
            )
            if dry_run:
                committed = {**earliest, **store.committed_offsets(), **applied_end(applied)}
                check_rewind(
                    command.id, offsets, committed=committed, earliest=earliest, buckets=buckets
                )
                moved = {b: o for b, o in offsets.items() if b in committed}
                applied.append(AppliedRewind(command.id, offsets, {**committed, **moved}))
                continue
            last = store.latest_epoch()
            newest = latest_sink_commit(settings.sink, settings.pipeline, storage_options=options)
            outcome = rewind_sink(
                settings.sink,
                settings.pipeline,
                command=command.id,
                epoch=max(last.id if last else 0, newest.epoch if newest else 0),
                offsets=offsets,
                earliest=earliest,
                buckets=buckets,
                quarantine_uri=settings.quarantine,
                storage_options=options,
            )
        except (RewindRefusedError, InvalidOffsetsError) as exc:
            log.warning("%s", exc)
            if not dry_run:
                store.reject_command(command.id, str(exc))
            continue
        store.acknowledge_rewind(outcome.commit)
        applied.append(AppliedRewind(command.id, offsets, dict(outcome.commit.end)))
    return applied


def applied_end(rewinds: list[AppliedRewind]) -> OffsetsMap:
    """The committed offsets after the last of ``rewinds`` (empty if none)."""
    return dict(rewinds[-1].end) if rewinds else {}


def decide(
    settings: PipelineSettings,
    *,
    force_mode: ForceMode = "auto",
    dry_run: bool = False,
    now: datetime | None = None,
    decided_by: str = "decide",
    storage_options: Mapping[str, str] | None = None,
) -> EpochPlan:
    """Choose the next epoch's mode and open it (unless ``dry_run``).

    A running epoch (an Airflow retry of a run whose epoch is still open) is re-attached,
    not replaced. Pending ``rewind`` commands are applied first (:func:`apply_rewinds`), so
    the new epoch starts at the rewound offsets and its reason names the command. Pending
    switch and pause commands override the policy and are applied, with the start offsets,
    when the epoch opens; ``force_mode`` (a run param) does the same. ``storage_options``:
    the tables' storage options (None: from the environment, see
    :meth:`StateStore.from_settings`).
    """
    store = StateStore.from_settings(settings, storage_options=storage_options)
    if not dry_run:
        store.reconcile()
    current = store.current_epoch()
    if current is not None:
        log.info("epoch %d (%s) is still running: re-attaching", current.id, current.mode)
        return EpochPlan(
            current.id, current.mode, "re-attached", current.start, current.boundary, True
        )
    now = now or pendulum.now("UTC")
    rewinds = apply_rewinds(settings, store, dry_run=dry_run)
    observation, committed = observe(settings, store, now)
    if dry_run:
        committed = {**committed, **applied_end(rewinds)}
    command = None
    applied: list[int] = []
    for pending in store.pending_commands():
        if pending.kind in _COMMAND_OVERRIDES:
            command = OperatorCommand(_COMMAND_OVERRIDES[pending.kind], f"#{pending.id}")
            applied.append(pending.id)
        elif pending.kind == "resume":
            applied.append(pending.id)
    if force_mode != "auto":
        command = OperatorCommand(f"force_{force_mode}", "run param force_mode")
    decision: Decision = decide_mode(
        observation, settings=settings.policy, previous=_previous_state(store), command=command
    )
    record = decision.to_record()
    reason = "; ".join([*(r.describe() for r in rewinds), decision.reason])
    done = tuple(r.command for r in rewinds)
    if dry_run:
        if rewinds:
            reason = f"would apply {reason}"
        return EpochPlan(
            None, decision.mode, reason, committed, None, commands=done, decision=record
        )
    store.record_decision(
        "batch" if decision.mode == "batch" else "stream",
        reason,
        record,
        at=now,
        switched=decision.switched,
        decided_by=decided_by,
    )
    if decision.mode == "paused":
        # No epoch opens; the pause is applied at the last epoch's end (the commit boundary).
        last = store.latest_epoch()
        if last is not None:
            for command_id in applied:
                store.apply_command(command_id, last.id, committed)
        return EpochPlan(
            None, "paused", reason, committed, None, commands=(*done, *applied), decision=record
        )
    boundary = dict(observation.latest) if decision.mode == "batch" else None
    epoch = store.open_epoch(decision.mode, reason, committed, boundary)
    for command_id in applied:
        store.apply_command(command_id, epoch, committed)
    return EpochPlan(
        epoch, decision.mode, reason, committed, boundary, False, (*done, *applied), record
    )


def close_epoch(
    settings: PipelineSettings,
    epoch_id: int,
    *,
    storage_options: Mapping[str, str] | None = None,
) -> tuple[str, OffsetsMap]:
    """Close an epoch at the sink's committed offsets; returns ``(status, end)``.

    A batch epoch is completed only if every bucket reached its boundary; otherwise it is
    closed as failed and :class:`ModeswitchError` names the buckets that did not finish.
    """
    store = StateStore.from_settings(settings, storage_options=storage_options)
    store.reconcile()
    epoch = store.epoch(epoch_id)
    end = {**epoch.start, **store.committed_offsets()}
    if not epoch.running:
        return epoch.status, dict(epoch.end or end)
    if epoch.mode == "batch":
        assert epoch.boundary is not None
        short = {
            b: (end.get(b, 0), target)
            for b, target in epoch.boundary.items()
            if end.get(b, 0) < target
        }
        if short:
            store.close_epoch(epoch_id, end, "failed", f"buckets below their boundary: {short}")
            raise ModeswitchError(
                f"batch epoch {epoch_id} ended below its boundary in buckets "
                + ", ".join(f"{b} ({at} < {target})" for b, (at, target) in short.items())
            )
        store.close_epoch(epoch_id, end, "completed", "every bucket reached its boundary")
        return "completed", end
    reason = next(
        (d.reason for d in store.decisions(limit=20) if d.epoch == epoch_id),
        "stream stopped",
    )
    store.close_epoch(epoch_id, end, "completed", reason)
    return "completed", end


JobRunner = Callable[[str, PipelineSettings, int], None]


def job_command(kind: str, settings: PipelineSettings, epoch: int) -> list[str]:
    """The command line of ``jobs/backlog_batch.py`` or ``jobs/stream.py`` for one epoch."""
    script = JOBS / ("backlog_batch.py" if kind == "batch" else "stream.py")
    return [
        sys.executable,
        str(script),
        "--pipeline",
        settings.pipeline,
        "--epoch",
        str(epoch),
        "--config",
        settings.to_json(),
    ]


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
    with _output(log_file) as output:
        return _wait_group(_start_group(command, env, output), timeout)


def _start_group(
    command: list[str],
    env: Mapping[str, str] | None,
    output: BinaryIO | None,
    **popen: Any,
) -> subprocess.Popen:
    """Start ``command`` as the leader of a new process group."""
    return subprocess.Popen(
        command,
        env={**os.environ, **(env or {})},
        start_new_session=True,
        stdout=output,
        stderr=subprocess.STDOUT if output else None,
        **popen,
    )


@contextlib.contextmanager
def _output(log_file: str | Path | None) -> Iterator[BinaryIO | None]:
    if log_file is None:
        yield None
        return
    with open(log_file, "ab") as output:
        yield output


def _wait_group(process: subprocess.Popen, timeout: float) -> int:
    """Wait for ``process`` (a process group leader); kill its group if it overruns, and
    again once it has exited (whatever it left behind)."""
    try:
        return process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


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
    ``log_file`` when given, else to this process's."""
    command = job_command(kind, settings, epoch)
    code = run_process_group(command, env=env, timeout=timeout, log_file=log_file)
    _check_exit(Path(command[1]).name, epoch, code)


def _check_exit(job: str, epoch: int, code: int) -> None:
    if code != 0:
        raise ModeswitchError(f"{job} for epoch {epoch} exited with status {code}")


class StreamStandby:
    """A stream job started ahead of its epoch: ``jobs/stream.py --standby``.

    A stream epoch's job spends most of its first seconds starting up: its JVM and session,
    then a Python process for each step of the source and the sink, all cold. Started while a
    batch epoch runs, the standby does all that (:func:`modeswitch.streaming.warm_up`) and waits;
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
            str(JOBS / "stream.py"),
            "--pipeline",
            settings.pipeline,
            "--standby",
            "--config",
            settings.to_json(),
        ]
        self.started_at = time.time()  # wall clock, as the sink's commit timestamps
        with _output(log_file) as output:
            self.process = _start_group(command, env, output, stdin=subprocess.PIPE)

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
        _check_exit("stream.py (standby)", epoch, _wait_group(self.process, timeout))

    def release(self, *, timeout: float = 60) -> int:
        """End it without an epoch: it stops its session and exits; killed after ``timeout``."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
        try:
            return _wait_group(self.process, timeout)
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
        found = self.store.epoch(epoch)
        self.settings = settings
        self.epoch = epoch
        self.clock = clock
        self.boundary = dict(found.boundary or {})
        self.committed = {**found.start, **self.store.committed_offsets()}
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
        planned = [s.recorded_at for s in self.store.splits(self.epoch) if s.wave == wave]
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
        self.standby: StreamStandby | None = None
        self.logs: dict[int, Path] = {}
        self.handed_over: list[int] = []

    def __call__(self, kind: str, settings: PipelineSettings, epoch: int) -> None:
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
            kind, settings, epoch, env=self.env, timeout=self.timeout, log_file=log_file
        )

    def _run_batch_with_standby(
        self, settings: PipelineSettings, epoch: int, log_file: Path | None
    ) -> None:
        """Run a batch epoch's job; start the standby ``stream_standby_lead`` before its
        expected end."""
        command = job_command("batch", settings, epoch)
        deadline = time.monotonic() + self.timeout
        with _output(log_file) as output:
            process = _start_group(command, self.env, output)
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
                    _wait_group(process, 0)
                raise
            code = _wait_group(process, max(0.0, deadline - time.monotonic()))
        _check_exit(Path(command[1]).name, epoch, code)

    def _standby_suits(self, settings: PipelineSettings) -> bool:
        return self.standby is not None and self.standby.can_run(settings)

    def _start_standby(
        self, settings: PipelineSettings, *, after: int, expected_end: float | None
    ) -> None:
        self.close()
        log_file = (
            self.log_dir / f"stream-standby-after-epoch-{after}.log" if self.log_dir else None
        )
        self.standby = StreamStandby(settings, env=self.env, log_file=log_file)
        log.info(
            "stream job started in standby alongside batch epoch %d (expected to end in %s s)",
            after,
            "?" if expected_end is None else f"{expected_end:.1f}",
        )

    def log_file(self, epoch: int) -> Path | None:
        """Where the output of ``epoch``'s job went (None without ``log_dir``)."""
        return self.logs.get(epoch)

    def close(self) -> None:
        """Release a standby that is still waiting."""
        standby, self.standby = self.standby, None
        if standby is not None:
            standby.release()

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_locally(
    settings: PipelineSettings,
    *,
    epochs: int,
    runner: JobRunner | None = None,
    on_epoch: Callable[[EpochPlan, str, OffsetsMap], None] | None = None,
) -> list[tuple[EpochPlan, str, OffsetsMap]]:
    """Decide, run and close ``epochs`` epochs in turn, as the Airflow DAG does (the jobs by
    a :class:`LocalRunner` unless ``runner`` is given)."""
    with contextlib.ExitStack() as stack:
        if runner is None:
            runner = stack.enter_context(LocalRunner())
        done = []
        for _ in range(epochs):
            plan = decide(settings, decided_by="run_locally")
            if plan.epoch is None:
                break
            runner(plan.mode, settings, plan.epoch)
            status, end = close_epoch(settings, plan.epoch)
            done.append((plan, status, end))
            if on_epoch:
                on_epoch(plan, status, end)
        return done
