"""The real soak: the demo's pipeline for half an hour under a live producer, with maintenance
every 5 minutes and a SIGKILL of the stream job every ~7; every record once at the end, and
the memory of every long-lived process flat.

    .venv/bin/python bench/soak.py [--minutes 30] [--maintain-every 5m] [--kill-every 7m]
        [--workdir DIR] [--json FILE]          (``make soak``)

The pipeline runs as the demo runs it (the demo's settings; ``decide`` -> the epoch's job as a
child process with the stream standby -> ``close_epoch``; after a failed job, ``decide`` again
and rerun, as the DAG's task retries do), on a log fed by a live producer at the demo's rate,
with a burst of 400 000 records every 12 minutes (stream -> batch -> stream). Beside it:
``modeswitch maintain --config FILE`` every ``--maintain-every``, and a killer that SIGKILLs
the running stream job's process group (driver, JVM, Python workers) every ``--kill-every``
(+-1 min).

Each part runs in the process it has in production: this process is the operator's loop (what
``modeswitch run``'s process does: ``decide``, the jobs, ``close_epoch``); the jobs are its
children; maintenance is a process of its own per run, as the CLI and the DAG's task run it;
the producer and its bursts (the outside world) are a child process too, so that their
memory is not counted as the pipeline's.

Memory: every 10 s, the resident set of this process, of the producer, of a running
``maintain``, and of each job's process group; the report gives each one's peak in the first 5
minutes, in the last 5, and minute by minute. At the end the producer stops, the pipeline
catches up on its own, and the exactly-once audit (reading maintenance's log summaries) must
find 0 missing and 0 duplicated.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import psutil
from rich.console import Console

from modeswitch.control.settings import PipelineSettings, parse_duration
from modeswitch.devtools.demo import DEMO_SETTINGS, LIVE_RATE
from modeswitch.devtools.produce import EventGenerator, produce_backlog, produce_live
from modeswitch.errors import ModeswitchError
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import LocalRunner
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore

BUCKETS = 4
BACKLOG = 1_000_000
BURST = 400_000
BURST_EVERY = 12 * 60
WINDOW = 5 * 60  # seconds: the first and the last window of the memory report
JOB_SCRIPTS = ("backlog_batch.py", "stream.py")
MODESWITCH = Path(sys.executable).with_name("modeswitch")  # the CLI beside this interpreter

console = Console()


def job_groups() -> dict[int, tuple[str, psutil.Process]]:
    """The jobs this process started: process-group leader pid -> (what it runs, process)."""
    found = {}
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            command = child.cmdline()
            script = next((Path(a).name for a in command[1:3] if a.endswith(JOB_SCRIPTS)), None)
            if script and os.getpgid(child.pid) == child.pid:
                kind = "standby" if "--standby" in command else script.removesuffix(".py")
                found[child.pid] = (kind, child)
    return found


def group_rss(leader: psutil.Process) -> int:
    total = 0
    with contextlib.suppress(psutil.Error):
        for process in [leader, *leader.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
    return total


def produce(source: str, ready: threading.Event, stop: threading.Event) -> None:
    """The outside world, in a process of its own: the backlog (then ``ready`` is set), the
    live producer and, every 12 minutes, a burst of 400 000 records, until ``stop`` is set."""
    log = SegmentLog(source)
    produce_backlog(
        log, EventGenerator(seed=7, buckets=BUCKETS, skew="zipf:1.1"), records=BACKLOG,
        span=timedelta(hours=1),
    )  # fmt: skip
    ready.set()
    began = time.monotonic()

    def bursts() -> None:
        number = 0
        while not stop.wait(BURST_EVERY):
            number += 1
            produce_backlog(
                log,
                EventGenerator(seed=100 + number, buckets=BUCKETS),
                records=BURST,
                first=20_000_000 + number * 1_000_000,
            )
            console.print(
                f"[dim]{(time.monotonic() - began) / 60:5.1f} min[/dim] burst of {BURST:,} records"
            )

    burster = threading.Thread(target=bursts, name="bursts", daemon=True)
    burster.start()
    produce_live(
        log,
        EventGenerator(seed=8, buckets=BUCKETS),
        rate=LIVE_RATE,
        duration=timedelta(hours=24),
        first=10_000_000,
        should_stop=stop.is_set,
    )
    burster.join()


class Soak:
    def __init__(self, root: Path, args: argparse.Namespace) -> None:
        self.args = args
        self.root = root
        self.settings = PipelineSettings.from_mapping(
            {**DEMO_SETTINGS, "source": str(root / "log"), "warehouse": str(root / "warehouse")}
        )
        root.mkdir(parents=True, exist_ok=True)
        self.config = root / "settings.json"  # what `modeswitch maintain --config` reads
        self.config.write_text(json.dumps(self.settings.to_mapping(), indent=2))
        self.log = SegmentLog.create(self.settings.source, buckets=BUCKETS)
        self.rng = random.Random(19)
        self.stop = threading.Event()  # the soak's time is over
        self.quiet = threading.Event()  # producer, killer and maintenance have stopped
        self.began = time.monotonic()
        self.memory: list[tuple[float, str, int]] = []
        self.kills: list[tuple[float, str]] = []
        self.maintenance: list[dict] = []
        self.epochs: list[tuple[float, int, str, str]] = []
        self.failures: list[tuple[float, int, str]] = []

    def at(self) -> float:
        return time.monotonic() - self.began

    def note(self, text: str) -> None:
        console.print(f"[dim]{self.at() / 60:5.1f} min[/dim] {text}")

    # -- the pipeline, as the operator's loop runs it ----------------------------------------
    def run_pipeline(self, runner: LocalRunner) -> None:
        target: dict[int, int] | None = None
        while True:
            if self.quiet.is_set() and target is None:
                target = self.log.latest_offsets()
            plan = decide(self.settings, decided_by="soak")
            if plan.epoch is None:
                raise ModeswitchError(f"decide opened no epoch: {plan.reason}")
            try:
                runner.start(plan.mode, self.settings, plan.epoch).wait()
                status, end = close_epoch(self.settings, plan.epoch)
            except ModeswitchError as exc:
                self.failures.append((self.at(), plan.epoch, str(exc)[-160:]))
                self.note(f"epoch {plan.epoch} {plan.mode} failed: {str(exc)[-120:]}")
                if not str(exc).endswith(f"status -{signal.SIGKILL.value}"):
                    raise
                continue
            self.epochs.append((self.at(), plan.epoch, plan.mode, status))
            self.note(f"epoch {plan.epoch} {plan.mode} {status} at {sum(end.values()):,}")
            if target is not None and plan.mode == "stream" and end == target:
                return

    # -- beside it -----------------------------------------------------------------------------
    def kill(self) -> None:
        every = self.args.kill_every.total_seconds()
        while not self.stop.wait(self.rng.uniform(every - 60, every + 60)):
            while not self.stop.is_set():
                # A stream epoch runs in a stream job, or in the standby it was handed to.
                streams = {p: g for p, g in job_groups().items() if g[0] in ("stream", "standby")}
                if streams:
                    pid = self.rng.choice(sorted(streams))
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    what = f"{streams[pid][0]} job group {pid}"
                    self.kills.append((self.at(), what))
                    self.note(f"[red]SIGKILL[/red] {what}")
                    break
                self.stop.wait(2)

    def maintain(self) -> None:
        every = self.args.maintain_every.total_seconds()
        while not self.stop.wait(every):
            done = subprocess.run(
                [str(MODESWITCH), "maintain", "--config", str(self.config), "--json"],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                self.failures.append((self.at(), 0, f"maintain: {done.stderr[-160:]}"))
                self.note(f"[red]maintain failed[/red]: {done.stderr[-300:]}")
                continue
            report = json.loads(done.stdout)
            sink = next((t for t in report["tables"] if t["table"] == "sink"), None)
            self.maintenance.append(
                {
                    "at_min": round(self.at() / 60, 1),
                    "seconds": report["seconds"],
                    "sink_files": [sink["files_before"], sink["files_after"]] if sink else None,
                    "progress_merged": report["progress_merged"],
                    "checkpoints_removed": len(report["checkpoints_removed"]),
                }
            )
            self.note(f"maintain: {self.maintenance[-1]}")

    def sample(self, producer: psutil.Process) -> None:
        me = psutil.Process()
        while not self.quiet.wait(10):
            now = self.at()
            self.memory.append((now, "operator's loop (this process)", me.memory_info().rss))
            with contextlib.suppress(psutil.Error):
                self.memory.append((now, "producer", producer.memory_info().rss))
            for kind, process in job_groups().values():
                self.memory.append((now, f"{kind} job", group_rss(process)))
            for child in me.children():
                with contextlib.suppress(psutil.Error):
                    if "maintain" in child.cmdline()[2:3]:
                        self.memory.append((now, "maintain run", child.memory_info().rss))

    # -- report --------------------------------------------------------------------------------
    def memory_report(self, duration: float) -> dict[str, dict[str, float]]:
        out = {}
        for role in sorted({r for _, r, _ in self.memory}):
            early = [m for t, r, m in self.memory if r == role and t <= WINDOW]
            late = [
                m for t, r, m in self.memory if r == role and duration - WINDOW <= t <= duration
            ]
            by_minute: dict[int, int] = {}
            for t, r, m in self.memory:
                if r == role:
                    by_minute[int(t // 60)] = max(by_minute.get(int(t // 60), 0), m)
            out[role] = {
                "peak_first_5min_mb": round(max(early, default=0) / 2**20),
                "peak_last_5min_mb": round(max(late, default=0) / 2**20),
                "peak_by_minute_mb": [
                    round(by_minute.get(m, 0) / 2**20)
                    for m in range(max(by_minute, default=-1) + 1)
                ],
            }
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--maintain-every", default="5m")
    parser.add_argument("--kill-every", default="7m")
    parser.add_argument("--workdir")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    args.maintain_every = parse_duration(args.maintain_every, setting="--maintain-every")
    args.kill_every = parse_duration(args.kill_every, setting="--kill-every")
    root = Path(args.workdir or tempfile.mkdtemp(prefix="modeswitch-soak-"))
    soak = Soak(root, args)
    spawn = multiprocessing.get_context("spawn")
    backlog_ready, stop_producing = spawn.Event(), spawn.Event()
    producer = spawn.Process(
        target=produce, args=(soak.settings.source, backlog_ready, stop_producing), name="producer"
    )
    producer.start()
    while not backlog_ready.wait(5):
        if not producer.is_alive():
            raise SystemExit(f"the producer died before the backlog was written: {producer}")
    soak.began = time.monotonic()
    helpers = [
        threading.Thread(target=target, name=name, daemon=True)
        for name, target in (
            ("killer", soak.kill),
            ("maintenance", soak.maintain),
            ("memory", lambda: soak.sample(psutil.Process(producer.pid))),
        )
    ]
    duration = args.minutes * 60
    timer = threading.Timer(duration, soak.stop.set)
    ok = False
    try:
        for helper in helpers:
            helper.start()
        timer.start()

        def quiet_down() -> None:
            soak.stop.wait()
            stop_producing.set()
            producer.join()
            for helper in helpers[:2]:
                helper.join()
            soak.note("time is up: producer, killer and maintenance stopped; catching up")
            soak.quiet.set()

        quieter = threading.Thread(target=quiet_down, daemon=True)
        quieter.start()
        with LocalRunner(log_dir=root / "logs", timeout=3600) as runner:
            soak.run_pipeline(runner)
        caught_up_after = soak.at() - duration
        store = StateStore.from_settings(soak.settings)
        report = audit(
            soak.settings.source,
            soak.settings.sink,
            soak.settings.quarantine,
            soak.settings.pipeline,
            summaries=store.commands.log_summaries(),
        )
        totals = report.totals
        ok = report.ok and totals.missing == 0 and totals.duplicated == 0
        result = {
            "minutes": args.minutes,
            "records": totals.expected,
            "missing": totals.missing,
            "duplicated": totals.duplicated,
            "out_of_range": totals.out_of_range,
            "problems": list(report.problems),
            "sink_commits": report.sink_commits,
            "epochs": len(soak.epochs),
            "failed_jobs": len(soak.failures),
            "kills": len(soak.kills),
            "maintenance_runs": soak.maintenance,
            "caught_up_after_s": round(caught_up_after),
            "memory": soak.memory_report(duration),
        }
        console.print_json(json.dumps(result))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
    finally:
        soak.stop.set()
        soak.quiet.set()
        stop_producing.set()
        timer.cancel()
        producer.join(timeout=60)
        if producer.is_alive():
            producer.kill()
        for pid in job_groups():  # nothing may outlive the soak
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    console.print("[green]soak: every record once[/green]" if ok else "[red]soak failed[/red]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
