"""Deciding and closing epochs: what the Airflow ``decide`` and ``close_epoch`` tasks do.

No Spark here: the control tables and the source's offsets are read with deltalake and the
log itself, in milliseconds. :func:`decide` calls the same
:func:`~modeswitch.control.policy.decide_mode`
as the stream job, opens the next epoch with its exact start offsets (the sink's committed
offsets: the handoff) and, for a batch epoch, its boundary (the source's latest offsets now).
:func:`close_epoch` checks that a batch epoch reached its boundary, or records where a stream
epoch stopped and why. Pending ``rewind`` commands are applied by :func:`decide` between
epochs, before it opens the next one at the rewound offsets (:func:`apply_rewinds`); a running
batch epoch finishes first, a running stream stops at its next commit boundary. Which of the
pending commands, the ``force_mode`` run param and the policy decides is
:func:`operator_override`'s choice, a pure function.

Outside Airflow, :mod:`modeswitch.runners.pipeline_run` strings decide, a runner's jobs and
close together; the warm engine's own handoff from a batch to its stream is
:func:`hand_off_to_stream`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import pendulum
import pyarrow.fs as pafs

from modeswitch.control.policy import (
    Decision,
    Mode,
    Observation,
    OperatorCommand,
    PolicyState,
    decide_mode,
)
from modeswitch.control.quarantine import describe_quarantine, quarantines_most
from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import (
    InvalidOffsetsError,
    InvalidStateTransitionError,
    ModeswitchError,
    OffsetOutOfRangeError,
    RewindRefusedError,
)
from modeswitch.offsets import OffsetsMap, offsets_from_dict, offsets_to_json
from modeswitch.sinks.commits import event_time_from_micros, latest_sink_commit
from modeswitch.sinks.features import check_tables
from modeswitch.sinks.rewind import check_rewind, rewind_quarantine, rewind_sink
from modeswitch.sources import open_log
from modeswitch.state import StateStore, reconcile
from modeswitch.state.records import STREAM_EXIT, RecordedDecision

log = logging.getLogger(__name__)

ForceMode = Literal["auto", "batch", "stream"]
_COMMAND_OVERRIDES = {
    "switch_to_batch": "force_batch",
    "switch_to_stream": "force_stream",
    "pause": "pause",
}


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


def operator_override(
    pending: Sequence[tuple[int, str]],
    force_mode: ForceMode = "auto",
    carried: OperatorCommand | None = None,
) -> tuple[OperatorCommand | None, list[int]]:
    """What overrides the policy at a ``decide``, and which commands it applies.

    ``carried`` is a command the last stream applied when it stopped for it
    (:func:`carried_command`): it decides this once, as if it were still pending.
    ``pending`` are the pending commands as ``(id, kind)``, oldest first. Each switch, pause
    or resume command is applied when the epoch opens (or the decision is made), and the
    newest of them decides (an operator who asked for batch, then stream, wants stream; a
    pause then a resume, running); a ``resume`` lifts a pause and leaves the choice to the
    policy; a ``rewind`` is not this function's (:func:`apply_rewinds` applies it before).
    A ``force_mode`` other than ``auto`` (a run param) wins over every command, which are
    still applied. Returns the override for :func:`~modeswitch.control.policy.decide_mode`
    (None: the policy decides) and the ids of the commands applied.
    """
    command = carried
    applied: list[int] = []
    for command_id, kind in pending:
        if kind in _COMMAND_OVERRIDES:
            command = OperatorCommand(_COMMAND_OVERRIDES[kind], f"#{command_id}")
            applied.append(command_id)
        elif kind == "resume":
            command = OperatorCommand("resume", f"#{command_id}")
            applied.append(command_id)
    if force_mode != "auto":
        command = OperatorCommand(f"force_{force_mode}", "run param force_mode")
    return command, applied


def carried_command(decision: RecordedDecision | None) -> OperatorCommand | None:
    """The command a stream applied when it stopped for it, if that stop is the newest
    decision: ``switch_to_batch`` stops the stream so that a batch epoch runs next, and the
    policy alone would not choose one when its signals see no backlog (a stream that keeps
    up), so the next ``decide`` applies it as the override, once."""
    if decision is None or decision.decided_by != STREAM_EXIT:
        return None
    command = decision.inputs.get("command")  # recorded only for a command with an action
    if not command:
        return None
    return OperatorCommand(command["action"], f"#{command['id']}, which stopped the stream")


def previous_state(store: StateStore) -> PolicyState | None:
    """What the policy remembers from the newest decision (None before the first)."""
    return policy_state_of(store.decisions.latest())


def policy_state_of(decision: RecordedDecision | None) -> PolicyState | None:
    """The policy state a recorded decision left (None for none, or one without it)."""
    state = None if decision is None else decision.inputs.get("state")
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
    # A bucket the sink holds nothing of starts at its earliest offset, or with start_from
    # latest at its latest: the pipeline goes live, and backfills fill in below.
    first = latest if settings.start_from == "latest" else earliest
    committed = {**first, **store.progress.committed_offsets()}
    check_retained(settings.source, committed, earliest)
    max_event = store.epochs.max_event_times()
    observation = Observation(
        now=now,
        committed=committed,
        latest=latest,
        max_event_time={b: event_time_from_micros(us) for b, us in max_event.items()},
        # Unread data keeps a bucket from being idle; between epochs nothing else is known.
        last_data_at={b: now for b in latest if latest[b] > committed.get(b, 0)},
    )
    return observation, committed


def check_retained(source: str, committed: Mapping[int, int], earliest: Mapping[int, int]) -> None:
    """Refuse to go on from offsets the source no longer holds (retention dropped records
    the pipeline never read): an error naming each bucket and the offsets lost, and what the
    operator can do. Raised before an epoch opens, so nothing is written."""
    dropped = {b: (o, earliest[b]) for b, o in sorted(committed.items()) if o < earliest.get(b, o)}
    if not dropped:
        return
    lost = ", ".join(f"bucket {b}: [{o}, {e})" for b, (o, e) in dropped.items())
    raise OffsetOutOfRangeError(
        f"source {source}: the pipeline has committed up to offsets the source no longer "
        f"holds: retention dropped records it never read ({lost}). Nothing was written, "
        "and those records cannot be read again. To go on, start afresh with a new sink (the "
        "pipeline or sink setting), which starts from the earliest offsets, and make the "
        "source keep records longer (the topic's retention) than the pipeline can fall behind"
    )


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
    running = store.epochs.current()
    if running is not None:
        raise InvalidStateTransitionError(
            f"rewinds are applied between epochs; epoch {running.id} ({running.mode}) is "
            "still running"
        )
    options = store.tables.storage_options
    if not dry_run:
        newest = latest_sink_commit(settings.sink, settings.pipeline, storage_options=options)
        if newest is not None and newest.is_rewind:
            # A crash may have come between a rewind's sink and quarantine commits.
            rewind_quarantine(
                settings.quarantine, settings.pipeline, newest, storage_options=options
            )
    pending = [c for c in store.commands.pending() if c.kind == "rewind"]
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
                committed = {
                    **earliest,
                    **store.progress.committed_offsets(),
                    **applied_end(applied),
                }
                check_rewind(
                    command.id, offsets, committed=committed, earliest=earliest, buckets=buckets
                )
                moved = {b: o for b, o in offsets.items() if b in committed}
                applied.append(AppliedRewind(command.id, offsets, {**committed, **moved}))
                continue
            last = store.epochs.latest()
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
                issued_at=command.created_at,
            )
        except (RewindRefusedError, InvalidOffsetsError) as exc:
            log.warning("%s", exc)
            if not dry_run:
                store.commands.reject(command.id, str(exc))
            continue
        store.commands.acknowledge_rewind(outcome.commit)
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
    only: Mode | None = None,
    now: datetime | None = None,
    decided_by: str = "decide",
    storage_options: Mapping[str, str] | None = None,
) -> EpochPlan:
    """Choose the next epoch's mode and open it (unless ``dry_run``; with ``only``, unless
    the choice is another mode: nothing is then written, as with ``dry_run``).

    A running epoch (an Airflow retry of a run whose epoch is still open) is re-attached,
    not replaced. Pending ``rewind`` commands are applied first (:func:`apply_rewinds`), so
    the new epoch starts at the rewound offsets and its reason names the command. Pending
    switch and pause commands override the policy and are applied, with the start offsets,
    when the epoch opens; ``force_mode`` (a run param) does the same. ``storage_options``:
    the tables' storage options (None: from the environment, see
    :meth:`StateStore.from_settings`).
    """
    store = StateStore.from_settings(settings, storage_options=storage_options)
    # A table feature the pipeline cannot write beside (a user's ALTER TABLE): refused before
    # anything is written, a re-attached epoch's rerun included.
    check_tables(
        {"sink table": settings.sink, "quarantine table": settings.quarantine},
        dict(store.tables.storage_options),
    )
    if not dry_run:
        reconcile(store)
    current = store.epochs.current()
    if current is not None:
        log.info("epoch %d (%s) is still running: re-attaching", current.id, current.mode)
        return EpochPlan(
            current.id, current.mode, "re-attached", current.start, current.boundary, True
        )
    now = now or pendulum.now("UTC")
    tentative = dry_run or only is not None
    rewinds = apply_rewinds(settings, store, dry_run=tentative)
    observation, committed = observe(settings, store, now)
    if tentative:
        committed = {**committed, **applied_end(rewinds)}
    pending = [(c.id, c.kind) for c in store.commands.pending()]
    latest = store.decisions.latest()  # read once: the carried command and the policy's state
    command, applied = operator_override(pending, force_mode, carried_command(latest))
    decision: Decision = decide_mode(
        observation, settings=settings.policy, previous=policy_state_of(latest), command=command
    )
    record = decision.to_record()
    reason = "; ".join(
        [*(r.describe() for r in rewinds), decision.reason, *quarantine_note(settings, store)]
    )
    done = tuple(r.command for r in rewinds)
    if dry_run or (only is not None and decision.mode != only):
        if rewinds:
            reason = f"would apply {reason}"
        return EpochPlan(
            None, decision.mode, reason, committed, None, commands=done, decision=record
        )
    if only is not None and rewinds:
        # Rewinds were only checked: apply them, and decide again on what they leave.
        return decide(
            settings,
            force_mode=force_mode,
            now=now,
            decided_by=decided_by,
            storage_options=storage_options,
        )
    store.decisions.record(
        "batch" if decision.mode == "batch" else "stream",
        reason,
        record,
        at=now,
        switched=decision.switched,
        decided_by=decided_by,
    )
    if decision.mode == "paused":
        # No epoch opens; the pause is applied at the last epoch's end (the commit boundary).
        last = store.epochs.latest()
        if last is not None:
            for command_id in applied:
                store.commands.apply(command_id, last.id, committed)
        return EpochPlan(
            None, "paused", reason, committed, None, commands=(*done, *applied), decision=record
        )
    boundary = dict(observation.latest) if decision.mode == "batch" else None
    epoch = store.epochs.open(decision.mode, reason, committed, boundary)
    for command_id in applied:
        store.commands.apply(command_id, epoch, committed)
    return EpochPlan(
        epoch, decision.mode, reason, committed, boundary, False, (*done, *applied), record
    )


def quarantine_note(settings: PipelineSettings, store: StateStore) -> list[str]:
    """A warning for the next decision's reason when the last epoch quarantined most of its
    records (:mod:`modeswitch.control.quarantine`), else nothing. Reads the progress rows of
    that epoch only."""
    last = store.epochs.latest()
    if last is None:
        return []
    summary = store.progress.epoch_summaries(last.id).get(last.id) or {}
    records, quarantined = summary.get("records", 0), summary.get("quarantined", 0)
    if not quarantines_most(records, quarantined, settings.quarantine_warn_fraction):
        return []
    return [
        f"warning: {describe_quarantine(last.id, records, quarantined)}, more than "
        f"quarantine_warn_fraction = {settings.quarantine_warn_fraction:g}"
    ]


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
    reconcile(store)
    epoch = store.epochs.get(epoch_id)
    end = {**epoch.start, **store.progress.committed_offsets()}
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
            store.epochs.close(epoch_id, end, "failed", f"buckets below their boundary: {short}")
            raise ModeswitchError(
                f"batch epoch {epoch_id} ended below its boundary in buckets "
                + ", ".join(f"{b} ({at} < {target})" for b, (at, target) in short.items())
            )
        store.epochs.close(epoch_id, end, "completed", "every bucket reached its boundary")
        return "completed", end
    reason = next(
        (d.reason for d in store.decisions.list(limit=20) if d.epoch == epoch_id),
        "stream stopped",
    )
    store.epochs.close(epoch_id, end, "completed", reason)
    clean_checkpoints(settings, store, keep=settings.stream_checkpoints_kept)
    return "completed", end


def hand_off_to_stream(
    settings: PipelineSettings, batch_epoch: int, *, decided_by: str
) -> int | None:
    """Close batch epoch ``batch_epoch`` and, if the policy (or a pending command) then
    chooses stream, open the stream epoch at once (:func:`decide`); returns its id, or None
    when the batch did not complete or anything but a stream comes next (left to the next
    ``decide``). What the warm engine does between a batch and its stream, without waiting for
    the next DAG run."""
    status, _ = close_epoch(settings, batch_epoch)
    if status != "completed":
        return None
    plan = decide(settings, only="stream", decided_by=decided_by)
    return plan.epoch if plan.mode == "stream" else None


_CHECKPOINT_FOLDER = re.compile(r"^epoch-(\d+)(?:-from-\d+)?$")


def clean_checkpoints(settings: PipelineSettings, store: StateStore, *, keep: int) -> list[str]:
    """Delete the Spark checkpoint folders (``epoch-N``, ``epoch-N-from-S``) of ended stream
    epochs, all but those of the ``keep`` newest; returns the folders deleted. A running
    epoch's folders are never touched (its retries resume from them); a zombie job of an ended
    epoch whose folder is gone is fenced at the sink all the same."""
    from modeswitch.storage import filesystem, remove_tree

    fs, root = filesystem(settings.checkpoint_root)
    if fs.get_file_info(root).type.name != "Directory":
        return []
    folders: dict[int, list[str]] = {}
    for info in fs.get_file_info(pafs.FileSelector(root)):
        name = info.base_name
        match = _CHECKPOINT_FOLDER.match(name)
        if match and info.type.name == "Directory":
            folders.setdefault(int(match.group(1)), []).append(name)
    ended = sorted(e for e in folders if not store.epochs.get(e).running)
    removed = []
    for epoch in ended[: max(len(ended) - keep, 0)]:
        for name in folders[epoch]:
            remove_tree(f"{settings.checkpoint_root}/{name}")
            removed.append(name)
    if removed:
        log.info(
            "pipeline %s: deleted the checkpoints of ended epochs: %s", settings.pipeline, removed
        )
    return removed


# -- decide, run, close: the lifecycle around a runner -----------------------------------------

EpochDone = tuple[EpochPlan, str, OffsetsMap]
"""An epoch that ran: its plan, how it closed (``completed``, ...) and where it ended."""
