"""The batch → stream handoffs as the sink's Delta log shows them: from a batch's last commit to
the next stream's first (their ``commitInfo`` timestamps), the figure docs/BENCHMARKS.md keeps
for every path (``make demo``, ``make airflow``, ``modeswitch run``, the compose stack)."""

from __future__ import annotations

import itertools

from modeswitch.sinks.commits import sink_commits


def handoffs(sink: str, pipeline: str) -> list[tuple[float, int]]:
    """Each batch → stream handoff in ``sink``'s log, oldest first: its seconds and when it
    ended (the stream's first commit, ms since the epoch)."""
    commits = sorted(sink_commits(sink, pipeline), key=lambda c: c.table_version)
    return [
        ((after.committed_at_ms - before.committed_at_ms) / 1000, after.committed_at_ms)
        for before, after in itertools.pairwise(commits)
        if (before.mode, after.mode) == ("batch", "stream")
    ]
