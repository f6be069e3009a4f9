"""What both of the sink's committers check before a commit of the pipeline's.

The ``deltalake`` committer (:func:`modeswitch.sinks.committer.commit_files`) and delta-spark's
(:func:`modeswitch.sinks.delta_spark.write_micro_batch`) read the sink's snapshot
(:func:`open_sink_table`, kept open per thread), compare its app transaction with the
commit's (:func:`check_fencing`: a replay is skipped, a zombie refused), check that a replay
covers what it replays (:func:`check_replay`), and build the commit, continuing where the
pipeline's newest one ended (:func:`next_sink_commit`). The fencing rules are in
:mod:`modeswitch.sinks.delta`'s docstring.
"""

from __future__ import annotations

import logging
from typing import Any

from modeswitch.errors import FencedError, ModeswitchError, OffsetsContinuityError
from modeswitch.offsets import OffsetsMap
from modeswitch.sinks.commits import SinkCommit, newest_commit_in, split_txn_version, txn_version
from modeswitch.sinks.options import DeltaSinkOptions
from modeswitch.storage import open_delta_table

log = logging.getLogger(__name__)


def open_sink_table(options: DeltaSinkOptions) -> Any:
    """The sink table's current snapshot, None before the first commit
    (:func:`open_delta_table`)."""
    return open_delta_table(options.path, options.storage_options)


def check_fencing(table: Any, options: DeltaSinkOptions, sequence: int) -> Any:
    """Compare with the table's app transaction; return the previous commit or 'replayed'."""
    assert options.pipeline is not None and options.epoch is not None
    mine = txn_version(options.epoch, sequence)
    current = table.transaction_version(options.pipeline) if table is not None else None
    if current is not None and current == mine:
        log.warning(
            "sink: epoch %d sequence %d already committed (a replay); skipped",
            options.epoch,
            sequence,
        )
        return "replayed"
    if current is not None and current > mine:
        epoch, seq = split_txn_version(current)
        raise FencedError(
            f"sink {options.path}: refused commit of pipeline {options.pipeline!r} epoch "
            f"{options.epoch} sequence {sequence}: the table already holds epoch {epoch} "
            f"sequence {seq}. This writer belongs to an ended epoch (a zombie) or replays "
            "out of order."
        )
    if current is None:
        return None
    return newest_commit_in(table, options.pipeline)


def check_replay(table: Any, options: DeltaSinkOptions, sequence: int, end: Any) -> None:
    """A replay must cover what the commit it replays covered: the same end offsets. One that
    does not (two runs of an epoch that planned a micro-batch differently) is refused, so the
    run that thinks it committed other offsets than the sink holds cannot go on."""
    landed = newest_commit_in(table, options.pipeline)  # type: ignore[arg-type]
    if end is None or landed is None or landed.sequence != sequence:
        return
    differ = {b: (o, landed.end.get(b)) for b, o in end.items() if landed.end.get(b) != o}
    if differ:
        raise OffsetsContinuityError(
            f"sink {options.path}: epoch {options.epoch} sequence {sequence} is already "
            f"committed with other end offsets (this write, the sink's): {differ}"
        )


def next_sink_commit(
    options: DeltaSinkOptions,
    sequence: int,
    start: OffsetsMap | None,
    end: OffsetsMap | None,
    records: int,
    max_event: dict[int, int],
    previous: SinkCommit | None,
) -> SinkCommit:
    """The commit a write of ``records`` records makes as ``sequence`` of the options' epoch:
    ``[start, end)`` per bucket (``start`` None: where ``previous``, the pipeline's newest
    commit, ended), with the full end map. Refuses (:class:`OffsetsContinuityError`) a range
    that does not continue where ``previous`` ended, or that ends before it starts."""
    assert options.pipeline is not None and options.epoch is not None
    before = dict(previous.end) if previous else {}
    if end is None:
        raise ModeswitchError(
            f"sink {options.path}: no end offsets for epoch {options.epoch} sequence "
            f"{sequence} (give option offsetsEnd, or checkpointLocation for streaming writes)"
        )
    begin = dict(start) if start is not None else {b: before.get(b, 0) for b in end}
    for bucket, offset in end.items():
        first = begin.get(bucket, before.get(bucket, offset))
        if first > offset:
            raise OffsetsContinuityError(
                f"sink {options.path}: bucket {bucket}: start offset {first} is after end "
                f"offset {offset} (epoch {options.epoch} sequence {sequence})"
            )
        if bucket in before and first != before[bucket]:
            kind = "a gap" if first > before[bucket] else "an overlap"
            raise OffsetsContinuityError(
                f"sink {options.path}: bucket {bucket}: epoch {options.epoch} sequence "
                f"{sequence} starts at offset {first} but the sink holds up to offset "
                f"{before[bucket]}: {kind}. A commit must continue where the last one ended."
            )
    full_end = {**before, **end}
    return SinkCommit(
        pipeline=options.pipeline,
        epoch=options.epoch,
        mode=options.mode,  # type: ignore[arg-type]
        sequence=sequence,
        start={b: begin.get(b, before.get(b, end[b])) for b in end},
        end=full_end,
        records=records,
        max_event_time_us=max_event,
    )
