"""SIGKILL whole job process trees at random moments of a live cycle; the pipeline must converge.

One seeded run: a backlog, a live producer and bursts that push a running stream over its
offset-lag threshold (stream -> batch -> stream). The epochs are run as an operator's loop runs
them under Airflow: ``decide`` -> the job -> ``close_epoch``; after a failed job, ``decide``
again (it re-attaches to the running epoch) and rerun the job, a bounded number of times, as
the DAG's task retries do. The jobs run on one of two runners (:func:`runner_of`):

- ``local``: a :class:`LocalRunner` (a child process per epoch, with the stream standby);
- ``engine``: the warm engine (``engine = warm``), one Spark application that runs every epoch
  and hands a batch over to its stream itself; a killed engine is replaced by the next run.

Meanwhile a killer thread SIGKILLs the process group of a running job (its Python driver, JVM
and Python workers), a standby stream job, or the engine, at random moments: mid-wave,
mid-micro-batch, between epochs' jobs, during a standby's warm-up or after it was handed its
epoch, and, in the engine, between a batch's close and its stream's start.

After the last fault the producer stops, and the pipeline must reach, on its own and within a
bounded time, a closed stream epoch that has caught up with the log (liveness); the sink must
hold every record exactly once, each ``(epoch, sequence)`` once, with committed offsets that
never go back, and each epoch must start where the one before it ended (safety).

Seeds: ``MODESWITCH_FAULT_SEEDS`` (default three: 1 and 3 on the local runner, 2 on the
engine; every third runs its streams with the ``delta_spark`` stream writer,
:func:`stream_writer_of`); faults per seed ``MODESWITCH_FAULTS_PER_SEED`` (default 3: each kill
costs its epoch a restart, and ``make test`` ran past its 30 minutes with 5). ``make
soak-faults`` runs more of both (eight each). A failure names its seed: rerun with
``MODESWITCH_FAULT_SEEDS=<seed> make test PYTEST_ARGS=tests/faults/test_random_faults.py``
(the fault schedule replays; the moments a job reaches depend on the machine).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from fault_tools import LIVE_CYCLE, Journal, Producer, assert_safe

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.devtools.produce import EventGenerator, EventLog, produce_backlog
from modeswitch.errors import ModeswitchError
from modeswitch.runners.base import EpochRunner
from modeswitch.runners.engine import ENGINE_DIR_ENV, EngineLostError
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import LocalRunner
from modeswitch.runners.pipeline_run import open_runner
from modeswitch.sources.kafka import ENV_KAFKA_CONFIG, SCHEME, KafkaLog, kafka_environment
from modeswitch.sources.segments import SegmentLog

SEEDS = [int(s) for s in os.environ.get("MODESWITCH_FAULT_SEEDS", "1,2,3").split(",") if s]


def stream_writer_of(seed: int) -> str:
    """Every third seed's streams write with delta-spark (``stream_writer = delta_spark``), the
    others with the default writer: seed 3 of ``make test``'s three, 4 of ``make soak-faults``'
    twelve."""
    return "delta_spark" if seed % 3 == 0 else "python"


def runner_of(seed: int) -> str:
    """Even seeds run on the warm engine, odd ones on the local runner: seed 2 of ``make
    test``'s three, six of ``make soak-faults``' twelve."""
    return "warm" if seed % 2 == 0 else "local"


FAULTS = int(os.environ.get("MODESWITCH_FAULTS_PER_SEED", "3"))
BUCKETS = 4
BACKLOG = 60_000
BURST = 50_000
LIVE_RATE = 300.0
TRIES_PER_EPOCH = FAULTS + 1  # every fault may hit the same epoch: it must still get through
LIVENESS_BOUND = timedelta(minutes=4)
"""After the last fault: time to a closed stream epoch that has caught up."""
JOB_SCRIPTS = ("backlog_batch.py", "stream.py", "engine.py")


def job_groups() -> dict[int, str]:
    """The process groups of the jobs this test process started (leader pid -> what it runs)."""
    found = {}
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            command = child.cmdline()
            script = next((Path(a).name for a in command[1:3] if a.endswith(JOB_SCRIPTS)), None)
            if script and os.getpgid(child.pid) == child.pid:
                kind = "standby" if "--standby" in command else script.removesuffix(".py")
                epoch = command[command.index("--epoch") + 1] if "--epoch" in command else "-"
                found[child.pid] = f"{kind} (epoch {epoch})"
    return found


class Killer(threading.Thread):
    """Kills ``faults`` running jobs, each a random few seconds after the last, by group."""

    def __init__(self, rng: random.Random, faults: int, journal: Journal) -> None:
        super().__init__(name="fault-killer", daemon=True)
        self.rng, self.faults, self.journal = rng, faults, journal
        self.stop = threading.Event()
        self.done = threading.Event()
        self.kills: list[str] = []
        self.last_at = time.monotonic()

    def run(self) -> None:
        try:
            for _ in range(self.faults):
                if self.stop.wait(self.rng.uniform(2.0, 9.0)):
                    return
                while not (groups := job_groups()):  # between jobs: wait for the next one
                    if self.stop.wait(0.3):
                        return
                if self.stop.wait(self.rng.uniform(0.0, 4.0)):
                    return
                groups = job_groups() or groups
                pid = self.rng.choice(sorted(groups))
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                self.kills.append(groups[pid])
                self.last_at = time.monotonic()
                self.journal.note(f"SIGKILL process group {pid}: {groups[pid]}")
        finally:
            self.done.set()


def chaos_settings(
    tmp_path: Path, stream_writer: str = "python", runner: str = "local", source: str = ""
) -> PipelineSettings:
    return PipelineSettings.from_mapping(
        {
            "pipeline": "chaos",
            "engine": "warm" if runner == "warm" else "submit",
            "stream_writer": stream_writer,
            "source": source or str(tmp_path / "log"),
            "warehouse": str(tmp_path / "warehouse"),
            **LIVE_CYCLE,
            "stream_standby_lead": "60s",
        }
    )


def run_epochs(
    settings: PipelineSettings,
    runner: EpochRunner,
    journal: Journal,
    *,
    caught_up: threading.Event,
    target: dict[int, int],
    outage: Callable[[BaseException], bool] = lambda exc: False,
) -> None:
    """The operator's loop, until a stream epoch closes at ``target`` once ``caught_up`` is set
    (the faults are over and the producer has stopped). ``outage`` tells a failure that an
    injected outage explains (a broker down), besides a SIGKILLed job."""
    tries: dict[int, int] = {}
    while True:
        try:
            plan = decide(settings, decided_by="random-faults")
        except Exception as exc:
            if not outage(exc):
                raise
            journal.note(f"decide failed on the broker's outage: {str(exc)[:160]}")
            time.sleep(1)
            continue
        assert plan.epoch is not None, f"decide opened no epoch: {plan.reason}"
        tries[plan.epoch] = tries.get(plan.epoch, 0) + 1
        how = "re-attached, rerun" if plan.attached else plan.reason[:80]
        journal.note(f"epoch {plan.epoch} {plan.mode} try {tries[plan.epoch]}: {how}")
        try:
            runner.start(plan.mode, settings, plan.epoch).wait()
            status, end = close_epoch(settings, plan.epoch)
        except ModeswitchError as exc:
            journal.note(f"epoch {plan.epoch} failed: {str(exc)[:200]}")
            killed = (
                isinstance(exc, EngineLostError)
                or str(exc).endswith(f"exited with status -{signal.SIGKILL.value}")
                or outage(exc)
            )
            if not killed or tries[plan.epoch] >= TRIES_PER_EPOCH:
                # Only our SIGKILLs may fail a job, and a retry must get past them.
                raise AssertionError(
                    f"epoch {plan.epoch} failed (try {tries[plan.epoch]}): {exc}\n"
                    f"{_tail(_log_file(runner, plan.epoch, settings))}"
                ) from exc
            continue
        journal.note(f"epoch {plan.epoch} {plan.mode} closed {status} at {sum(end.values())}")
        if caught_up.is_set() and plan.mode == "stream" and end == target:
            return


# Not `exclusive`: the offset-lag policy does not depend on how fast this machine is, and the
# liveness bound (minutes) holds beside another test's Spark job.
@pytest.mark.parametrize(
    ("seed", "writer", "runner_name"),
    [(seed, stream_writer_of(seed), runner_of(seed)) for seed in SEEDS],
    ids=[f"{seed}-{runner_of(seed)}-{stream_writer_of(seed)}" for seed in SEEDS],
)
def test_random_sigkills_during_a_live_cycle_converge_exactly_once(
    tmp_path, monkeypatch, seed, writer, runner_name
) -> None:
    rng = random.Random(seed)
    journal = Journal(seed)
    journal.note(f"the {runner_name} runner; streams write with the {writer} stream writer")
    monkeypatch.setenv(ENGINE_DIR_ENV, str(tmp_path / "engines"))
    settings = chaos_settings(tmp_path, writer, runner_name)
    log = SegmentLog.create(settings.source, buckets=BUCKETS)
    killer = Killer(rng, FAULTS, journal)
    what = (
        f"random faults, seed {seed}, {runner_name} runner, stream writer {writer} "
        f"(replay: MODESWITCH_FAULT_SEEDS={seed})"
    )
    live_cycle(settings, log, rng, journal, [killer], tmp_path, what=what)
    assert len(killer.kills) == FAULTS


BROKER_SEEDS = [
    int(s) for s in os.environ.get("MODESWITCH_BROKER_FAULT_SEEDS", "4").split(",") if s
]
BROKER_FAULTS = int(os.environ.get("MODESWITCH_BROKER_FAULTS_PER_SEED", "3"))
JOB_FAULTS_ON_KAFKA = 2


class BrokerKiller(threading.Thread):
    """SIGKILLs the broker ``faults`` times, a random few seconds apart, and starts it again
    on its data after a random 1-8 s (inside ``source_outage_grace``: the jobs ride it out)."""

    def __init__(self, broker: KafkaBroker, rng: random.Random, faults: int, journal: Journal):
        super().__init__(name="broker-killer", daemon=True)
        self.broker, self.rng, self.faults, self.journal = broker, rng, faults, journal
        self.stop = threading.Event()
        self.done = threading.Event()
        self.kills: list[str] = []
        self.last_at = time.monotonic()

    def run(self) -> None:
        try:
            for _ in range(self.faults):
                if self.stop.wait(self.rng.uniform(3.0, 15.0)):
                    return
                down = self.rng.uniform(1.0, 8.0)
                running = job_groups()
                self.broker.kill()
                self.journal.note(f"SIGKILL the broker (jobs running: {sorted(running.values())})")
                time.sleep(down)
                self.broker.start()
                self.kills.append(f"broker down {down:.1f} s")
                self.last_at = time.monotonic()
                self.journal.note(f"broker started again on its data after {down:.1f} s")
        finally:
            self.done.set()


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("seed", "runner_name"),
    [(seed, runner_of(seed)) for seed in BROKER_SEEDS],
    ids=[f"{seed}-{runner_of(seed)}-kafka" for seed in BROKER_SEEDS],
)
def test_random_broker_kills_during_a_live_cycle_on_kafka_converge_exactly_once(
    tmp_path, monkeypatch, seed, runner_name
) -> None:
    """The same cycle on a topic of a real broker (Apache Kafka, KRaft, this test's own), which
    is SIGKILLed at random moments and started again on its data, beside SIGKILLs of the
    jobs. A failure the outage explains (its message names the broker) is retried as a
    killed job is. Seeds: ``MODESWITCH_BROKER_FAULT_SEEDS`` (default 4: the warm engine)."""
    rng = random.Random(seed)
    journal = Journal(seed)
    journal.note(f"the {runner_name} runner on a Kafka topic")
    monkeypatch.setenv(ENGINE_DIR_ENV, str(tmp_path / "engines"))
    with KafkaBroker(tmp_path / "broker") as broker:
        broker.create_topic("chaos", BUCKETS)
        monkeypatch.setenv(ENV_KAFKA_CONFIG, kafka_environment(broker.config)[ENV_KAFKA_CONFIG])
        settings = chaos_settings(tmp_path, runner=runner_name, source=f"{SCHEME}chaos")
        log = KafkaLog(settings.source, broker.config)
        killers = [
            Killer(rng, JOB_FAULTS_ON_KAFKA, journal),
            BrokerKiller(broker, rng, BROKER_FAULTS, journal),
        ]
        what = (
            f"random broker faults, seed {seed}, {runner_name} runner "
            f"(replay: MODESWITCH_BROKER_FAULT_SEEDS={seed})"
        )
        try:
            live_cycle(
                settings,
                log,
                rng,
                journal,
                killers,
                tmp_path,
                what=what,
                outage=lambda exc: broker.bootstrap in str(exc),
            )
        finally:
            log.close()
    assert [len(k.kills) for k in killers] == [JOB_FAULTS_ON_KAFKA, BROKER_FAULTS]


def live_cycle(
    settings: PipelineSettings,
    log: EventLog,
    rng: random.Random,
    journal: Journal,
    killers: list[Killer | BrokerKiller],
    tmp_path: Path,
    *,
    what: str,
    outage: Callable[[BaseException], bool] = lambda exc: False,
) -> None:
    """The seeded live cycle on ``log`` with ``killers`` at work; asserts liveness and
    safety, and on a failure names ``what`` (seed, runner) and prints the journal."""
    produce_backlog(
        log,
        EventGenerator(
            seed=journal.seed, buckets=BUCKETS, skew="zipf:1.1", malformed_fraction=0.01
        ),
        records=BACKLOG,
        span=timedelta(minutes=20),
    )
    producer = Producer(log, rng, journal, buckets=BUCKETS, rate=LIVE_RATE, burst=BURST)
    caught_up = threading.Event()
    target: dict[int, int] = {}

    def quiet_after_faults() -> None:
        for killer in killers:
            killer.done.wait()
        producer.wait_for_bursts()
        producer.close()
        target.update(log.latest_offsets())
        journal.note(f"faults and bursts over; producer stopped at {sum(target.values())} records")
        caught_up.set()

    quieter = threading.Thread(target=quiet_after_faults, name="quiet", daemon=True)
    try:
        with open_runner(settings, log_dir=tmp_path / "logs", timeout=240) as runner:
            producer.start()
            for killer in killers:
                killer.start()
            quieter.start()
            run_epochs(settings, runner, journal, caught_up=caught_up, target=target, outage=outage)
        took = time.monotonic() - max(k.last_at for k in killers)
        journal.note(f"caught up {took:.0f} s after the last fault")
        assert took <= LIVENESS_BOUND.total_seconds()
        assert_safe(settings, journal)
        print(f"seed {journal.seed}:\n{journal}")  # shown with -rP: what a passing run went through
    except BaseException as exc:
        raise AssertionError(
            f"{what}: {exc}\nwhat happened:\n{journal}\njob logs: {tmp_path / 'logs'}"
        ) from exc
    finally:
        for killer in killers:
            killer.stop.set()
        producer.close()
        caught_up.set()
        for killer in killers:
            killer.join(timeout=30)
        quieter.join(timeout=60)
        for pid in job_groups():  # nothing may outlive the test
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def _log_file(runner: EpochRunner, epoch: int, settings: PipelineSettings) -> Path | None:
    """The log of ``epoch``'s job (the local runner's), or the engine's (``open_runner``
    writes it beside the jobs' logs)."""
    if isinstance(runner, LocalRunner):
        return runner.log_file(epoch)
    return Path(settings.warehouse).parent / "logs" / f"engine-{settings.pipeline}.log"


def _tail(path: Path | None, lines: int = 40) -> str:
    if path is None or not path.exists():
        return "(no job log)"
    return f"last lines of {path}:\n" + "\n".join(path.read_text().splitlines()[-lines:])
