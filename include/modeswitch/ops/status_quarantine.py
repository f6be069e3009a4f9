"""The status's quarantine figures: per shown epoch, how many records of its offset ranges
went to the quarantine table, their most frequent reasons and share, and the warning when
an epoch quarantined most of its records (:mod:`modeswitch.control.quarantine`). Read for
:func:`~modeswitch.ops.status.pipeline_status` in one scan of the quarantine table."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from modeswitch.control.quarantine import describe_quarantine, quarantine_share, quarantines_most
from modeswitch.control.settings import PipelineSettings
from modeswitch.storage import delta_dataset

QUARANTINE_SAMPLES = 3
"""Reasons shown per epoch, the most frequent first."""


def with_quarantine(
    epochs: list[dict[str, Any]],
    settings: PipelineSettings,
    committed: Mapping[int, int],
    storage_options: Mapping[str, str] | None,
) -> list[dict[str, Any]]:
    """Each epoch with ``quarantined`` (records of its offset ranges in the quarantine table)
    and ``quarantine_reasons`` (the most frequent, with counts): one scan of the quarantine
    table, filtered to the epochs' ranges (files and row groups outside them are skipped)."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    ranges = []
    for epoch in epochs:
        end = epoch["end"] or epoch["boundary"] or {str(b): o for b, o in committed.items()}
        for bucket, start in epoch["start"].items():
            if bucket in end and end[bucket] > start:
                ranges.append((epoch, int(bucket), start, end[bucket]))
    counted: dict[int, Counter[str]] = {epoch["epoch"]: Counter() for epoch in epochs}
    for epoch in epochs:
        epoch["quarantined"], epoch["quarantine_reasons"] = 0, []
        epoch["quarantine_share"], epoch["quarantines_most"] = None, False
    if not ranges:
        return epochs
    try:
        table = DeltaTable(settings.quarantine, storage_options=dict(storage_options or {}))
    except TableNotFoundError:
        return epochs
    where = None
    for _, bucket, start, end in ranges:
        one = (
            (pc.field("bucket") == bucket)
            & (pc.field("offset") >= start)
            & (pc.field("offset") < end)
        )
        where = one if where is None else where | one
    rows = delta_dataset(table).to_table(columns=["bucket", "offset", "reason"], filter=where)
    buckets = rows.column("bucket").to_numpy()
    offsets = rows.column("offset").to_numpy()
    reasons = rows.column("reason")
    for epoch, bucket, start, end in ranges:
        mine = (buckets == bucket) & (offsets >= start) & (offsets < end)
        epoch["quarantined"] += int(mine.sum())
        counted[epoch["epoch"]].update(reasons.filter(pa.array(mine)).to_pylist())
    for epoch in epochs:
        epoch["quarantine_reasons"] = [
            {"reason": reason, "records": n}
            for reason, n in counted[epoch["epoch"]].most_common(QUARANTINE_SAMPLES)
        ]
        epoch["quarantine_share"] = quarantine_share(epoch["records"], epoch["quarantined"])
        epoch["quarantines_most"] = quarantines_most(
            epoch["records"], epoch["quarantined"], settings.quarantine_warn_fraction
        )
    return epochs


def quarantine_warnings(epochs: list[dict[str, Any]], settings: PipelineSettings) -> list[str]:
    """The status's warnings: the newest of ``epochs`` (newest first) that quarantined most
    of its records, in words, with how many older shown epochs did too."""
    flagged = [e for e in epochs if e["quarantines_most"]]
    if not flagged:
        return []
    newest = flagged[0]
    reasons = newest["quarantine_reasons"]
    text = describe_quarantine(
        newest["epoch"],
        newest["records"],
        newest["quarantined"],
        reason=reasons[0]["reason"] if reasons else None,
    )
    text += (
        f": more than quarantine_warn_fraction = {settings.quarantine_warn_fraction:g}; does "
        "the payload match value_format and its schema (or the transform)?"
    )
    if len(flagged) > 1:
        text += f" ({len(flagged) - 1} older epoch(s) shown quarantined most of theirs too)"
    return [text]


__all__ = ["QUARANTINE_SAMPLES", "quarantine_warnings", "with_quarantine"]
