"""Backlog boundaries and balanced splits for BATCH epochs.

Planning a batch epoch records its :class:`BacklogBoundary`: the latest offset of every bucket
at plan time (Fluss #2509's backlog offsets). The epoch must read, per bucket, exactly
``[committed, boundary)``: no gap, no overlap. :func:`plan_batch` cuts that backlog into
:class:`Split` ranges and groups them into :class:`Wave` s, the units the sink commits.

How a plan is cut (FLIP-537 / FLINK-31762 balance under skew, FLIP-309 large commits):

1. The bucket ranges are laid end to end, in bucket order, on one line of records.
2. The line is cut into waves of ``wave_records`` records (the last wave may be shorter).
   A bucket's records therefore reach the waves in offset order: wave k of a bucket lies
   before wave k+1 of the same bucket, so after any prefix of waves is committed every
   bucket's committed offset is the end of a contiguous range.
3. Each wave is cut into ``parallelism`` partitions of equal size (to one record):
   McNaughton's wrap-around rule. Records are divisible work, so this is optimal, better than
   longest-processing-time-first: a wave's makespan is ``ceil(wave records / parallelism)``.
   A bucket larger than a partition is simply read by several partitions at once.
4. A bucket's piece in a partition longer than ``max_split_records`` is cut into near-equal
   splits no longer than that.

A partition is a tuple of splits that one read task reads one after the other. Planning is
deterministic: the same inputs give the same plan, so a retried task re-reads the same range.

Recovery (FLIP-537's three cases) plans with :func:`plan_batch` too: a new run after a failure
plans only ``[sink's committed offsets, boundary)``, its waves numbered on after the ledger's
(:func:`modeswitch.modes.batch.plan_remaining`); a retried task reads an identical split; a wave
that the sink committed but the ledger did not record is marked committed from the sink's log
(:func:`~modeswitch.state.reconcile`) and, starting from the sink's offsets, is
never planned again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from modeswitch.control.setting_groups import PlannerSettings
from modeswitch.errors import OffsetOutOfRangeError, UnknownBucketError
from modeswitch.offsets import OffsetsMap, offsets_from_dict, offsets_to_dict

log = logging.getLogger(__name__)

Partition = tuple["Split", ...]


@dataclass(frozen=True, order=True, slots=True)
class Split:
    """The records ``[start, end)`` of one bucket; ``start < end``. Picklable, ordered by
    ``(bucket, start)``."""

    bucket: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise OffsetOutOfRangeError(
                f"bucket {self.bucket}: split [{self.start}, {self.end}) is empty or negative"
            )

    @property
    def records(self) -> int:
        """Number of records in the split."""
        return self.end - self.start


@dataclass(frozen=True)
class BacklogBoundary:
    """Per bucket, the end offset (exclusive) a batch epoch must reach: the latest offsets at
    plan time. ``offsets`` is validated and stored as a ``{bucket: offset}`` dict in bucket
    order; do not mutate it."""

    offsets: OffsetsMap

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets", offsets_from_dict(self.offsets, source="boundary"))

    @property
    def buckets(self) -> frozenset[int]:
        """The buckets the boundary covers."""
        return frozenset(self.offsets)

    def remaining(self, committed: Mapping[int, int]) -> OffsetsMap:
        """Per bucket, the records still to read before the boundary (0 once reached).

        A bucket missing from ``committed`` counts from 0. A committed offset above the
        boundary, or a committed bucket the boundary does not cover, is an error naming it.
        """
        committed = offsets_from_dict(committed, source="committed")
        _check_known(committed, self.offsets)
        result: OffsetsMap = {}
        for bucket, end in self.offsets.items():
            position = committed.get(bucket, 0)
            _check_not_above(bucket, position, end)
            result[bucket] = end - position
        return result

    def to_dict(self) -> dict[str, int]:
        """Wire format (string keys), as the epoch record stores it."""
        return offsets_to_dict(self.offsets)


@dataclass(frozen=True)
class Wave:
    """The splits committed together in one sink commit.

    ``index`` never repeats within an epoch (a re-plan continues the numbering), so a sink that
    fences on ``(epoch, wave)`` never mistakes a re-planned wave for an old one.
    ``partitions`` holds at most ``parallelism`` tuples of splits, each read by one task.
    """

    index: int
    partitions: tuple[Partition, ...]

    @property
    def splits(self) -> tuple[Split, ...]:
        """Every split of the wave, partition by partition."""
        return tuple(split for partition in self.partitions for split in partition)

    @property
    def records(self) -> int:
        """Records in the wave."""
        return sum(split.records for split in self.splits)

    @property
    def makespan(self) -> int:
        """Records read by the busiest partition: the wave's duration in record units."""
        return max((_partition_records(p) for p in self.partitions), default=0)

    def end_offsets(self) -> OffsetsMap:
        """Per bucket the wave touches, the committed offset once the wave is committed."""
        ends: OffsetsMap = {}
        for split in self.splits:
            ends[split.bucket] = max(ends.get(split.bucket, 0), split.end)
        return dict(sorted(ends.items()))


@dataclass(frozen=True)
class BatchPlan:
    """The plan of one batch epoch (or of its re-run after a failure).

    ``start`` is the committed offsets the plan starts from, ``boundary`` the offsets it must
    reach; the splits of ``waves`` cover exactly ``[start, boundary)`` in every bucket.
    ``finished_buckets`` are the buckets that had nothing to read at plan time.
    """

    boundary: BacklogBoundary
    start: OffsetsMap
    waves: tuple[Wave, ...]
    finished_buckets: frozenset[int]
    settings: PlannerSettings

    @property
    def parallelism(self) -> int:
        """Read tasks the plan was balanced for."""
        return self.settings.parallelism

    @property
    def splits(self) -> tuple[Split, ...]:
        """Every split, wave by wave."""
        return tuple(split for wave in self.waves for split in wave.splits)

    @property
    def total_records(self) -> int:
        """Records the plan reads."""
        return sum(wave.records for wave in self.waves)

    @property
    def makespan(self) -> int:
        """Planned duration in record units: waves run one after the other, so the sum over
        waves of the busiest partition's records."""
        return sum(wave.makespan for wave in self.waves)

    @property
    def ideal_makespan(self) -> float:
        """The lower bound ``total_records / parallelism``."""
        return self.total_records / self.parallelism

    def committed_after(self, wave_index: int) -> OffsetsMap:
        """The committed offsets once every wave up to and including ``wave_index`` is
        committed (the plan's ``start`` for buckets those waves do not touch)."""
        committed = dict(self.start)
        for wave in self.waves:
            if wave.index > wave_index:
                break
            committed.update(wave.end_offsets())
        return committed


def plan_splits(
    start: Mapping[int, int],
    boundary: Mapping[int, int],
    *,
    max_split_records: int,
) -> tuple[Split, ...]:
    """Cut ``[start, boundary)`` of every bucket into near-equal splits of at most
    ``max_split_records`` records, in bucket then offset order.

    Buckets missing from ``start`` start at 0; buckets with nothing to read get no split.
    Errors: a bucket in ``start`` but not in ``boundary`` (:class:`UnknownBucketError`); a start
    above its boundary (:class:`OffsetOutOfRangeError`); ``max_split_records`` not > 0
    (:class:`ConfigError`). All name the bucket or setting and the value.
    """
    settings = PlannerSettings(max_split_records=max_split_records)
    starts, ends = _ranges(start, boundary, earliest=None)
    return tuple(
        split
        for bucket, end in ends.items()
        for split in _cut(bucket, starts[bucket], end, settings.max_split_records)
    )


def plan_batch(
    committed: Mapping[int, int],
    latest: Mapping[int, int],
    *,
    max_split_records: int,
    wave_records: int,
    parallelism: int,
    earliest: Mapping[int, int] | None = None,
    first_wave_index: int = 0,
) -> BatchPlan:
    """Plan a batch epoch: the boundary is ``latest``; the splits cover exactly
    ``[committed, latest)`` per bucket, in waves of at most ``wave_records`` records, each wave
    cut into at most ``parallelism`` equal partitions (see the module docstring).

    A bucket of ``latest`` missing from ``committed`` starts at ``earliest`` (or 0). Buckets
    with nothing to read are in ``finished_buckets``. Waves are numbered from
    ``first_wave_index``. Deterministic: the same arguments give an equal plan.

    Errors, each naming the bucket or setting and the value: a committed bucket that ``latest``
    lacks (:class:`UnknownBucketError`); a committed offset above the boundary or below the
    earliest retained offset (:class:`OffsetOutOfRangeError`); a size not > 0
    (:class:`ConfigError`).
    """
    settings = PlannerSettings(
        max_split_records=max_split_records, wave_records=wave_records, parallelism=parallelism
    )
    boundary = BacklogBoundary(latest)
    starts, ends = _ranges(committed, boundary.offsets, earliest=earliest)
    pieces = ((b, starts[b], end) for b, end in ends.items() if end > starts[b])
    waves = tuple(
        Wave(index=first_wave_index + number, partitions=_partition_wave(wave_pieces, settings))
        for number, wave_pieces in enumerate(_cut_line(pieces, settings.wave_records))
    )
    plan = BatchPlan(
        boundary=boundary,
        start=starts,
        waves=waves,
        finished_buckets=frozenset(b for b, end in ends.items() if end == starts[b]),
        settings=settings,
    )
    log.debug(
        "planned %d records in %d buckets: %d waves, %d splits, makespan %d (ideal %.0f)",
        plan.total_records,
        len(ends),
        len(waves),
        sum(len(w.splits) for w in waves),
        plan.makespan,
        plan.ideal_makespan,
    )
    return plan


def newly_finished_buckets(
    boundary: BacklogBoundary | Mapping[int, int],
    committed: Mapping[int, int],
    already_finished: Iterable[int] = (),
) -> frozenset[int]:
    """Fluss's BacklogFinishEvent: the buckets whose committed offset has reached the boundary
    and that are not in ``already_finished``, so each bucket is reported once per epoch.

    A bucket missing from ``committed`` is at 0. A committed offset above the boundary is an
    error (:class:`OffsetOutOfRangeError`) naming the bucket.
    """
    if not isinstance(boundary, BacklogBoundary):
        boundary = BacklogBoundary(boundary)
    reported = frozenset(already_finished)
    remaining = boundary.remaining(committed)
    return frozenset(b for b, left in remaining.items() if left == 0 and b not in reported)


# --- internals -------------------------------------------------------------------------------


def _partition_records(partition: Partition) -> int:
    return sum(split.records for split in partition)


def _check_known(committed: Mapping[int, int], boundary: Mapping[int, int]) -> None:
    for bucket, position in committed.items():
        if bucket not in boundary:
            raise UnknownBucketError(
                f"bucket {bucket}: has committed offset {position} but the latest offsets "
                f"have no such bucket (buckets {min(boundary, default=None)}.."
                f"{max(boundary, default=None)}, {len(boundary)} in all)"
            )


def _check_not_above(bucket: int, position: int, end: int) -> None:
    if position > end:
        raise OffsetOutOfRangeError(
            f"bucket {bucket}: committed offset {position} is above the boundary {end}"
        )


def _ranges(
    committed: Mapping[int, int],
    latest: Mapping[int, int],
    *,
    earliest: Mapping[int, int] | None,
) -> tuple[OffsetsMap, OffsetsMap]:
    """Validated ``(starts, ends)`` with the same buckets, in bucket order."""
    committed = offsets_from_dict(committed, source="committed")
    ends = offsets_from_dict(latest, source="latest")
    floors = offsets_from_dict(earliest or {}, source="earliest")
    _check_known(committed, ends)
    starts: OffsetsMap = {}
    for bucket, end in ends.items():
        floor = floors.get(bucket, 0)
        position = committed.get(bucket, floor)
        _check_not_above(bucket, position, end)
        if position < floor:
            raise OffsetOutOfRangeError(
                f"bucket {bucket}: committed offset {position} is below the earliest retained "
                f"offset {floor}; records [{position}, {floor}) are gone"
            )
        starts[bucket] = position
    return starts, ends


def _cut(bucket: int, start: int, end: int, max_records: int) -> Iterator[Split]:
    """``[start, end)`` in ``ceil(n / max_records)`` near-equal splits."""
    size = end - start
    if size <= 0:
        return
    count = -(-size // max_records)
    base, extra = divmod(size, count)
    position = start
    for i in range(count):
        step = base + (1 if i < extra else 0)
        yield Split(bucket, position, position + step)
        position += step


Piece = tuple[int, int, int]  # bucket, start, end


def _cut_line(pieces: Iterable[Piece], capacity: int) -> Iterator[list[Piece]]:
    """Lay the pieces end to end and cut the line into chunks of ``capacity`` records."""
    chunk: list[Piece] = []
    room = capacity
    for bucket, start, end in pieces:
        while start < end:
            take = min(room, end - start)
            chunk.append((bucket, start, start + take))
            start += take
            room -= take
            if room == 0:
                yield chunk
                chunk, room = [], capacity
    if chunk:
        yield chunk


def _partition_wave(pieces: list[Piece], settings: PlannerSettings) -> tuple[Partition, ...]:
    """Cut a wave into at most ``parallelism`` partitions whose sizes differ by at most one
    record (wrap-around), then cut long pieces to ``max_split_records``."""
    total = sum(end - start for _, start, end in pieces)
    slots = min(settings.parallelism, total)
    base, extra = divmod(total, slots)
    partitions: list[Partition] = []
    remaining = iter(pieces)
    current: Piece | None = None
    for slot in range(slots):
        room = base + (1 if slot < extra else 0)
        taken: list[Split] = []
        while room:
            if current is None:
                current = next(remaining)
            bucket, start, end = current
            take = min(room, end - start)
            taken.extend(_cut(bucket, start, start + take, settings.max_split_records))
            room -= take
            current = (bucket, start + take, end) if start + take < end else None
        partitions.append(tuple(taken))
    return tuple(partitions)
