"""STREAM mode: a Structured Streaming query from the epoch's handoff offsets into the sink.

Called by ``jobs/stream.py``. The query starts at exactly the epoch's start offsets (checked
against the sink's committed offsets: no gap, no overlap), with a fresh checkpoint per epoch
(a restart within the epoch resumes from it). It applies the shared transform with
``withWatermark(event_time, allowed_lateness)`` and writes every micro-batch to the Delta sink
with a low-latency trigger.

A :class:`StreamingQueryListener` wakes the job's main thread after every micro-batch. The
main thread reads the new sink commits from the sink's log (only the new commit files), records
them in the progress table (batched: one control-table commit a second at most, so that the
bookkeeping stays off the micro-batches' path on a small machine), evaluates
:func:`modeswitch.control.policy.decide_mode` (the same function the ``decide`` task calls) and
looks for operator commands (twice a second). The query is stopped, between micro-batches, when the
policy says batch, when a command asks for it, or at ``max_stream_runtime``. The end offsets are
then read from the sink's log (the truth), and a switch or pause command that caused the stop
is applied and acknowledged, with those offsets, in one commit of the commands table. A
``rewind`` command stops the stream too but stays pending: ``decide`` applies it before the
next epoch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pendulum

from modeswitch.control.policy import (
    Decision,
    Observation,
    OperatorCommand,
    PolicyState,
    decide_mode,
)
from modeswitch.control.quarantine import QuarantineWatch
from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import (
    FencedError,
    ModeswitchError,
    OffsetsContinuityError,
    StreamQueryError,
)
from modeswitch.modes.job import JobPlan
from modeswitch.modes.resume import (
    ResumePoint,
    epoch_commits,
    plan_resume,
    read_checkpoints,
)
from modeswitch.modes.stream_query import checkpoint_conf, sink_stream
from modeswitch.modes.stream_waves import discard_untaken
from modeswitch.offsets import OffsetsMap, offsets_to_dict, offsets_to_json
from modeswitch.sinks.commits import (
    SinkCommit,
    commits_after,
    event_time_from_micros,
)
from modeswitch.sinks.options import sink_options
from modeswitch.sources import open_log
from modeswitch.state import Epoch, StateStore, reconcile
from modeswitch.state.records import STREAM_EXIT
from modeswitch.storage import remove_tree

log = logging.getLogger(__name__)

STOP_COMMANDS: dict[str, str | None] = {
    "switch_to_batch": "force_batch",
    "pause": "pause",
    "rewind": None,
}
"""Commands that stop a running stream at its next commit boundary, with the policy action
each forces. A rewind forces none: the stream stops and leaves it pending, and ``decide``
applies it (a sink commit of its own) before it opens the next epoch at the rewound offsets."""
DECISION_RECORD_EVERY = timedelta(seconds=1)
DECISION_IDLE_EVERY = timedelta(seconds=15)
"""While what the policy sees does not move (the log's latest offsets and the sink's committed
ones as they were at the last recorded decision: a live stream with nothing to read), its
decision is recorded this seldom instead of every second: each record is a commit to the
decisions table, and an idle pipeline's recording was most of what it cost (4 idle pipelines on
one engine: its driver ~0.2 cores). A switch, a decision for another mode, or any movement
records at once, as before."""
PROGRESS_RECORD_EVERY = timedelta(seconds=1)
COMMAND_POLL_EVERY = timedelta(milliseconds=500)


@dataclass(frozen=True)
class StreamRunReport:
    """How a stream epoch's run ended."""

    epoch: int
    reason: str
    next_mode: str
    end: OffsetsMap
    micro_batches: int
    records: int
    command: int | None = None


def _epoch_max_event_times(store: StateStore) -> dict[int, datetime]:
    """Per bucket, the max event time of what the sink holds (a rewind drops the times of
    the buckets it moved back; see :meth:`EpochTable.max_event_times`)."""
    latest = store.epochs.max_event_times()
    return {b: event_time_from_micros(us) for b, us in latest.items()}


class StreamSupervisor:
    """The main thread's bookkeeping between micro-batches: progress, policy, commands."""

    def __init__(
        self,
        settings: PipelineSettings,
        store: StateStore,
        epoch_id: int,
        started_at: datetime,
        clock: Callable[[], datetime],
    ) -> None:
        self.settings = settings
        self.store = store
        self.epoch_id = epoch_id
        self.clock = clock
        self.started_at = started_at
        self.log = open_log(settings.source)
        self.max_event_time = _epoch_max_event_times(store)
        self.last_latest: OffsetsMap = {}
        self.last_seen_at = started_at
        self.outage_warned = False
        self.last_data_at: dict[int, datetime] = {}
        self.state = PolicyState(mode="stream", mode_since=started_at)
        self.last_recorded_decision: datetime | None = None
        self.recorded_view: tuple[dict, dict] | None = None  # (latest, committed) recorded
        self.micro_batches = 0
        self.records = 0
        self.committed: OffsetsMap = {}
        # Follow the log from where progress is known complete (``run`` reconciles first),
        # and move that mark on as the commits are recorded: what ``close_epoch`` reconciles
        # is then only what this job left unrecorded, however long the epoch ran.
        self.sink_version = store.progress.reconciled_through()
        self.complete_through = self.sink_version
        self.foreign_seen = False
        self.unrecorded: list[SinkCommit] = []
        self.last_recorded_progress: datetime | None = None
        self.quarantine = QuarantineWatch(
            settings.pipeline, epoch_id, settings.quarantine_warn_fraction
        )

    def follow_commits(self) -> list[SinkCommit]:
        """Take in this epoch's sink commits made since the last call (read from the new
        files of the sink's log only); they are recorded by :meth:`record_progress`."""
        found, self.sink_version = commits_after(
            self.settings.sink, self.settings.pipeline, self.sink_version
        )
        mine = [c for c in found if c.epoch == self.epoch_id and not c.is_rewind]
        foreign = [c for c in found if c.epoch != self.epoch_id or c.is_rewind]
        if foreign and not self.foreign_seen:
            # Not this epoch's (the epoch has ended under it): recorded by reconcile, so the
            # mark stops below the first.
            self.foreign_seen = True
            self.complete_through = (foreign[0].table_version or 0) - 1
        if not self.foreign_seen:
            self.complete_through = self.sink_version
        for commit in mine:
            self.micro_batches += 1
            self.records += commit.records
            warning = self.quarantine.add(
                commit.records, commit.quarantined, commit.quarantine_reasons
            )
            if warning is not None:
                log.warning("%s", warning)
            self.committed = dict(commit.end)
            for bucket, micros in commit.max_event_time_us.items():
                moment = event_time_from_micros(micros)
                if bucket not in self.max_event_time or moment > self.max_event_time[bucket]:
                    self.max_event_time[bucket] = moment
        self.unrecorded.extend(mine)
        return mine

    def record_progress(self, *, force: bool = False) -> int:
        """Record the commits taken in so far, in one progress-table commit, if a second has
        passed since the last one (or ``force``). A crash before it loses nothing: the sink's
        log is the truth and ``reconcile()`` records what is missing."""
        now = self.clock()
        due = (
            self.last_recorded_progress is None
            or now - self.last_recorded_progress >= PROGRESS_RECORD_EVERY
        )
        if not self.unrecorded or not (due or force):
            return 0
        recorded = self.store.progress.record_many(
            self.unrecorded, recorded_by="stream", through=self.complete_through
        )
        self.unrecorded = []
        self.last_recorded_progress = now
        return recorded

    def observe(self, now: datetime) -> Observation:
        try:
            latest = self.log.latest_offsets()
        except ModeswitchError as exc:
            # The query's own source rides out a broker restart; the policy's view of the
            # log waits for it too, on what it saw last (before it saw anything: on what the
            # sink holds), for a bounded time.
            grace = self.settings.source_outage_grace
            if now - self.last_seen_at > grace:
                silent = (now - self.last_seen_at).total_seconds()
                raise ModeswitchError(
                    f"stream epoch {self.epoch_id}: the source has not answered for "
                    f"{silent:.0f} s (source_outage_grace {grace}): {exc}"
                ) from exc
            if not self.outage_warned:
                log.warning(
                    "stream epoch %d: the source's latest offsets are unavailable; deciding on "
                    "those of %s for up to %s: %s",
                    self.epoch_id,
                    self.last_seen_at,
                    grace,
                    exc,
                )
                self.outage_warned = True
            latest = self.last_latest or dict(self.committed)
        else:
            self.last_seen_at, self.outage_warned = now, False
        for bucket, offset in latest.items():
            if offset != self.last_latest.get(bucket):
                self.last_data_at[bucket] = now
        self.last_latest = latest
        return Observation(
            now=now,
            committed={b: self.committed.get(b, 0) for b in latest},
            latest=latest,
            max_event_time=self.max_event_time,
            last_data_at=self.last_data_at,
        )

    def evaluate(self, command: OperatorCommand | None = None) -> Decision:
        now = self.clock()
        observation = self.observe(now)
        decision = decide_mode(
            observation, settings=self.settings.policy, previous=self.state, command=command
        )
        self.state = decision.state
        view = (dict(observation.latest), dict(observation.committed))
        every = DECISION_IDLE_EVERY if view == self.recorded_view else DECISION_RECORD_EVERY
        due = self.last_recorded_decision is None or now - self.last_recorded_decision >= every
        if decision.switched or decision.mode != "stream" or due:
            self.store.decisions.record(
                "batch" if decision.mode == "batch" else "stream",
                decision.reason,
                decision.to_record(),
                at=now,
                switched=decision.switched,
                epoch=self.epoch_id,
                decided_by="stream",
            )
            self.last_recorded_decision, self.recorded_view = now, view
        return decision


def check_handoff(store: StateStore, epoch_start: OffsetsMap, epoch_id: int) -> None:
    """Before the epoch's first commit, the stream must start exactly where the sink ends
    (invariant 2). Once it has committed, :func:`resume_point` checks its commits instead."""
    committed = store.progress.committed_offsets()
    different = {
        b: (epoch_start.get(b), committed[b])
        for b in committed
        if epoch_start.get(b) != committed[b]
    }
    if different:
        raise OffsetsContinuityError(
            f"stream epoch {epoch_id} starts at {offsets_to_json(epoch_start)} but the sink "
            f"holds up to {offsets_to_json(committed)}; buckets differ: {different}"
        )


def resume_point(store: StateStore, settings: PipelineSettings, epoch: Epoch) -> ResumePoint:
    """Where the epoch's query starts (:func:`modeswitch.modes.resume.plan_resume`): on its first
    run, at the epoch's start, which must be where the sink ends (the handoff); on a rerun,
    the sink's commits since the epoch began must all be the epoch's and continue from its
    start, and the query resumes its checkpoint if that is in step with the sink, else starts
    a fresh one at the sink's committed offsets."""
    commits = epoch_commits(
        settings.sink, settings.pipeline, epoch.id, storage_options=store.tables.storage_options
    )
    if not commits:
        check_handoff(store, epoch.start, epoch.id)
    root = settings.checkpoint(epoch.id)
    return plan_resume(epoch.id, epoch.start, commits, read_checkpoints(root), root)


def stream_deadline(settings: PipelineSettings, started_at: datetime) -> tuple[datetime, str]:
    """When a stream epoch whose query started at ``started_at`` ends at the latest, and the
    reason it then gives: ``max_stream_runtime`` after its start, or ``stream_ends_by`` if
    sooner (a run's end: a stream the engine starts at a batch's end has less time left than
    the batch had)."""
    runtime_end = started_at + settings.max_stream_runtime
    ends_by = settings.stream_ends_by
    if ends_by is not None and ends_by < runtime_end:
        return ends_by, f"stream_ends_by {ends_by.isoformat()} reached"
    return runtime_end, f"max_stream_runtime {settings.max_stream_runtime} reached"


def first_progress(query: Any) -> str:
    """Where a query's first micro-batch spent its time, from its first progress report
    (Spark's ``durationMs``, the longest first): what a handoff's last step is made of."""
    reports = query.recentProgress[:1]
    if not reports:
        return "no progress report yet"
    durations = sorted(reports[0]["durationMs"].items(), key=lambda item: -item[1])
    return ", ".join(f"{name} {ms} ms" for name, ms in durations)


def run_stream_epoch(
    spark,
    job: JobPlan,
    epoch_id: int,
    *,
    clock: Callable[[], datetime] = lambda: pendulum.now("UTC"),
    poll: timedelta = timedelta(milliseconds=200),
) -> StreamRunReport:
    """Run stream epoch ``epoch_id`` with the resolved ``job``
    (:func:`~modeswitch.modes.job.resolve_job`) until the policy, a command or the runtime
    stops it."""
    settings = job.settings
    assert job.stream is not None, f"a {job.kind} job runs no stream"
    log.info("stream epoch %d: %s", epoch_id, job.stream.reason)
    store = StateStore.from_settings(settings)
    epoch = store.epochs.get(epoch_id)
    if epoch.mode != "stream" or epoch.status != "running":
        raise FencedError(
            f"epoch {epoch_id} is a {epoch.status} {epoch.mode} epoch; the stream job only "
            "runs a running stream epoch"
        )
    reconcile(store)
    point = resume_point(store, settings, epoch)
    log.info("stream epoch %d %s", epoch_id, point.describe())
    if not point.resumed:
        remove_tree(point.checkpoint)  # not to be resumed
    start_json = offsets_to_json(point.start)
    options = sink_options(settings, epoch_id, "stream", columns_from=job.transform.columns_from)
    options["sequence"] = str(point.sequence_base)
    writer = sink_stream(
        spark,
        job,
        job.stream,
        source=settings.source,
        start_json=start_json,
        sink=settings.sink,
        options=options,
        checkpoint=point.checkpoint,
    ).queryName(f"{settings.pipeline}-epoch-{epoch_id}")
    available_now = settings.stream_trigger == "available_now"
    started_at = clock()
    # The stream's time in mode counts from its query start, not from when decide opened the
    # epoch: Spark's start-up is not time spent streaming.
    supervisor = StreamSupervisor(settings, store, epoch_id, started_at, clock)
    supervisor.committed = dict(point.committed)
    interval_ms = max(1, int(settings.trigger_interval.total_seconds() * 1000))
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{interval_ms} milliseconds")
    for key, value in checkpoint_conf(point.checkpoint).items():
        spark.conf.set(key, value)
    try:
        query = writer.start()
    except BaseException:
        discard_untaken(point.checkpoint)
        raise
    log.info(
        "stream epoch %d: query started from %s (sequence %d on)",
        epoch_id,
        start_json,
        point.sequence_base,
    )
    reason, next_mode, command_id, command_action = "", "stream", None, None
    commands_checked: datetime | None = None
    try:
        deadline, reached = stream_deadline(settings, started_at)
        # Each turn follows the sink's commits, one poll apart. No StreamingQueryListener:
        # PySpark's turns each progress event into Python with dozens of Py4J calls, some
        # resolving names through every jar on the class path, 0.26 CPU-s a second of
        # streaming on the JVM side (JFR); it only woke this loop a poll earlier.
        while query.isActive:
            time.sleep(poll.total_seconds())
            new = supervisor.follow_commits()
            if new and supervisor.micro_batches == len(new):
                log.info(
                    "stream epoch %d: first micro-batch committed, %d records (%s)",
                    epoch_id,
                    new[0].records,
                    first_progress(query),
                )
            pending = None
            if commands_checked is None or clock() - commands_checked >= COMMAND_POLL_EVERY:
                pending = _stop_command(store)
                commands_checked = clock()
            if pending is not None:
                stop_id, kind = pending
                reason = f"command #{stop_id} {kind}"
                action = STOP_COMMANDS[kind]
                if action is None:
                    reason += " (left pending: decide applies it before the next epoch)"
                else:
                    command_id, command_action = stop_id, action
                    decision = supervisor.evaluate(OperatorCommand(action, f"#{stop_id}"))
                    next_mode = decision.mode
                break
            if supervisor.micro_batches == 0:
                # Nothing read yet: the lag still measures the previous epoch and the
                # start-up, not whether this stream keeps up.
                if clock() >= deadline:
                    reason = reached
                    break
                continue
            decision = supervisor.evaluate()
            supervisor.record_progress()
            if decision.mode != "stream":
                reason, next_mode = f"policy: {decision.reason}", decision.mode
                break
            if clock() >= deadline:
                reason = reached
                break
        else:
            error = query.exception()
            if not available_now or error is not None:
                raise StreamQueryError(
                    f"stream epoch {epoch_id}: the query reading {supervisor.log} stopped: {error}"
                ) from error
            reason = "availableNow: read everything that was there at the start"
    finally:
        query.stop()
        discard_untaken(point.checkpoint)
    error = query.exception()
    if error is not None:
        raise StreamQueryError(
            f"stream epoch {epoch_id}: the query reading {supervisor.log} failed: {error}"
        ) from error
    supervisor.follow_commits()
    supervisor.record_progress(force=True)
    end = {**epoch.start, **store.progress.committed_offsets()}
    if command_id is not None:
        store.commands.apply(command_id, epoch_id, end)
    # The exit itself is a decision: close_epoch reads its reason, and the next decide the
    # command it applied (modeswitch.runners.lifecycle.carried_command).
    inputs = {"end": offsets_to_dict(end), "state": supervisor.state.to_record(), "mode": next_mode}
    if command_id is not None:
        inputs["command"] = {"id": command_id, "action": command_action}
    store.decisions.record(
        "batch" if next_mode == "batch" else "stream",
        f"stream stopped: {reason}",
        inputs,
        switched=next_mode != "stream",
        epoch=epoch_id,
        decided_by=STREAM_EXIT,
    )
    log.info("stream epoch %d stopped: %s; end offsets %s", epoch_id, reason, end)
    return StreamRunReport(
        epoch_id,
        reason,
        next_mode,
        end,
        supervisor.micro_batches,
        supervisor.records,
        command_id,
    )


def _stop_command(store: StateStore) -> tuple[int, str] | None:
    """The oldest pending command that stops a stream, if any."""
    for command in store.commands.pending():
        if command.kind in STOP_COMMANDS:
            return command.id, command.kind
    return None
