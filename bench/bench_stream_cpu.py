"""Benchmark: the CPU a stream epoch costs per micro-batch, by process kind.

    .venv/bin/python bench/bench_stream_cpu.py [--rounds 2] [--records 120000]
        [--per-trigger 2000] [--runtime 45s] [--java-options "..."]

Each round is a fresh pipeline on the embedded log: a batch epoch over ``--records`` records,
then ``--records`` more and a stream epoch (the demo's settings: 500 ms trigger,
``--per-trigger`` records a micro-batch) that drains them and runs until ``--runtime``; both as
``jobs/*.py`` child processes, as the local runner runs them. While they run, every process's
CPU time is sampled from /proc twice a second and summed by kind: the driver JVMs, the Python
workers Spark starts (``pyspark.daemon`` and the data source runners), the jobs' Python drivers,
this process. Rounds alternate the Python workers' interpreter: the launcher of
``modeswitch.runners.worker_python`` (the default) and the plain interpreter
(``PYSPARK_PYTHON``). ``--java-options`` sets ``JAVA_TOOL_OPTIONS`` for every JVM (the test
suite's ``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC``, say); unset by default.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

from modeswitch.control.settings import PipelineSettings
from modeswitch.control.values import parse_duration
from modeswitch.devtools.demo import DEMO_SETTINGS
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import run_job_process
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore

TICKS = os.sysconf("SC_CLK_TCK")


def kind(cmdline: str) -> str:
    if not cmdline:
        return "other"
    program = cmdline.split(" ", 1)[0]
    if program.endswith("/java") or program == "java":
        return "driver JVM"
    if "pyspark.daemon" in cmdline or "pyspark.sql.streaming." in cmdline:
        return "Python workers"
    if "/jobs/" in cmdline:
        return "job drivers (Python)"
    return "other"


class CpuSampler:
    """Every process's CPU ticks, sampled until stopped; summed by :func:`kind` at the end."""

    def __init__(self) -> None:
        # Keyed by (pid, start time): a pid the kernel reuses is another process.
        self.base = {(pid, start): ticks for pid, (ticks, start) in self._snapshot().items()}
        self.labels: dict[tuple[int, int], str] = {}
        self.ticks: dict[tuple[int, int], int] = {}
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _snapshot() -> dict[int, tuple[int, int]]:
        found = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as handle:
                    stat = handle.read()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            found[int(name)] = (int(fields[11]) + int(fields[12]), int(fields[19]))
        return found

    def _run(self) -> None:
        while not self.stop_flag.wait(0.5):
            self.sample()

    def sample(self) -> None:
        for pid, (ticks, started) in self._snapshot().items():
            key = (pid, started)
            # A JVM or a worker starts as a shell script (spark-class, the workers' launcher)
            # that execs it under the same pid: label it again until it is known.
            if self.labels.get(key, "other") == "other":
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as handle:
                        cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                self.labels[key] = "this process" if pid == os.getpid() else kind(cmdline)
            self.ticks[key] = ticks - self.base.get(key, 0)

    def __enter__(self) -> CpuSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_flag.set()
        self.thread.join()
        self.sample()

    def by_kind(self) -> dict[str, float]:
        totals: collections.Counter[str] = collections.Counter()
        for key, ticks in self.ticks.items():
            totals[self.labels[key]] += ticks / TICKS
        return dict(totals)


def one_round(work: Path, records: int, per_trigger: int, runtime: timedelta) -> dict:
    settings = PipelineSettings.from_mapping(
        {
            **DEMO_SETTINGS,
            "pipeline": "bench",
            "source": str(work / "log"),
            "warehouse": str(work / "warehouse"),
            "max_records_per_trigger": str(per_trigger),
            "max_stream_runtime": f"{runtime.total_seconds():.0f}s",
            "idle_timeout": "3600s",
        }
    )
    log = SegmentLog.create(settings.source, buckets=16)
    span = timedelta(seconds=20)
    produce_backlog(log, EventGenerator(seed=1, buckets=16), records=records, span=span)
    with CpuSampler() as sampler:
        batch = decide(settings, decided_by="bench", force_mode="batch")
        run_job_process("batch", settings, batch.epoch)
        close_epoch(settings, batch.epoch)
        produce_backlog(
            log, EventGenerator(seed=2, buckets=16), records=records, span=span, first=records
        )
        stream = decide(settings, decided_by="bench", force_mode="stream")
        began = time.monotonic()
        run_job_process("stream", settings, stream.epoch)
        seconds = time.monotonic() - began
        status, _ = close_epoch(settings, stream.epoch)
    progress = StateStore.from_settings(settings).progress.list(stream.epoch)
    return {
        "status": status,
        "micro_batches": len(progress),
        "records": sum(p.records for p in progress),
        "stream_seconds": seconds,
        "cpu": sampler.by_kind(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each interpreter")
    parser.add_argument("--records", type=int, default=120_000)
    parser.add_argument("--per-trigger", type=int, default=2_000)
    parser.add_argument("--runtime", default="45s")
    parser.add_argument("--java-options", default=None)
    args = parser.parse_args(argv)
    runtime = parse_duration(args.runtime, setting="--runtime")
    if args.java_options is not None:
        os.environ["JAVA_TOOL_OPTIONS"] = args.java_options
    for round_ in range(args.rounds * 2):
        launcher = round_ % 2 == 0
        if launcher:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = sys.executable
        work = Path(tempfile.mkdtemp(prefix="bench-stream-cpu-"))
        try:
            result = one_round(work, args.records, args.per_trigger, runtime)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        cpu = result["cpu"]
        total = sum(cpu.values())
        parts = ", ".join(f"{name} {seconds:.1f}" for name, seconds in sorted(cpu.items()))
        print(
            f"round {round_ + 1} ({'launcher' if launcher else 'plain interpreter'}): "
            f"{result['status']}, {result['records']:,} records in "
            f"{result['micro_batches']} micro-batches, stream {result['stream_seconds']:.1f} s; "
            f"CPU-s {total:.1f} ({parts})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
