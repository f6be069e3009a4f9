"""The exactly-once audit's counting: per bucket, the sink's and the quarantine's rows against
the bucket's expected range, as expected, missing, duplicated, out of range or erased
(:func:`count_positions`; the rules are in :mod:`modeswitch.ops.verify`'s docstring). Pure
numpy over ``(buckets, offsets)`` arrays: a sort of the in-range positions and a diff."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

SAMPLE = 5
"""How many offsets (or ranges) of each kind of discrepancy a bucket's row keeps as examples."""


@dataclass(frozen=True)
class BucketAudit:
    """One bucket's counts. ``start`` / ``committed`` are None when nothing is committed."""

    bucket: int
    start: int | None
    committed: int | None
    expected: int
    in_sink: int
    in_quarantine: int
    missing: int
    duplicated: int
    out_of_range: int
    missing_ranges: tuple[tuple[int, int], ...] = ()
    """Up to :data:`SAMPLE` of the first missing ``[lo, hi)`` ranges."""
    duplicated_offsets: tuple[int, ...] = ()
    """Up to :data:`SAMPLE` of the lowest offsets that are present more than once."""
    out_of_range_offsets: tuple[int, ...] = ()
    """Up to :data:`SAMPLE` of the lowest out-of-range offsets."""
    erased: int = 0
    """Offsets of the range in neither table because another writer's commit removed them (an
    erasure, :mod:`modeswitch.sinks.erasures`): expected, absent, and not counted as missing."""

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.duplicated == 0 and self.out_of_range == 0


def count_positions(
    sink: tuple[np.ndarray, np.ndarray],
    quarantine: tuple[np.ndarray, np.ndarray],
    *,
    starts: Mapping[int, int],
    committed: Mapping[int, int],
    known_buckets: Sequence[int] = (),
    held: Mapping[int, np.ndarray] | None = None,
    erased: Mapping[int, np.ndarray] | None = None,
) -> list[BucketAudit]:
    """Per-bucket counts from ``(buckets, offsets)`` arrays of the two tables.

    Buckets reported: ``known_buckets`` (the log's), the committed ones, and any found in the
    tables, ascending. Pure numpy: a sort of the in-range positions and a diff.

    ``held``: for a log with gaps (Kafka), per bucket the sorted offsets of its committed range
    that hold a record. Those are what is expected; a table row at an offset that holds no
    record counts as out of range. Without it a range ``[start, committed)`` is contiguous.

    ``erased``: per bucket, sorted offsets another writer's commit removed
    (:mod:`modeswitch.sinks.erasures`); those of the range found in neither table count as
    ``erased``, not missing.
    """
    held = dict(held or {})
    erased = dict(erased or {})
    sink_b, sink_o = sink
    q_b, q_o = quarantine
    b = np.concatenate([sink_b, q_b]).astype(np.int64, copy=False)
    o = np.concatenate([sink_o, q_o]).astype(np.int64, copy=False)
    n_sink = len(sink_b)
    ids = np.union1d(
        np.array(sorted(set(known_buckets) | set(committed)), dtype=np.int64), np.unique(b)
    )
    n = len(ids)
    lo = np.array([starts.get(int(i), 0) if int(i) in committed else 0 for i in ids], np.int64)
    hi = np.array([committed.get(int(i), 0) for i in ids], np.int64)
    idx = np.searchsorted(ids, b)
    in_range = (o >= lo[idx]) & (o < hi[idx])
    for bucket, offsets in held.items():  # a position on a gap is no record of the log
        at = np.flatnonzero(in_range & (ids[idx] == bucket))
        in_range[at] = np.isin(o[at], offsets)

    in_sink = np.bincount(idx[:n_sink], minlength=n)
    in_quarantine = np.bincount(idx[n_sink:], minlength=n)
    outside = ~in_range
    out_of_range = np.bincount(idx[outside], minlength=n)

    r_idx, r_off = idx[in_range], o[in_range]
    # One sortable int64 per position: bucket index * width + offset (in range, so
    # 0 <= offset < width).
    width = max(int(hi.max()) if n else 0, 1)
    if n * width < 2**62:
        keys = r_idx * width + r_off
        keys.sort()
        key_idx, key_off = keys // width, keys % width
    else:  # offsets too large to pack with the bucket index
        order = np.lexsort((r_off, r_idx))
        key_idx, key_off = r_idx[order], r_off[order]
    first = np.ones(len(key_idx), dtype=bool)
    if len(key_idx) > 1:
        first[1:] = (key_idx[1:] != key_idx[:-1]) | (key_off[1:] != key_off[:-1])
    distinct = np.bincount(key_idx[first], minlength=n)
    duplicated = np.bincount(key_idx, minlength=n) - distinct
    expected = hi - lo
    for i, bucket in enumerate(ids.tolist()):
        if bucket in held:
            expected[i] = len(held[bucket])
    missing = expected - distinct
    # Out-of-range positions sorted by (bucket index, offset), for the examples.
    order = np.lexsort((o[outside], idx[outside]))
    out_idx, out_off = idx[outside][order], o[outside][order]

    rows = []
    for i, bucket in enumerate(ids.tolist()):
        has_range = bucket in committed
        in_left, in_right = np.searchsorted(key_idx, [i, i + 1])
        out_left, out_right = np.searchsorted(out_idx, [i, i + 1])
        present, copies = key_off[in_left:in_right], first[in_left:in_right]
        accounted = present[copies]
        gone = 0
        if bucket in erased and has_range:
            removed = erased[bucket]
            removed = removed[(removed >= lo[i]) & (removed < hi[i])]
            if bucket in held:
                removed = removed[np.isin(removed, held[bucket])]
            removed = np.setdiff1d(removed, accounted)  # back since (a rewind reprocessed it)
            gone = len(removed)
            missing[i] -= gone
            accounted = np.union1d(accounted, removed)
        rows.append(
            BucketAudit(
                bucket=bucket,
                start=int(lo[i]) if has_range else None,
                committed=int(hi[i]) if has_range else None,
                expected=int(expected[i]),
                in_sink=int(in_sink[i]),
                in_quarantine=int(in_quarantine[i]),
                missing=int(missing[i]),
                duplicated=int(duplicated[i]),
                out_of_range=int(out_of_range[i]),
                missing_ranges=(
                    ()
                    if not missing[i]
                    else _unheld(held[bucket], accounted)
                    if bucket in held
                    else _gaps(accounted, int(lo[i]), int(hi[i]))
                ),
                duplicated_offsets=_lowest(present[~copies]),
                out_of_range_offsets=_lowest(out_off[out_left:out_right]),
                erased=gone,
            )
        )
    return rows


def _gaps(present: np.ndarray, lo: int, hi: int) -> tuple[tuple[int, int], ...]:
    """The first :data:`SAMPLE` ``[a, b)`` ranges of ``[lo, hi)`` not in sorted ``present``."""
    edges = np.concatenate([[lo - 1], present, [hi]])
    gaps = np.flatnonzero(np.diff(edges) > 1)[:SAMPLE]
    return tuple((int(edges[g] + 1), int(edges[g + 1])) for g in gaps)


def _unheld(held: np.ndarray, present: np.ndarray) -> tuple[tuple[int, int], ...]:
    """The first :data:`SAMPLE` runs of ``held`` offsets not in ``present``, as ``[a, b)``
    (a run is consecutive offsets; a log's gap ends a run)."""
    absent = np.setdiff1d(held, present)
    if len(absent) == 0:
        return ()
    breaks = np.flatnonzero(np.diff(absent) > 1) + 1
    starts = np.concatenate([[0], breaks])[:SAMPLE]
    ends = np.concatenate([breaks, [len(absent)]])[:SAMPLE]
    pairs = zip(starts, ends, strict=True)
    return tuple((int(absent[a]), int(absent[b - 1]) + 1) for a, b in pairs)


def _lowest(sorted_offsets: np.ndarray) -> tuple[int, ...]:
    """The first :data:`SAMPLE` distinct values of a sorted array."""
    if len(sorted_offsets) == 0:
        return ()
    new = np.ones(len(sorted_offsets), dtype=bool)
    new[1:] = sorted_offsets[1:] != sorted_offsets[:-1]
    return tuple(int(x) for x in sorted_offsets[new][:SAMPLE])


__all__ = ["SAMPLE", "BucketAudit", "count_positions"]
