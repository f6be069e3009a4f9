"""What the sink's Delta log said, kept before log cleanup removes it.

The exactly-once audit (:mod:`modeswitch.ops.verify`) reads the pipeline's commits from the sink's
log: where each bucket's committed range starts, whether committed offsets ever moved back
without a rewind, and which windows backfills filled. Log cleanup (``modeswitch maintain``,
or delta-rs on its own after ``delta.logRetentionDuration``) deletes the oldest commit files.
So before maintenance cleans the log, it folds the commits it has not yet folded into a
:class:`LogSummary`, recorded with its run (the ``maintain`` command's args); the audit reads
the summaries, in order, in place of the commits they stand for.

Each summary covers the versions ``(after, through]``; the summaries of successive runs join
end to end. Plain values only: it travels as JSON.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from modeswitch.errors import ModeswitchError
from modeswitch.offsets import OffsetsMap, offsets_from_dict, offsets_to_dict
from modeswitch.sinks.commits import SinkCommit
from modeswitch.sinks.delta_log import commit_infos_after, log_versions, oldest_log_version
from modeswitch.sinks.erasures import Erasure, read_erasures

log = logging.getLogger(__name__)

BACKFILL_KEY = "modeswitch_backfill"
"""The ``commitInfo`` key of a backfill commit's metadata (:mod:`modeswitch.modes.backfill`; live
commits use ``modeswitch``)."""


@dataclass(frozen=True)
class LogSummary:
    """The pipeline's commits at sink versions ``(after, through]``, folded.

    ``starts``: per bucket, the start of the oldest data commit covering it; ``rewound``: per
    bucket, the lowest offset a rewind moved it back to; ``end``: the newest commit's end map
    (``{}`` if none); ``commits``: how many commits of the pipeline; ``backfills``: the backfill
    commits, each ``{"version": v, "metadata": <its commitInfo value>}``; ``erasures``: other
    writers' commits that removed rows (:class:`~modeswitch.sinks.erasures.Erasure` as plain
    values), of the sink's versions ``(after, through]`` and the quarantine's up to
    ``quarantine_through`` (-1: none read yet).
    """

    after: int = -1
    through: int = -1
    starts: OffsetsMap = field(default_factory=dict)
    rewound: OffsetsMap = field(default_factory=dict)
    end: OffsetsMap = field(default_factory=dict)
    commits: int = 0
    backfills: tuple[Mapping[str, Any], ...] = ()
    erasures: tuple[Mapping[str, Any], ...] = ()
    quarantine_through: int = -1

    @classmethod
    def read(
        cls,
        table_uri: str,
        pipeline: str,
        *,
        after: int,
        quarantine: tuple[str, int] | None = None,
    ) -> LogSummary:
        """The summary of the log's commits above version ``after`` (read from its commit
        files, the newest included). If log cleanup removed the files just above ``after``,
        the summary starts where the log does: its ``after`` says so, and
        :func:`join_summaries` reports the break.

        ``quarantine``: the quarantine table's location and the version its erasures were read
        up to; its erasures above that are read too. Erasures whose removed files are gone
        cannot be kept: they are logged, and the audit reports them while their commits are
        in the log."""
        starts: dict[int, int] = {}
        rewound: dict[int, int] = {}
        end: OffsetsMap = {}
        commits = 0
        backfills = []
        through = after
        for version, info in commit_infos_after(table_uri, after):
            if through == after:
                after = version - 1  # more than requested if log cleanup got there first
            through = version
            commit = SinkCommit.from_commit_info(info)
            if commit is not None and commit.pipeline == pipeline:
                commits += 1
                end = dict(commit.end)
                if commit.is_rewind:
                    for bucket, offset in commit.start.items():
                        rewound[bucket] = min(offset, rewound.get(bucket, offset))
                else:
                    for bucket, offset in commit.start.items():
                        starts.setdefault(bucket, offset)  # oldest first: the first one stays
            raw = info.get(BACKFILL_KEY)
            if raw is not None and _backfill_pipeline(raw) == pipeline:
                backfills.append({"version": version, "metadata": raw})
        erasures, unread = read_erasures("sink", table_uri, after=after, through=through)
        quarantine_through = -1
        if quarantine is not None:
            uri, quarantine_after = quarantine
            quarantine_through = max([quarantine_after, *log_versions(uri)])
            found, more = read_erasures(
                "quarantine", uri, after=quarantine_after, through=quarantine_through
            )
            erasures, unread = erasures + found, unread + more
        for problem in unread:
            log.warning("log summary of %s: %s", table_uri, problem)
        return cls(
            after,
            through,
            starts,
            rewound,
            end,
            commits,
            tuple(backfills),
            tuple(e.to_dict() for e in erasures),
            quarantine_through,
        )

    def erasure_list(self) -> list[Erasure]:
        return [Erasure.from_dict(raw) for raw in self.erasures]

    def as_commit(self) -> SinkCommit:
        """A stand-in for the newest commit summarised: what the first kept commit continues
        (for :func:`~modeswitch.sinks.commits.offset_regressions`)."""
        return SinkCommit(
            pipeline="",
            epoch=0,
            mode="batch",
            sequence=0,
            start={},
            end=dict(self.end),
            records=0,
            max_event_time_us={},
            table_version=self.through,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "after": self.after,
            "through": self.through,
            "starts": offsets_to_dict(self.starts),
            "rewound": offsets_to_dict(self.rewound),
            "end": offsets_to_dict(self.end),
            "commits": self.commits,
            "backfills": list(self.backfills),
            "erasures": list(self.erasures),
            "quarantine_through": self.quarantine_through,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LogSummary:
        where = "log summary"
        try:
            return cls(
                after=int(raw["after"]),
                through=int(raw["through"]),
                starts=offsets_from_dict(raw["starts"], source=f"{where} starts"),
                rewound=offsets_from_dict(raw["rewound"], source=f"{where} rewound"),
                end=offsets_from_dict(raw["end"], source=f"{where} end"),
                commits=int(raw["commits"]),
                backfills=tuple(dict(b) for b in raw["backfills"]),
                # Summaries kept before erasures were read have neither.
                erasures=tuple(dict(e) for e in raw.get("erasures", ())),
                quarantine_through=int(raw.get("quarantine_through", -1)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModeswitchError(f"{where}: malformed {json.dumps(raw)[:200]}") from exc


def join_summaries(summaries: Iterable[LogSummary]) -> tuple[LogSummary | None, list[str]]:
    """The summaries of successive maintenance runs folded into one, oldest first, and each
    break in the chain, described (a run's ``after`` that is not the previous ``through``)."""
    joined: LogSummary | None = None
    problems = []
    for summary in sorted(summaries, key=lambda s: s.through):
        if joined is None:
            if summary.after != -1:
                problems.append(
                    f"log summaries start after sink version {summary.after}: the log files "
                    "below were cleaned up before any maintenance run summarised them"
                )
            joined = summary
            continue
        if summary.after != joined.through:
            problems.append(
                f"log summaries do not join: one ends at sink version {joined.through}, the "
                f"next starts after {summary.after}"
            )
        rewound = dict(joined.rewound)
        for bucket, offset in summary.rewound.items():
            rewound[bucket] = min(offset, rewound.get(bucket, offset))
        joined = LogSummary(
            after=joined.after,
            through=summary.through,
            starts={**summary.starts, **joined.starts},  # older starts win
            rewound=rewound,
            end=summary.end or joined.end,
            commits=joined.commits + summary.commits,
            backfills=joined.backfills + summary.backfills,
            erasures=joined.erasures + summary.erasures,
            quarantine_through=max(joined.quarantine_through, summary.quarantine_through),
        )
    return joined, problems


def erasures_since(
    before: LogSummary | None,
    *,
    sink: tuple[str, int | None],
    quarantine: tuple[str, int | None],
) -> tuple[list[Erasure], list[str]]:
    """Other writers' erasures in the sink and the quarantine (each ``(location, version
    audited)``, None where the table does not exist): those the summaries ``before`` kept, then
    those of the commits still in each table's log above what the summaries cover; and the
    commits whose erased rows cannot be read, described."""
    erasures = before.erasure_list() if before is not None else []
    problems: list[str] = []
    for table, (uri, version), after in (
        ("sink", sink, before.through if before else -1),
        ("quarantine", quarantine, before.quarantine_through if before else -1),
    ):
        if version is not None:
            found, unread = read_erasures(table, uri, after=after, through=version)
            erasures += found
            problems += unread
    return erasures, problems


def unsummarised_cleanup(table_uri: str, through: int) -> list[str]:
    """The commit files of the sink's log that are gone with no summary standing for them
    (summaries reach ``through``), described."""
    oldest = oldest_log_version(table_uri)
    if oldest is None or oldest <= through + 1:
        return []
    return [
        f"sink {table_uri}: log files of versions {through + 1} to {oldest - 1} were cleaned "
        "up and no maintenance run summarised them: the audit cannot see those commits"
    ]


def _backfill_pipeline(raw: Any) -> str | None:
    try:
        body = json.loads(raw) if isinstance(raw, str) else dict(raw)
        return str(body["pipeline"])
    except (KeyError, TypeError, ValueError):
        return None


def expected_ranges(
    commits: list[SinkCommit], *, before: LogSummary | None = None
) -> tuple[OffsetsMap, OffsetsMap]:
    """``(start, committed)`` per bucket from a pipeline's sink commits, newest first, and the
    summary of the commits ``before`` them (log cleanup removed their files).

    ``start`` is the bucket's start in the oldest commit that covers it; ``committed`` is the
    newest commit's end map. Buckets of neither map have nothing committed.
    """
    if before is not None:
        starts, committed = expected_ranges(commits)
        committed = committed or dict(before.end)
        older = {**before.starts}
        for bucket, offset in before.rewound.items():
            older[bucket] = min(offset, older.get(bucket, offset))
        starts = {**starts, **older}
        return {b: starts.get(b, 0) for b in committed}, committed
    if not commits:
        return {}, {}
    starts: OffsetsMap = {}
    rewound: OffsetsMap = {}
    for commit in commits:  # newest first: older commits overwrite
        if commit.is_rewind:
            for bucket, offset in commit.start.items():
                rewound[bucket] = min(offset, rewound.get(bucket, offset))
        else:
            starts.update(commit.start)
    for bucket, offset in rewound.items():  # a rewind below the oldest start reaches further
        starts[bucket] = min(offset, starts.get(bucket, offset))
    committed = dict(commits[0].end)
    return {b: starts.get(b, 0) for b in committed}, committed
