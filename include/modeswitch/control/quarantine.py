"""When an epoch quarantines most of its records, say so: a pure rule and its words.

A pipeline whose payload does not match its parse (a ``value_schema`` that names other fields,
a transform for another topic) sends nearly every record to the quarantine table and nothing to
the sink, while every job succeeds. The ``quarantine_warn_fraction`` setting (default 0.5) is the
line: an epoch whose quarantined records are *more* than that fraction of all it has committed
(sink plus quarantine) is flagged, by :func:`quarantines_most`, in four places that all use this
module: the batch and stream jobs log a warning once per epoch (:class:`QuarantineWatch`), the
status (``modeswitch status`` and the operator's page) shows it, and the next ``decide`` adds it
to its recorded reason. No I/O here: the counts come from the sink commits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping


def quarantine_share(records: int, quarantined: int) -> float | None:
    """The quarantined share of all the records committed (``records`` in the sink plus
    ``quarantined``), None before any."""
    total = records + quarantined
    return None if total <= 0 else quarantined / total


def quarantines_most(records: int, quarantined: int, fraction: float) -> bool:
    """Whether more than ``fraction`` of the records committed went to quarantine."""
    share = quarantine_share(records, quarantined)
    return share is not None and share > fraction


def describe_quarantine(
    epoch: int, records: int, quarantined: int, *, reason: str | None = None
) -> str:
    """``epoch 3 quarantined 116,743 of 117,810 records (99.1%); most common reason: ...``."""
    share = quarantine_share(records, quarantined) or 0.0
    text = (
        f"epoch {epoch} quarantined {quarantined:,} of {records + quarantined:,} records "
        f"({share:.1%})"
    )
    return f"{text}; most common reason: {reason}" if reason else text


class QuarantineWatch:
    """A job's tally of its epoch's sink commits, which warns once when the epoch quarantines
    most of its records (module docstring). Feed it every commit with :meth:`add`."""

    def __init__(self, pipeline: str, epoch: int, fraction: float) -> None:
        self.pipeline = pipeline
        self.epoch = epoch
        self.fraction = fraction
        self.records = 0
        self.quarantined = 0
        self.reasons: Counter[str] = Counter()
        self.warned = False

    def add(self, records: int, quarantined: int, reasons: Mapping[str, int]) -> str | None:
        """Count one commit; the warning's text the first time the epoch's records so far
        cross the line, else None."""
        self.records += records
        self.quarantined += quarantined
        self.reasons.update(reasons)
        if self.warned or not quarantines_most(self.records, self.quarantined, self.fraction):
            return None
        self.warned = True
        reason = self.reasons.most_common(1)[0][0] if self.reasons else None
        return (
            f"pipeline {self.pipeline!r}: "
            + describe_quarantine(self.epoch, self.records, self.quarantined, reason=reason)
            + f" so far, more than quarantine_warn_fraction = {self.fraction:g}; does the "
            "payload match value_format and its schema (or the transform)?"
        )


__all__ = ["QuarantineWatch", "describe_quarantine", "quarantine_share", "quarantines_most"]
