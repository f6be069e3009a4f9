"""SIGKILL a shared warm engine at random moments while it serves three pipelines; each must
converge to its own log, exactly once.

Three pipelines, a log and a live producer each (their bursts at their own seeded moments),
one engine for all (``MODESWITCH_ENGINE_SHARING=deployment``: a lane and a scheduler pool
each). Each pipeline's epochs run in the operator's loop of ``test_random_faults`` (decide ->
the job -> close, a failed job retried after ``decide`` re-attaches), the three loops at once
against one runner. A killer thread SIGKILLs the engine's process group at random moments
(mid-wave, mid-micro-batch, between a batch's close and its stream's start): every pipeline it
served loses its running epoch at once, and the next try of each restarts one engine (the
address file's lock lets one start it) and re-attaches. After the last fault each pipeline must
reach a closed stream epoch caught up with its log within the liveness bound, and each sink
must hold its records exactly once (``assert_safe``).

Seeds: ``MODESWITCH_FLEET_FAULT_SEEDS`` (default 6); faults per seed
``MODESWITCH_FLEET_FAULTS_PER_SEED`` (default 3: each kill costs all three pipelines an epoch;
``make soak-faults`` runs more of both).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from datetime import timedelta

import pytest
from fault_tools import Journal, Producer, assert_safe
from test_random_faults import (
    LIVENESS_BOUND,
    Killer,
    chaos_settings,
    job_groups,
    run_epochs,
)

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.environment import ENGINE_SHARING
from modeswitch.runners.engine import ENGINE_DIR_ENV
from modeswitch.runners.pipeline_run import open_runner
from modeswitch.sources.segments import SegmentLog

SEEDS = [int(s) for s in os.environ.get("MODESWITCH_FLEET_FAULT_SEEDS", "6").split(",") if s]
FAULTS = int(os.environ.get("MODESWITCH_FLEET_FAULTS_PER_SEED", "3"))
PIPELINES = ("orders", "clicks", "payments")
BUCKETS = 3
BACKLOG = 30_000
BURST = 25_000
LIVE_RATE = 100.0


@pytest.mark.parametrize("seed", SEEDS, ids=[f"{seed}-shared-engine-3-pipelines" for seed in SEEDS])
def test_random_kills_of_a_shared_engine_converge_each_pipeline_exactly_once(
    tmp_path, monkeypatch, seed
) -> None:
    rng = random.Random(seed)
    journal = Journal(seed)
    monkeypatch.setenv(ENGINE_DIR_ENV, str(tmp_path / "engines"))
    monkeypatch.setenv(ENGINE_SHARING.name, "deployment")
    fleet = [
        PipelineSettings.from_mapping(
            {**chaos_settings(tmp_path / name, runner="warm").to_mapping(), "pipeline": name}
        )
        for name in PIPELINES
    ]
    producers, targets = [], {s.pipeline: {} for s in fleet}
    for number, settings in enumerate(fleet):
        log = SegmentLog.create(settings.source, buckets=BUCKETS)
        generator = EventGenerator(seed=seed + number, buckets=BUCKETS, malformed_fraction=0.01)
        produce_backlog(log, generator, records=BACKLOG, span=timedelta(minutes=20))
        producers.append(
            (
                settings.pipeline,
                log,
                Producer(
                    log,
                    random.Random(seed * 10 + number),
                    journal,
                    buckets=BUCKETS,
                    rate=LIVE_RATE,
                    burst=BURST,
                ),
            )
        )
    killer = Killer(rng, FAULTS, journal)
    caught_up = threading.Event()

    def quiet_after_faults() -> None:
        killer.done.wait()
        for name, log, producer in producers:
            producer.wait_for_bursts()
            producer.close()
            targets[name].update(log.latest_offsets())
        journal.note("faults and bursts over; the producers stopped")
        caught_up.set()

    failures: dict[str, BaseException] = {}
    quieter = threading.Thread(target=quiet_after_faults, name="quiet", daemon=True)
    try:
        with open_runner(fleet[0], log_dir=tmp_path / "logs", timeout=240) as runner:

            def loop(settings: PipelineSettings) -> None:
                try:
                    run_epochs(
                        settings,
                        runner,
                        journal,
                        caught_up=caught_up,
                        target=targets[settings.pipeline],
                    )
                except BaseException as exc:
                    failures[settings.pipeline] = exc

            for _, _, producer in producers:
                producer.start()
            killer.start()
            quieter.start()
            loops = [threading.Thread(target=loop, args=(s,), name=s.pipeline) for s in fleet]
            for thread in loops:
                thread.start()
            for thread in loops:
                thread.join()
        assert failures == {}, failures
        took = time.monotonic() - killer.last_at
        journal.note(f"all three caught up {took:.0f} s after the last fault")
        assert took <= LIVENESS_BOUND.total_seconds()
        for settings in fleet:
            assert_safe(settings, journal)
        assert len(killer.kills) == FAULTS
        assert all(kill.startswith("engine") for kill in killer.kills), killer.kills
        print(f"seed {seed}:\n{journal}")
    except BaseException as exc:
        raise AssertionError(
            f"shared engine, three pipelines, seed {seed} (replay: "
            f"MODESWITCH_FLEET_FAULT_SEEDS={seed}): {exc}\nwhat happened:\n{journal}\n"
            f"logs: {tmp_path / 'logs'}"
        ) from exc
    finally:
        killer.stop.set()
        for _, _, producer in producers:
            producer.close()
        caught_up.set()
        killer.join(timeout=30)
        quieter.join(timeout=60)
        for pid in job_groups():  # nothing may outlive the test
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
