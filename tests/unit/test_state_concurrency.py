"""Several processes using the control state at once lose no update.

Real processes (spawn), released together by a barrier, each with its own StateStore built from
strings. Workers report through a queue and leave with ``os._exit``: delta-rs can abort the
interpreter at exit ("terminate called without an active exception", delta-io/delta-rs#2184),
which would turn a correct worker into a failed one.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from state_tools import warehouse_store

from modeswitch.errors import EpochStillOpenError
from modeswitch.sinks.commits import SinkCommit
from modeswitch.state import StateStore

pytestmark = pytest.mark.unit

PIPELINE = "orders"
WORKERS = 4
TIMEOUT_S = 120


def _progress(epoch: int, sequence: int) -> SinkCommit:
    return SinkCommit(PIPELINE, epoch, "stream", sequence, {0: sequence}, {0: sequence + 1}, 1)


def _submit_and_record(store: StateStore, worker: int) -> list[Any]:
    results: list[Any] = []
    for i in range(10):
        command = store.commands.submit("pause", {"worker": worker, "i": i}, issuer=f"w{worker}")
        own = store.progress.record(_progress(worker + 1, i))
        # Every worker records the same commits too: exactly one of them may insert each.
        shared = store.progress.record(_progress(99, i))
        results.append((command, own, shared, i))
    return results


def _apply_all(store: StateStore, worker: int) -> list[Any]:
    ids = list(range(1, 11))  # submitted before the race
    order = ids if worker % 2 == 0 else list(reversed(ids))
    # The worker's id is its "epoch", so the stored row tells who won.
    return [(command, store.commands.apply(command, worker + 1, {0: worker})) for command in order]


def _open_once(store: StateStore, worker: int) -> list[Any]:
    try:
        return [store.epochs.open("stream", f"worker {worker}", {0: 0})]
    except EpochStillOpenError as exc:
        return [f"refused: {exc}"]


def _open_superseding(store: StateStore, worker: int) -> list[Any]:
    return [
        store.epochs.open("stream", f"worker {worker} #{i}", {0: i}, supersede=True)
        for i in range(3)
    ]


TASKS: dict[str, Callable[[StateStore, int], list[Any]]] = {
    "submit_and_record": _submit_and_record,
    "apply_all": _apply_all,
    "open_once": _open_once,
    "open_superseding": _open_superseding,
}


def _worker(task: str, spec: dict[str, Any], worker: int, barrier: Any, queue: Any) -> None:
    code = 0
    try:
        store = StateStore(**spec)
        barrier.wait(timeout=TIMEOUT_S)
        queue.put((worker, TASKS[task](store, worker)))
    except BaseException:
        queue.put((worker, RuntimeError(traceback.format_exc())))
        code = 1
    queue.close()
    queue.join_thread()
    os._exit(code)


def run_workers(store: StateStore, task: str) -> dict[int, list[Any]]:
    """Run ``task`` in WORKERS spawned processes at once; each worker's results, by worker."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    queue = ctx.Queue()
    spec = {
        "state_root": store.tables.state_root,
        "sink_table_uri": store.tables.sink_table_uri,
        "pipeline": store.tables.pipeline,
        "compact_at_files": store.tables.compact_at_files,
    }
    procs = [
        ctx.Process(target=_worker, args=(task, spec, w, barrier, queue)) for w in range(WORKERS)
    ]
    for proc in procs:
        proc.start()
    try:
        results = dict(queue.get(timeout=TIMEOUT_S) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
    failures = [r for r in results.values() if isinstance(r, Exception)]
    assert not failures, "\n".join(str(f) for f in failures)
    assert [proc.exitcode for proc in procs] == [0] * WORKERS
    return results


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    return warehouse_store(str(tmp_path / "warehouse"), PIPELINE, str(tmp_path / "sink"))


@pytest.mark.parametrize("compact_at_files", [64, 4], ids=["plain", "compacting"])
def test_concurrent_submits_and_progress_lose_nothing_and_duplicate_nothing(
    tmp_path: Path, compact_at_files: int
) -> None:
    store = warehouse_store(
        str(tmp_path / "wh"), PIPELINE, str(tmp_path / "sink"), compact_at_files=compact_at_files
    )
    results = run_workers(store, "submit_and_record")

    commands = store.commands.list()
    assert [c.id for c in commands] == list(range(1, WORKERS * 10 + 1))
    assert sorted((c.args["worker"], c.args["i"]) for c in commands) == [
        (w, i) for w in range(WORKERS) for i in range(10)
    ]
    returned = sorted(command for rows in results.values() for command, *_ in rows)
    assert returned == [c.id for c in commands]  # every caller got the id it was given
    by_id = {c.id: c for c in commands}
    for worker, rows in results.items():
        for command, _, _, i in rows:
            assert by_id[command].args == {"worker": worker, "i": i}

    progress = [(p.epoch, p.sequence) for p in store.progress.list()]
    assert Counter(progress) == Counter(
        [(w + 1, i) for w in range(WORKERS) for i in range(10)] + [(99, i) for i in range(10)]
    )
    assert all(own for rows in results.values() for _, own, _, _ in rows)
    inserted_shared = Counter(i for rows in results.values() for _, _, shared, i in rows if shared)
    assert inserted_shared == Counter(range(10))  # each shared commit: exactly one True


def test_racing_processes_apply_each_command_exactly_once(store: StateStore) -> None:
    ids = [store.commands.submit("switch_to_batch", {"n": n}, issuer="ops") for n in range(10)]
    assert ids == list(range(1, 11))  # what the racers apply

    results = run_workers(store, "apply_all")

    winners: dict[int, list[int]] = {command: [] for command in ids}
    for worker, rows in results.items():
        assert sorted(command for command, _ in rows) == ids
        for command, applied in rows:
            if applied:
                winners[command].append(worker)
    assert all(len(won) == 1 for won in winners.values()), winners
    for command in store.commands.list():
        [winner] = winners[command.id]
        assert command.status == "applied"
        assert (command.applied_epoch, command.applied_offsets) == (winner + 1, {0: winner})
    assert store.commands.pending() == []


def test_racing_processes_open_exactly_one_epoch(store: StateStore) -> None:
    results = run_workers(store, "open_once")

    outcomes = [result for rows in results.values() for result in rows]
    opened = [r for r in outcomes if isinstance(r, int)]
    refused = [r for r in outcomes if isinstance(r, str)]
    assert opened == [1]
    assert len(refused) == WORKERS - 1
    assert all("epoch 1 (stream" in r and "still running" in r for r in refused)
    assert [(e.id, e.status) for e in store.epochs.list()] == [(1, "running")]


def test_racing_superseding_opens_get_distinct_ids_and_leave_one_running(
    store: StateStore,
) -> None:
    results = run_workers(store, "open_superseding")

    opened = [epoch for rows in results.values() for epoch in rows]
    assert sorted(opened) == list(range(1, WORKERS * 3 + 1))
    for rows in results.values():
        assert rows == sorted(rows)  # one process's epochs increase
    epochs = store.epochs.list()
    assert [e.id for e in epochs] == sorted(opened)
    running = [e.id for e in epochs if e.running]
    assert running == [max(opened)]
    assert {e.status for e in epochs if not e.running} == {"superseded"}
