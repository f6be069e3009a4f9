"""Benchmark: batch mode vs stream mode on the same backlog, live latency, and the handoff.

    .venv/bin/python bench/bench_modes.py [--records 10000000] [--only a,b,c,d,latency,memory]

Side by side in one run, on the same backlog (16 buckets, Zipf 1.1 skew) in the embedded log,
each a real job process (driver + JVM + Python workers; peak memory = the peak of their summed
proportional set size, sampled every 0.2 s, with the split by process at that peak; CPU = the
CPU time of the whole process tree, which other jobs on the machine disturb far less than wall
time):

(a) the batch path: ``jobs/backlog_batch.py`` on a batch epoch;
(b) the stream job catching up with its live trigger (100 ms) and ``maxRecordsPerTrigger``
    = 100 000, until it has committed everything (then a ``pause`` command stops it);
(c) the stream job with availableNow and no read limit: one giant micro-batch;
(d) Spark's native Parquet read of the same rows (the log's segment files), the same
    transform, and a native Parquet write: the floor for Spark on this machine.

``latency``: a live producer appends 5 000 records/s; the stream job (100 ms trigger) writes
them; each record's latency is the time its sink commit landed (commitInfo timestamp) minus
its append time (when the producer's append that wrote it was published). Before it,
a batch epoch drains a backlog and the handoff is measured from the batch's last commit to
the stream's first. The epochs run as the local runner runs them (``LocalRunner``): the stream
job starts in standby alongside the batch epoch (``BENCH_STANDBY=off``: the stream job starts
after the batch epoch has closed, cold). ``BENCH_ENGINE=auto``: on the warm engine instead,
as ``modeswitch run`` runs them by default (one Spark application for both epochs; it hands
the batch over to its stream itself).

``BENCH_TRANSFORM=module:function`` sets the ``transform`` of (a), (b), (d) (the same as
(a)'s) and ``latency`` (default: the demo's events with the Arrow parse,
``modeswitch.transforms.arrow:parse_events_arrow``, the pipeline's default before the
``value_schema`` setting, so that the figures stay comparable); (c) runs with Spark SQL's
``from_json`` (``modeswitch.transforms:parse_events``), what a user would otherwise run
(issue 20), unless ``BENCH_C_TRANSFORM`` names another. ``BENCH_BATCH_READER`` /
``BENCH_BATCH_WRITER`` set the batch path's (default: the pipeline's, ``arrow``).

``memory``: the batch path on 1/10 of the records and on all of them, same wave size: peak
memory must not grow by more than 20 %.

Throughput is records / wall time of the job process, Spark's start-up included (the same
for every mode); figures go to stdout as a Markdown table for docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import psutil

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog, produce_live
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import job_command
from modeswitch.runners.pipeline_run import open_runner
from modeswitch.runners.processes import start_group, wait_group
from modeswitch.sinks.commits import committed_offsets, sink_commits
from modeswitch.sources import open_log
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore
from modeswitch.transforms import SPARK_SQL_TRANSFORM
from modeswitch.transforms.arrow import ARROW_TRANSFORM

BUCKETS = 16
WARM_UP_SECONDS = 60
POLICY_OFF = {
    "watermark_lag_threshold": "none",
    "enter_threshold": "none",
    "exit_threshold": "none",
    "offset_lag_threshold": "none",
}


@dataclass
class Run:
    name: str
    records: int
    seconds: float
    peak_mb: float
    cpu_seconds: float = 0.0
    peak_by_kind: dict[str, float] | None = None

    @property
    def rate(self) -> float:
        return self.records / self.seconds


def process_kind(proc: psutil.Process, root: int) -> str:
    """``driver`` (the job's Python), ``jvm``, ``workers`` (PySpark's Python workers)."""
    if proc.pid == root:
        return "driver"
    if proc.name() == "java":
        return "jvm"
    return "workers" if "pyspark" in " ".join(proc.cmdline()[:4]) else "other"


class PeakMemory:
    """Samples the memory of a process and all its descendants every 0.2 s: the peak of their
    summed proportional set size (PSS: a page shared by N processes counts 1/N in each, so
    PySpark's forked workers and the mapped JVM class archive count once, not once per
    process), the split by process kind at that peak, and the CPU time of the tree."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.peak = 0
        self.peak_by_kind: dict[str, int] = {}
        self.cpu: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                procs = []
            total, by_kind = 0, {}
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    kind = process_kind(proc, self.root.pid)
                    pss = proc.memory_full_info().pss
                    times = proc.cpu_times()
                    self.cpu[proc.pid] = times.user + times.system
                    total += pss
                    by_kind[kind] = by_kind.get(kind, 0) + pss
            if total > self.peak:
                self.peak, self.peak_by_kind = total, by_kind
            self.stop.wait(0.2)

    def done(self) -> float:
        self.stop.set()
        self.thread.join()
        return self.peak / 2**20

    def result(self, name: str, records: int, seconds: float) -> Run:
        peak = self.done()
        by_kind = {k: round(v / 2**20) for k, v in sorted(self.peak_by_kind.items())}
        return Run(name, records, seconds, peak, sum(self.cpu.values()), by_kind)


LOGS: Path | None = None
"""Where the job processes' output goes (``--logs``); discarded when None."""
WAVE_RECORDS: str | None = None
"""The batch epochs' waves: ``--wave-records``; None: the setting's default."""


def start(command: list[str]) -> subprocess.Popen:
    output: int | object = subprocess.DEVNULL
    if LOGS is not None:
        LOGS.mkdir(parents=True, exist_ok=True)
        output = open(LOGS / f"{time.strftime('%H%M%S')}-{Path(command[1]).stem}.log", "wb")  # noqa: SIM115
    return start_group(command, output=output)


def start_piped(command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """Like :func:`start`, with the output (standard output and error) piped to the caller
    and ``env`` on top of this process's environment."""
    return start_group(command, env=env, output=subprocess.PIPE)


def finish(process: subprocess.Popen, timeout: float = 3600) -> int:
    return wait_group(process, timeout)


TRANSFORM = os.environ.get("BENCH_TRANSFORM") or ARROW_TRANSFORM
C_TRANSFORM = os.environ.get("BENCH_C_TRANSFORM") or SPARK_SQL_TRANSFORM


def settings_for(scratch: Path, name: str, log_root: str, **extra: str) -> PipelineSettings:
    return PipelineSettings.from_mapping(
        {
            "pipeline": f"bench_{name}",
            "source": log_root,
            "warehouse": str(scratch / name),
            **({} if WAVE_RECORDS is None else {"wave_records": WAVE_RECORDS}),
            # BENCH_BATCH_READER / BENCH_BATCH_WRITER: compare the batch path's data paths.
            **(
                {"batch_writer": os.environ["BENCH_BATCH_WRITER"]}
                if os.environ.get("BENCH_BATCH_WRITER")
                else {}
            ),
            **(
                {"batch_reader": os.environ["BENCH_BATCH_READER"]}
                if os.environ.get("BENCH_BATCH_READER")
                else {}
            ),
            # BENCH_STREAM_WRITER: the stream epochs' writer (bench/bench_stream_writers.py).
            **(
                {"stream_writer": os.environ["BENCH_STREAM_WRITER"]}
                if os.environ.get("BENCH_STREAM_WRITER")
                else {}
            ),
            # BENCH_STREAM_DRIVER_RECORDS: the arrow writer's micro-batches run in the driver.
            **(
                {"stream_driver_records": os.environ["BENCH_STREAM_DRIVER_RECORDS"]}
                if os.environ.get("BENCH_STREAM_DRIVER_RECORDS")
                else {}
            ),
            # BENCH_BATCH_DRIVER_MEMORY: the batch job's fixed driver heap (default 1g).
            "batch_driver_memory": os.environ.get("BENCH_BATCH_DRIVER_MEMORY", "1g"),
            # BENCH_TRANSFORM: the transform setting (default: the Arrow parse of the demo's
            # events, modeswitch.transforms.arrow:parse_events_arrow).
            "transform": TRANSFORM,
            **POLICY_OFF,
            **extra,
        }
    )


def run_batch(scratch: Path, name: str, log_root: str) -> Run:
    settings = settings_for(scratch, name, log_root)
    plan = decide(settings, force_mode="batch", decided_by="bench")
    began = time.perf_counter()
    process = start(job_command("batch", settings, plan.epoch))
    memory = PeakMemory(process.pid)
    code = finish(process)
    seconds = time.perf_counter() - began
    waves = f"{settings.planner.wave_records / 1e6:g} M"
    records = sum(plan.boundary.values())
    run = memory.result(f"(a) batch, waves of {waves} ({name})", records, seconds)
    assert code == 0, f"batch job exited {code}"
    close_epoch(settings, plan.epoch)
    return run


def run_stream(scratch: Path, name: str, log_root: str, label: str, **extra: str) -> Run:
    settings = settings_for(scratch, name, log_root, max_stream_runtime="2h", **extra)
    target = open_log(log_root).latest_offsets()
    plan = decide(settings, force_mode="stream", decided_by="bench")
    began = time.perf_counter()
    process = start(job_command("stream", settings, plan.epoch))
    memory = PeakMemory(process.pid)
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    caught_up = None
    while process.poll() is None:
        if committed_offsets(settings.sink, settings.pipeline) == target:
            caught_up = time.perf_counter()
            store.commands.submit("pause", {"note": "benchmark caught up"}, issuer="bench")
            break
        time.sleep(0.2)
    code = finish(process)
    if caught_up is None:
        caught_up = time.perf_counter()
    run = memory.result(label, sum(target.values()), caught_up - began)
    assert code == 0, f"stream job exited {code}"
    assert committed_offsets(settings.sink, settings.pipeline) == target
    close_epoch(settings, plan.epoch)
    return run


NATIVE = """
import sys, time
from modeswitch.runners.session import create_spark_session
from modeswitch.transforms import load_transform
spark = create_spark_session("bench-native")
source, target, transform = sys.argv[1], sys.argv[2], sys.argv[3]
df = spark.read.parquet(source + "/*/*.parquet")
load_transform(transform)(df).write.mode("overwrite").parquet(target)
spark.stop()
"""


def run_native(scratch: Path, log_root: str, records: int) -> Run:
    began = time.perf_counter()
    transform = TRANSFORM  # the same as (a)'s
    process = start([sys.executable, "-c", NATIVE, log_root, str(scratch / "native"), transform])
    memory = PeakMemory(process.pid)
    code = finish(process)
    seconds = time.perf_counter() - began
    run = memory.result("(d) native parquet read + transform + parquet write", records, seconds)
    assert code == 0, f"native job exited {code}"
    return run


def run_latency(scratch: Path, seconds: float) -> dict:
    """Batch epoch over a backlog, then the stream job live at 5 000 records/s."""
    log = SegmentLog.create(str(scratch / "live-log"), buckets=BUCKETS)
    produce_backlog(log, EventGenerator(seed=2, buckets=BUCKETS, skew="zipf:1.1"), records=500_000)
    settings = settings_for(
        scratch,
        "live",
        log.root,
        trigger_interval="100ms",
        max_records_per_trigger="100000",
        max_stream_runtime="1h",
        stream_standby=os.environ.get("BENCH_STANDBY", "on"),
        # BENCH_ENGINE: auto (default: the warm engine, `modeswitch run`'s default), or
        # submit (the history's before session 45: the local runner, a job per epoch).
        engine=os.environ.get("BENCH_ENGINE", "auto"),
        # BENCH_STANDBY_LEAD: how long before the batch's expected end the standby starts.
        **(
            {"stream_standby_lead": os.environ["BENCH_STANDBY_LEAD"]}
            if os.environ.get("BENCH_STANDBY_LEAD")
            else {}
        ),
        # BENCH_LATENCY_WAVES=100000: the history's waves (before session 45), with splits of
        # 50 000, so that the local runner's standby starts once a wave has shown the batch's
        # throughput. Unset: the settings' defaults, what a user gets.
        **(
            {"wave_records": os.environ["BENCH_LATENCY_WAVES"], "max_split_records": "50000"}
            if os.environ.get("BENCH_LATENCY_WAVES")
            else {}
        ),
    )
    stop = threading.Event()
    appended: list[tuple[int, int, int, float]] = []  # (bucket, start, end, published at)
    producer = live_producer(log, appended, stop)
    producer.start()
    try:
        # The jobs' output goes to --logs, else to a folder of the scratch space (not stdout).
        live = batch_then_live(settings, seconds, log_dir=LOGS or scratch / "job-logs")
    finally:
        stop.set()
        producer.join()
    commits = sorted(sink_commits(settings.sink, settings.pipeline), key=lambda c: c.table_version)
    last_batch = max(c.committed_at_ms for c in commits if c.epoch == live.batch)
    first_stream = min(c.committed_at_ms for c in commits if c.epoch == live.stream)
    latencies = record_latencies(
        [c for c in commits if c.epoch == live.stream], appended, live.measure_from
    )
    if not latencies:
        raise RuntimeError(
            f"no stream commit after the warm-up: {len(commits)} commits, stream epoch "
            f"{live.stream}: {[(c.epoch, c.sequence, c.records) for c in commits][-5:]}"
        )

    return {
        **latency_summary(latencies),
        "handoff": (first_stream - last_batch) / 1000,
        "standby": settings.stream_standby,
        "runner": "the local runner's" if settings.engine == "submit" else "the warm engine's",
        "batch_epoch_seconds": live.batch_seconds,
    }


@dataclass(frozen=True)
class LiveRun:
    """The epochs of :func:`batch_then_live`, and when its measure starts."""

    batch: int
    stream: int
    measure_from: float
    """Epoch seconds: past the warm-up."""
    batch_seconds: float


def batch_then_live(settings: PipelineSettings, seconds: float, *, log_dir: Path) -> LiveRun:
    """A batch epoch, then the stream epoch live for :data:`WARM_UP_SECONDS` and ``seconds``
    (a ``pause`` command ends it), beside whatever producer the caller runs: each run as the
    local runner runs them (the standby as the settings say), or with ``engine = warm`` in the
    warm engine that ``modeswitch run`` starts by default (``open_runner``), which hands the
    batch over to its stream itself."""
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    # The runner the settings choose outside Airflow, as `modeswitch run` opens it.
    with open_runner(settings, log_dir=log_dir, timeout=3600) as runner:
        batch = decide(settings, force_mode="batch", decided_by="bench")
        batch_began = time.perf_counter()
        runner.start("batch", settings, batch.epoch).wait()
        batch_seconds = time.perf_counter() - batch_began
        close_epoch(settings, batch.epoch)
        stream = decide(settings, force_mode="stream", decided_by="bench")
        failure: list[BaseException] = []

        def run_stream_epoch() -> None:
            try:
                runner.start("stream", settings, stream.epoch).wait()
            except BaseException as exc:  # reported by the main thread below
                failure.append(exc)

        job = threading.Thread(target=run_stream_epoch)
        job.start()
        # Past Spark's start and the catch-up of what arrived during the batch epoch.
        measure_from = time.time() + WARM_UP_SECONDS
        time.sleep(WARM_UP_SECONDS + seconds)
        store.commands.submit("pause", {"note": "benchmark done"}, issuer="bench")
        job.join(timeout=180)
        if job.is_alive() or failure:
            raise RuntimeError(f"the stream job did not stop cleanly: {failure}")
        close_epoch(settings, stream.epoch)
    return LiveRun(batch.epoch, stream.epoch, measure_from, batch_seconds)


def live_producer(
    log: SegmentLog,
    appended: list[tuple[int, int, int, float]],
    stop: threading.Event,
    generator: EventGenerator | None = None,
) -> threading.Thread:
    """A thread that appends 5 000 records/s to ``log`` until ``stop`` is set, noting each
    append (bucket, first offset, end, when it was published) in ``appended``; the demo's
    events by default, ``generator``'s when given."""
    return threading.Thread(
        target=produce_live,
        args=(log, generator or EventGenerator(seed=3, buckets=BUCKETS, skew="zipf:1.1")),
        kwargs={
            "rate": 5000.0,
            "duration": timedelta(hours=1),
            "first": 10_000_000,
            "flush_every": timedelta(milliseconds=50),
            "should_stop": stop.is_set,
            "on_append": lambda bucket, start, end: appended.append(
                (bucket, start, end, time.time())
            ),
        },
        daemon=True,
    )


def record_latencies(
    commits: list, appended: list[tuple[int, int, int, float]], measure_from: float
) -> list[float]:
    """Sorted latencies of the records appended from ``measure_from`` on: a record is
    appended when the append that wrote it was published (the producer notes it), and
    visible when the sink commit that wrote it lands."""
    published: dict[int, tuple[list[int], list[float]]] = {}
    for bucket, first, _, at in sorted(appended):
        bases, times = published.setdefault(bucket, ([], []))
        bases.append(first)
        times.append(at)
    latencies = []
    for commit in commits:
        visible = commit.committed_at_ms / 1000
        for bucket, end in commit.end.items():
            bases, times = published.get(bucket, ([], []))
            for offset in range(commit.start.get(bucket, end), end):
                index = bisect.bisect_right(bases, offset) - 1
                if index >= 0 and times[index] >= measure_from:
                    latencies.append(visible - times[index])
    return sorted(latencies)


def latency_summary(latencies: list[float]) -> dict[str, float]:
    """Count, percentiles, max and mean of sorted latencies (seconds)."""

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))]

    return {
        "records": len(latencies),
        "p50": pct(0.50),
        "p95": pct(0.95),
        "p99": pct(0.99),
        "max": latencies[-1],
        "mean": statistics.fmean(latencies),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--only", default="a,b,c,d,latency,memory")
    parser.add_argument("--latency-seconds", type=float, default=60)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--logs", default=None, help="keep the job processes' output here")
    parser.add_argument(
        "--wave-records",
        default=None,
        help="the batch epochs' waves (default: the setting's, what a user gets; the history's "
        "runs before session 45 set 2 M)",
    )
    args = parser.parse_args(argv)
    global LOGS, WAVE_RECORDS
    WAVE_RECORDS = args.wave_records
    LOGS = Path(args.logs) if args.logs else None
    if LOGS:  # the local runner's own lines too: when the standby started, what it expected
        LOGS.mkdir(parents=True, exist_ok=True)
        logging.basicConfig(
            filename=LOGS / "runner.log", level=logging.INFO, format="%(asctime)s %(message)s"
        )
    only = set(args.only.split(","))
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="modeswitch-bench-modes-"))
    scratch.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    try:
        log = SegmentLog.create(str(scratch / "log"), buckets=BUCKETS)
        began = time.perf_counter()
        produce_backlog(
            log,
            EventGenerator(seed=1, buckets=BUCKETS, skew="zipf:1.1"),
            records=args.records,
            span=timedelta(hours=1),
        )
        print(f"backlog: {args.records:,} records in {time.perf_counter() - began:.0f} s")
        if "a" in only:
            runs.append(run_batch(scratch, "a", log.root))
        if "b" in only:
            runs.append(
                run_stream(
                    scratch,
                    "b",
                    log.root,
                    "(b) stream, 100 ms trigger, 100 000 per trigger",
                    trigger_interval="100ms",
                    max_records_per_trigger="100000",
                )
            )
        if "c" in only:
            runs.append(
                run_stream(
                    scratch,
                    "c",
                    log.root,
                    f"(c) stream, availableNow, no read limit, {C_TRANSFORM.split(':')[1]}",
                    stream_trigger="available_now",
                    max_records_per_trigger="none",
                    transform=C_TRANSFORM,
                )
            )
        if "d" in only:
            runs.append(run_native(scratch, log.root, args.records))
        for run in runs:
            print(json.dumps(run.__dict__ | {"rate": run.rate}))
        print()
        print(
            "| run | records | wall (s) | records/s | CPU (s) | peak memory, PSS (MB) "
            "| at the peak, by process |"
        )
        print("|---|---|---|---|---|---|---|")
        for run in runs:
            kinds = ", ".join(f"{k} {v:,}" for k, v in (run.peak_by_kind or {}).items())
            print(
                f"| {run.name} | {run.records:,} | {run.seconds:.1f} | {run.rate:,.0f} "
                f"| {run.cpu_seconds:.0f} | {run.peak_mb:,.0f} | {kinds} |"
            )
        by = {r.name[:3]: r for r in runs}
        if "(a)" in by and "(c)" in by:
            print(f"(a)/(c) throughput: {by['(a)'].rate / by['(c)'].rate:.2f} (issue 20: >= 1.5)")
            print(
                f"(a)/(c) peak memory: {by['(a)'].peak_mb / by['(c)'].peak_mb:.2f} "
                "(issue 20: never above 1)"
            )
        if "(a)" in by and "(d)" in by:
            print(f"(a)/(d) throughput: {by['(a)'].rate / by['(d)'].rate:.2f} (issue 20: >= 1.0)")
        if "memory" in only:
            small = SegmentLog.create(str(scratch / "small-log"), buckets=BUCKETS)
            produce_backlog(
                small,
                EventGenerator(seed=1, buckets=BUCKETS, skew="zipf:1.1"),
                records=args.records // 10,
            )
            tenth = run_batch(scratch, "small", small.root)
            full = by.get("(a)") or run_batch(scratch, "a", log.root)
            print(
                f"memory: batch on {tenth.records:,} records peaks at {tenth.peak_mb:,.0f} MB "
                f"({tenth.peak_by_kind}), on {full.records:,} at {full.peak_mb:,.0f} MB "
                f"({full.peak_by_kind}): x{full.peak_mb / tenth.peak_mb:.2f} (target <= 1.20)"
            )
        if "latency" in only:
            result = run_latency(scratch, args.latency_seconds)
            print(
                f"live at 5 000 records/s, 100 ms trigger, {result['records']:,} records: "
                f"p50 {result['p50'] * 1000:.0f} ms, p95 {result['p95'] * 1000:.0f} ms, "
                f"p99 {result['p99'] * 1000:.0f} ms, max {result['max'] * 1000:.0f} ms "
                f"(issue 36: p50 <= 300 ms, p99 <= 600 ms)"
            )
            print(
                f"handoff, batch's last commit -> stream's first: {result['handoff']:.1f} s "
                f"({result['runner']}; issue 36: <= 3 s); "
                f"stream standby {'on' if result['standby'] else 'off'}, "
                f"batch epoch {result['batch_epoch_seconds']:.1f} s"
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
