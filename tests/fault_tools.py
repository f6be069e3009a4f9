"""What the fault tests share: kill a job at a fault point, stop a stream once caught up,
audit exactly once, count a backfill window's records in the log, commit to a sink as the sink
does without Spark; the random-fault cycles' journal, live producer and safety checks.
(Imported by tests of the faults, kafka, spark and airflow tiers; pytest puts this folder on
the import path.)"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, EventLog, produce_backlog, produce_live
from modeswitch.faults import ENV_FAULTS, ENV_MARKERS
from modeswitch.ops.verify import audit
from modeswitch.runners.local import job_command
from modeswitch.sinks.commits import (
    SinkCommit,
    committed_offsets,
    offset_regressions,
    sink_commits,
)
from modeswitch.state import StateStore

HELD_IN_STREAM = {
    "trigger_interval": "300ms",
    "max_stream_runtime": "10m",
    "watermark_lag_threshold": "1h",
    "enter_threshold": "1h",
    "exit_threshold": "1h",
    "stream_standby": "false",
}
"""Settings of a pipeline whose stream runs until the test pauses it (the policy never sends it
back to batch), with no standby: for tests that time their faults against its commits."""

LIVE_CYCLE = {
    # Offset lag alone switches: a burst puts a stream 40 000-50 000 records behind, and at
    # 5 000 per micro-batch it stays over 20 000 for longer than the dwell.
    "offset_lag_threshold": "20000",
    "watermark_lag_threshold": "none",
    "enter_threshold": "none",
    "exit_threshold": "none",
    "enter_dwell": "2s",
    "min_time_in_stream": "3s",
    "max_records_per_trigger": "5000",
    "trigger_interval": "300ms",
    "max_stream_runtime": "25s",
    "wave_records": "20000",
    "max_split_records": "10000",
}
"""Settings of the random-fault tests' live cycle (stream -> batch -> stream on bursts)."""


def kill_at(settings: PipelineSettings, kind: str, epoch: int, fault: str, markers: Path) -> None:
    """Start the epoch's job, wait until it reaches ``fault``, SIGKILL its process group."""
    point, _, hit = fault.partition("@")  # "name@3": the point's third call
    spec = f"{point}=120@{hit}" if hit else f"{point}=120"
    env = {**os.environ, ENV_FAULTS: spec, ENV_MARKERS: str(markers)}
    process = subprocess.Popen(
        job_command(kind, settings, epoch),
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 240
        while not (markers.exists() and any(markers.glob(f"{point}.*"))):
            if process.poll() is not None:
                pytest.fail(f"{kind} job exited first: {process.stderr.read().decode()[-3000:]}")
            assert time.monotonic() < deadline, f"the {kind} job never reached {fault}"
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL


@contextlib.contextmanager
def pause_when_caught_up(
    settings: PipelineSettings, target: dict[int, int], *, again: bool = False
) -> Iterator[None]:
    """Submit a pause command once the sink holds ``target``: the stream then stops at its
    next micro-batch boundary, however slow the machine (no fixed runtime to outlast). With
    ``again``, submit another whenever none is pending until the block ends: for a stream that
    may run twice in the block (the warm engine's own handoff starts it before the DAG run
    that attaches to it and runs it again)."""
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.5):
            if committed_offsets(settings.sink, settings.pipeline) != target:
                continue
            if not again or not store.commands.list("pending"):
                store.commands.submit("pause", {"note": "caught up"}, issuer="test")
                if not again:
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join(timeout=30)


def assert_exactly_once(settings: PipelineSettings) -> None:
    report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
    assert report.totals.missing == 0, report
    assert report.totals.duplicated == 0, report
    assert report.totals.out_of_range == 0, report
    assert report.ok
    sequences = [(c.epoch, c.sequence) for c in sink_commits(settings.sink, settings.pipeline)]
    assert len(sequences) == len(set(sequences)), "a wave or micro-batch was committed twice"


def records_in_window(log, start, end, below: dict[int, int]) -> int:
    """How many records of ``log`` below ``below`` (per bucket) have an event time in
    ``[start, end)``, at any offset: what a backfill of that window must write."""
    import pyarrow as pa
    import pyarrow.compute as pc

    count = 0
    for bucket, stop in below.items():
        for batch in log.read(bucket, log.earliest_offsets().get(bucket, 0), stop):
            times = batch.column("event_time")
            inside = pc.and_(
                pc.greater_equal(times, pa.scalar(start)), pc.less(times, pa.scalar(end))
            )
            count += pc.sum(inside).as_py() or 0
    return count


def commit_to_sink(
    uri: str,
    epoch: int,
    sequence: int,
    start: dict[int, int],
    end: dict[int, int],
    *,
    mode: str = "batch",
    pipeline: str = "orders",
) -> SinkCommit:
    """What the sink does: data, offsets and the app transaction in one Delta commit (the rows
    hold only ``bucket`` and ``offset``: what the audit and reconcile read)."""
    buckets, offsets = [], []
    for bucket in sorted(end):
        for offset in range(start.get(bucket, 0), end[bucket]):
            buckets.append(bucket)
            offsets.append(offset)
    rows = pa.table({"bucket": pa.array(buckets, pa.int32()), "offset": pa.array(offsets)})
    commit = SinkCommit(
        pipeline=pipeline,
        epoch=epoch,
        mode=mode,  # type: ignore[arg-type]
        sequence=sequence,
        start=start,
        end=end,
        records=len(offsets),
        max_event_time_us={b: 1_700_000_000_000_000 + end[b] for b in end},
    )
    write_deltalake(
        uri,
        rows,
        mode="append",
        commit_properties=CommitProperties(
            custom_metadata=commit.to_metadata(),
            app_transactions=[Transaction(pipeline, commit.txn_version)],
        ),
    )
    return replace(commit, table_version=DeltaTable(uri).version())


def wait_for(condition, what: str, timeout: float, poll: float = 0.5) -> None:
    """Wait until ``condition()`` holds, asking every ``poll`` seconds; fail naming ``what``
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def processes_with_environment(name: str, value: str) -> list[int]:
    """The processes (of this user) whose environment sets ``name=value``."""
    wanted = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def kill_processes_with_environment(name: str, value: str) -> list[int]:
    """SIGKILL every process whose environment sets ``name=value`` (what a command under test
    started, however deep and in whatever process group); returns their ids."""
    found = processes_with_environment(name, value)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return found


class CommandLineWatch:
    """A thread that reads, twice a second, the command line of every process whose
    environment sets ``name=value`` and keeps those that hold ``marker``: what a run under
    test started must never carry a secret on its command line (``ps`` shows it to every
    user). ``with`` starts and stops it; :attr:`seen` counts the processes read."""

    def __init__(self, name: str, value: str, marker: str, every: float = 0.5) -> None:
        self.name, self.value, self.marker, self.every = name, value, marker.encode(), every
        self.holding: list[str] = []
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(self.every):
            for pid in processes_with_environment(self.name, self.value):
                with contextlib.suppress(OSError):
                    line = Path(f"/proc/{pid}/cmdline").read_bytes()
                    self.seen.add(pid)
                    if self.marker in line:
                        self.holding.append(line.replace(b"\0", b" ").decode(errors="replace"))

    def __enter__(self) -> CommandLineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def files_holding(root: Path, marker: str) -> list[str]:
    """The files under ``root`` whose bytes hold ``marker`` (logs, tables, checkpoints, a
    SQLite database's pages)."""
    wanted = marker.encode()
    holding = []
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and wanted in path.read_bytes():
                holding.append(str(path))
    return holding


@dataclass
class Journal:
    """What the run did, for the failure message."""

    seed: int
    started: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.lines.append(f"{time.monotonic() - self.started:6.1f}s {text}")

    def __str__(self) -> str:
        return "\n".join(self.lines)


class LiveProducer:
    """Appends events at a steady rate in a thread until stopped (or an hour has passed)."""

    def __init__(self, log: EventLog, generator: EventGenerator, rate: float) -> None:
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(
            target=produce_live,
            args=(log, generator),
            kwargs={
                "rate": rate,
                "duration": timedelta(hours=1),
                "first": 10_000_000,
                # Half-second flushes: each flush rewrites every bucket's open segment;
                # at 100 ms (the default) that was 60 of the test process's 90 CPU-s
                # in the handoff test.
                "flush_every": timedelta(milliseconds=500),
                "should_stop": self.stop_flag.is_set,
            },
            name="live-producer",
            daemon=True,
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_flag.set()
        if self.thread.is_alive():
            self.thread.join(timeout=30)

    def __enter__(self) -> LiveProducer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Producer:
    """The live producer, and bursts at the seed's moments while faults are still coming."""

    def __init__(
        self,
        log: EventLog,
        rng: random.Random,
        journal: Journal,
        *,
        buckets: int = 4,
        rate: float = 300.0,
        burst: int = 50_000,
        bursts: int = 2,
        burst_window: tuple[float, float] = (5.0, 35.0),
    ) -> None:
        self.log, self.journal = log, journal
        self.buckets, self.burst = buckets, burst
        self.live = LiveProducer(
            log, EventGenerator(seed=rng.randrange(1000), buckets=buckets), rate
        )
        self.bursts = [
            threading.Timer(at, self._burst, args=(number, rng.randrange(1000)))
            for number, at in enumerate(sorted(rng.uniform(*burst_window) for _ in range(bursts)))
        ]

    def wait_for_bursts(self) -> None:
        for timer in self.bursts:
            timer.join()

    def _burst(self, number: int, seed: int) -> None:
        first = 20_000_000 + number * 1_000_000
        produce_backlog(
            self.log,
            EventGenerator(seed=seed, buckets=self.buckets),
            records=self.burst,
            first=first,
        )
        self.journal.note(f"burst of {self.burst} records")

    def start(self) -> None:
        self.live.start()
        for timer in self.bursts:
            timer.start()

    def close(self) -> None:
        self.live.stop_flag.set()
        for timer in self.bursts:
            timer.cancel()
            timer.join()
        self.live.stop()


def assert_safe(settings: PipelineSettings, journal: Journal) -> None:
    report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
    totals = report.totals
    assert (totals.missing, totals.duplicated, totals.out_of_range) == (0, 0, 0), report
    assert report.ok, report
    commits = list(sink_commits(settings.sink, settings.pipeline))
    keys = [(c.epoch, c.sequence) for c in commits]
    assert len(keys) == len(set(keys)), "a wave or micro-batch was committed twice"
    assert offset_regressions(commits) == []
    epochs = StateStore(settings.state_root, settings.sink, settings.pipeline).epochs.list()
    assert all(not e.running for e in epochs)
    for before, after in itertools.pairwise(epochs):
        assert after.start == before.end, f"epoch {after.id} does not start where {before.id} ended"
    modes = " ".join(e.mode for e in epochs)
    journal.note(f"epochs: {modes}; {len(commits)} sink commits")


def scaled_to_this_hour(settings: PipelineSettings, batch_seconds: float) -> PipelineSettings:
    """The demo's cycle's thresholds (exit 25 s, enter 30 s), raised when this machine is
    slower than usual this hour, from the first batch epoch's length. That epoch's lag at its
    end is about its own length (the live records it leaves behind) plus the gap since the
    quietest bucket's last event; the exit threshold leaves that room for an epoch of up to
    ~12 s. ci63 took 22 s (a machine three times slower than usual: the lag was 25.3 s and
    the policy rightly chose batch again; the Kafka cycle did the same). So the thresholds are
    at least twice the epoch's length; the burst holds a slower stream back longer too, and
    the first stream's runtime leaves it the time to catch up, then to fall behind by more."""
    exit_seconds = max(25, round(2 * batch_seconds))
    return PipelineSettings.from_mapping(
        {
            **settings.to_mapping(),
            "max_stream_runtime": f"{max(150, 5 * exit_seconds)}s",
            "exit_threshold": f"{exit_seconds}s",
            "enter_threshold": f"{exit_seconds + 5}s",
            "watermark_lag_threshold": f"{exit_seconds + 5}s",
        }
    )
