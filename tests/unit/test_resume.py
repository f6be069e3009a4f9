"""Where a stream epoch's query starts on a rerun: one scenario per test (no Spark, no I/O)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeswitch.errors import OffsetsContinuityError
from modeswitch.modes.resume import (
    CheckpointLogs,
    checkpoint_path,
    plan_resume,
    read_checkpoints,
)
from modeswitch.sinks.commits import SinkCommit
from modeswitch.sinks.stream_offsets import offsets_log_entry
from modeswitch.storage import remove_tree

ROOT = "/ckpt/epoch-7"
START = {0: 100, 1: 50}


def commit(sequence: int, start: dict[int, int], end: dict[int, int], epoch: int = 7):
    return SinkCommit("p", epoch, "stream", sequence, start, end, records=1)


def chain(*ends: dict[int, int]) -> list[SinkCommit]:
    """The epoch's commits, each continuing the one before from START."""
    out, before = [], dict(START)
    for number, end in enumerate(ends):
        out.append(commit(number, dict(before), {**before, **end}))
        before = {**before, **end}
    return out


def logs(base: int, planned, completed, ends=None, path=None) -> CheckpointLogs:
    return CheckpointLogs(path or checkpoint_path(ROOT, base), base, planned, completed, ends or {})


def test_a_first_run_starts_a_fresh_checkpoint_at_the_epochs_start() -> None:
    point = plan_resume(7, START, [], [], ROOT)
    assert (point.checkpoint, point.sequence_base, point.resumed) == (ROOT, 0, False)
    assert point.start == START
    assert point.last_sequence is None


def test_a_first_run_killed_before_its_first_commit_resumes_its_planned_micro_batch() -> None:
    point = plan_resume(7, START, [], [logs(0, planned=0, completed=None)], ROOT)
    assert (point.checkpoint, point.resumed, point.start) == (ROOT, True, START)


def test_a_rerun_resumes_a_checkpoint_in_step_with_the_sink() -> None:
    commits = chain({0: 110}, {1: 60})
    point = plan_resume(
        7, START, commits, [logs(0, planned=2, completed=1, ends={1: {0: 110, 1: 60}})], ROOT
    )
    assert (point.checkpoint, point.sequence_base, point.resumed) == (ROOT, 0, True)
    assert point.committed == {0: 110, 1: 60}
    assert point.last_sequence == 1


def test_a_checkpoint_behind_the_sink_is_not_resumed_a_fresh_one_starts_at_the_sink() -> None:
    # Killed between the sink's commit of micro-batch 1 and Spark's commit log entry for it:
    # resuming would run micro-batch 1 again; a fresh checkpoint counts on from sequence 2.
    commits = chain({0: 110}, {1: 60})
    point = plan_resume(
        7, START, commits, [logs(0, planned=1, completed=0, ends={0: {0: 110, 1: 50}})], ROOT
    )
    assert (point.checkpoint, point.sequence_base, point.resumed) == (f"{ROOT}-from-2", 2, False)
    assert point.start == {0: 110, 1: 60}
    assert "behind the sink" in point.why


def test_a_missing_checkpoint_after_commits_starts_fresh_at_the_sinks_offsets() -> None:
    commits = chain({0: 110})
    point = plan_resume(7, START, commits, [], ROOT)
    assert (point.checkpoint, point.sequence_base, point.start) == (
        f"{ROOT}-from-1",
        1,
        {0: 110, 1: 50},
    )


def test_the_newest_usable_checkpoint_wins_and_starts_where_its_first_sequence_did() -> None:
    commits = chain({0: 110}, {1: 60}, {0: 120})
    old = logs(0, planned=1, completed=0, ends={0: {0: 110, 1: 50}})
    restarted = logs(2, planned=0, completed=0, ends={0: {0: 120, 1: 60}})
    point = plan_resume(7, START, commits, [old, restarted], ROOT)
    assert (point.checkpoint, point.sequence_base, point.resumed) == (f"{ROOT}-from-2", 2, True)
    assert point.start == {0: 110, 1: 60}  # where sequence 2 began


def test_a_fresh_checkpoint_killed_before_its_first_commit_is_resumed() -> None:
    commits = chain({0: 110})
    point = plan_resume(7, START, commits, [logs(1, planned=0, completed=None)], ROOT)
    assert (point.checkpoint, point.resumed) == (f"{ROOT}-from-1", True)
    assert point.start == commits[0].end


@pytest.mark.parametrize("commits", [[], chain({0: 110})], ids=["first run", "after commits"])
def test_a_checkpoint_that_planned_nothing_is_started_again_fresh(commits) -> None:
    # Killed while writing its first offsets entry: Spark will not start batch 0 in it.
    base = len(commits)
    point = plan_resume(7, START, commits, [logs(base, planned=None, completed=None)], ROOT)
    assert not point.resumed
    assert point.checkpoint == checkpoint_path(ROOT, base)  # removed, then started again
    assert point.start == {**START, **(commits[-1].end if commits else {})}
    assert "planned no micro-batch" in point.why


def test_a_checkpoint_whose_end_differs_from_the_sinks_is_not_resumed() -> None:
    commits = chain({0: 110})
    other = logs(0, planned=0, completed=0, ends={0: {0: 115, 1: 50}})
    point = plan_resume(7, START, commits, [other], ROOT)
    assert not point.resumed and point.sequence_base == 1
    assert "ends at" in point.why


def test_a_checkpoint_ahead_of_the_sink_is_not_resumed() -> None:
    # Its commit log holds a micro-batch the sink has not: not ours to trust.
    point = plan_resume(7, START, [], [logs(0, planned=1, completed=0)], ROOT)
    assert not point.resumed and point.checkpoint == ROOT and point.start == START


def test_commits_that_do_not_continue_the_epochs_start_are_refused() -> None:
    with pytest.raises(OffsetsContinuityError, match="buckets differ"):
        plan_resume(7, START, [commit(0, {0: 105, 1: 50}, {0: 110, 1: 50})], [], ROOT)
    gap = [*chain({0: 110}), commit(1, {0: 111, 1: 50}, {0: 120, 1: 50})]
    with pytest.raises(OffsetsContinuityError, match="sequence 1 starts at"):
        plan_resume(7, START, gap, [], ROOT)
    skipped = [chain({0: 110})[0], commit(2, {0: 110, 1: 50}, {0: 120, 1: 50})]
    with pytest.raises(OffsetsContinuityError, match="contiguous"):
        plan_resume(7, START, skipped, [], ROOT)
    with pytest.raises(OffsetsContinuityError, match="belongs to epoch 6"):
        plan_resume(7, START, [commit(0, START, {0: 110}, epoch=6)], [], ROOT)


def _spark_checkpoint(root: Path, planned: dict[int, str], completed: list[int]) -> None:
    """A checkpoint folder laid out as Spark writes it."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text('{"id":"x"}')
    for batch, offsets in planned.items():
        (root / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{offsets}\n')
        (root / "offsets" / f".{batch}.crc").write_text("x")
    for batch in completed:
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_read_checkpoints_finds_the_epochs_checkpoints_and_their_logs(tmp_path: Path) -> None:
    root = tmp_path / "epoch-7"
    _spark_checkpoint(root, {0: '{"0":110}', 1: '{"0":120}'}, [0])
    _spark_checkpoint(tmp_path / "epoch-7-from-2", {0: '{"0":130}'}, [])
    _spark_checkpoint(tmp_path / "epoch-70", {0: '{"0":1}'}, [0])  # another epoch's
    found = read_checkpoints(str(root))
    assert [(c.sequence_base, c.planned, c.completed) for c in found] == [(0, 1, 0), (2, 0, None)]
    assert found[0].ends == {0: {0: 110}, 1: {0: 120}}
    assert found[1].path == f"{root}-from-2"
    assert offsets_log_entry(str(root), 5) is None
    remove_tree(f"{root}-from-2")  # how the stream job drops a checkpoint it will not resume
    remove_tree(f"{root}-from-9")  # nothing there: nothing to do
    assert [c.sequence_base for c in read_checkpoints(str(root))] == [0]
    assert read_checkpoints(str(tmp_path / "nowhere" / "epoch-1")) == []
