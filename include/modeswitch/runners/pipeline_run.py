"""The pipeline run outside Airflow: decide, run, close, and again (``modeswitch run``, the
demo, the benchmarks).

:func:`run_one_epoch` is the epoch lifecycle the Airflow DAG runs as three tasks (``decide``,
the job, ``close_epoch``: :mod:`modeswitch.runners.lifecycle`), with the runner
:func:`open_runner` opens from the settings (:func:`~modeswitch.runners.base.runner_choice`);
:func:`run_pipeline` loops it until a condition holds; :func:`run_pipelines` runs several
pipelines' loops at once, on one engine when engines are shared.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError, ModeswitchError
from modeswitch.offsets import OffsetsMap
from modeswitch.runners.base import EpochRunner, runner_choice
from modeswitch.runners.lifecycle import EpochDone, EpochPlan, close_epoch, decide
from modeswitch.runners.served import served_engine

log = logging.getLogger(__name__)


def run_one_epoch(
    settings: PipelineSettings,
    runner: EpochRunner,
    *,
    decided_by: str,
    run_settings: Callable[[EpochPlan], PipelineSettings] | None = None,
    on_plan: Callable[[EpochPlan], None] | None = None,
) -> EpochDone | None:
    """Decide the next epoch, run it with ``runner`` and close it: the epoch lifecycle that the
    Airflow DAG runs as three tasks (``decide``, the job, ``close_epoch``). ``run_settings``
    may give the job other settings for a plan (a stream's runtime cut to a deadline);
    ``on_plan`` is told the plan before its job starts (also when no epoch opens). None when
    no epoch opens (paused)."""
    plan = decide(settings, decided_by=decided_by)
    if on_plan:
        on_plan(plan)
    if plan.epoch is None:
        return None
    chosen = run_settings(plan) if run_settings else settings
    runner.start(plan.mode, chosen, plan.epoch).wait()  # type: ignore[arg-type]
    status, end = close_epoch(settings, plan.epoch)
    return plan, status, end


def local_engine_runner(
    settings: PipelineSettings,
    *,
    log_dir: str | Path | None,
    timeout: float,
    env: Mapping[str, str] | None,
) -> EpochRunner:
    """The warm engine, started by this runner as a child process group on the local master
    and stopped with it; its Spark scratch is the engine's own (``engine_scratch``)."""
    from modeswitch.runners.engine import EngineRunner, start_local_engine

    return EngineRunner(start_local_engine(settings, env=env, log_dir=log_dir), owns_engine=True)


def local_process_runner(
    settings: PipelineSettings,
    *,
    log_dir: str | Path | None,
    timeout: float,
    env: Mapping[str, str] | None,
) -> EpochRunner:
    """Each epoch's job a child process, with the stream standby; it keeps its jobs' scratch."""
    from modeswitch.runners.local import LocalRunner

    return LocalRunner(log_dir=log_dir, timeout=timeout, env=env)


def served_engine_runner(settings: PipelineSettings, **_: Any) -> EpochRunner:
    """The deployment's served engine (``MODESWITCH_ENGINE_ADDRESS``), which it runs."""
    from modeswitch.runners.served import ServedEngineRunner

    return ServedEngineRunner()


LOCAL_RUNNERS: Mapping[str, Callable[..., EpochRunner]] = {
    "warm": local_engine_runner,
    "local": local_process_runner,
    "served": served_engine_runner,
}
"""The runner of each :func:`~modeswitch.runners.base.runner_choice` outside Airflow
(``submit`` needs Airflow's Spark connection: outside it the choice is ``local``)."""


@contextlib.contextmanager
def open_runner(
    settings: PipelineSettings,
    *,
    log_dir: str | Path | None = None,
    timeout: float = 1800,
    env: Mapping[str, str] | None = None,
) -> Iterator[EpochRunner]:
    """The runner the settings choose outside Airflow (:func:`runner_choice`), stopped at
    the end of the block: a :class:`~modeswitch.runners.local.LocalRunner`, or an
    :class:`~modeswitch.runners.engine.EngineRunner` whose engine this block starts (a child
    process group on the local master) and stops."""
    name, why = runner_choice(settings.engine, airflow=False, served=served_engine())
    log.info("pipeline %s: %s", settings.pipeline, why)
    runner = LOCAL_RUNNERS[name](settings, log_dir=log_dir, timeout=timeout, env=env)
    try:
        yield runner
    finally:
        runner.stop()


UNTIL_CAUGHT_UP = "caught-up"


def run_pipeline(
    settings: PipelineSettings,
    *,
    until: str | None = None,
    duration: timedelta | None = None,
    max_epochs: int | None = None,
    runner: EpochRunner | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    on_epoch: Callable[[EpochPlan, str, OffsetsMap], None] | None = None,
    idle_wait: float = 5.0,
    decided_by: str = "modeswitch run",
) -> list[EpochDone]:
    """``modeswitch run``: decide, run and close epochs in a loop (:func:`run_one_epoch`), as
    the Airflow DAG does, until a condition holds (or ``should_stop()``, checked between
    epochs). The runner is the one the settings choose (:func:`open_runner`) unless given.

    - ``until="caught-up"``: stream epochs read what the log holds when they start and then
      end (``stream_trigger = available_now``); the run stops once one has closed having
      committed up to those offsets.
    - ``duration``: the run stops when it has lasted that long; a stream epoch ends then at
      the latest (``stream_ends_by``), a batch epoch runs to its boundary.
    - ``max_epochs``: the run stops after that many epochs.
    - none of these: until ``should_stop()`` (Ctrl-C).

    A paused pipeline (no epoch to run) is asked again every ``idle_wait`` seconds.
    """
    if until not in (None, UNTIL_CAUGHT_UP):
        raise ConfigError(f"--until {until!r}: expected {UNTIL_CAUGHT_UP!r}")
    deadline = None if duration is None else time.monotonic() + duration.total_seconds()
    # Every epoch's job gets the stream's settings: a batch handed over to its stream inside
    # the warm engine starts that stream with them. The run's end is a time, not a runtime:
    # that stream starts when the batch ends (ci63: cut to the time left at the batch's start,
    # it ran past the end by the batch's length).
    changes = {"stream_trigger": "available_now"} if until == UNTIL_CAUGHT_UP else {}
    if duration is not None:
        changes["stream_ends_by"] = (datetime.now(UTC) + duration).isoformat()
    job_settings = _with(settings, **changes)

    done: list[EpochDone] = []
    with contextlib.ExitStack() as stack:
        if runner is None:
            runner = stack.enter_context(open_runner(settings))
        while not should_stop() and (max_epochs is None or len(done) < max_epochs):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            ran = run_one_epoch(
                settings, runner, decided_by=decided_by, run_settings=lambda _: job_settings
            )
            if ran is None:
                time.sleep(idle_wait if left is None else min(idle_wait, left))
                continue
            done.append(ran)
            plan, status, end = ran
            if on_epoch:
                on_epoch(plan, status, end)
            if until == UNTIL_CAUGHT_UP and plan.mode == "stream" and status == "completed":
                break
    return done


def run_pipelines(
    pipelines: Sequence[PipelineSettings],
    *,
    should_stop: Callable[[], bool] = lambda: False,
    on_epoch: Callable[[str, EpochPlan, str, OffsetsMap], None] | None = None,
    **options: Any,
) -> dict[str, list[EpochDone]]:
    """``modeswitch run`` with several pipelines: each one's :func:`run_pipeline` in a thread
    of its own, with the same ``options`` (``until``, ``duration``, ...), until every loop has
    ended. Where the engine is shared (``MODESWITCH_ENGINE_SHARING=deployment``, which
    ``modeswitch run`` sets for several pipelines, or a served engine) one runner serves them
    all, opened before the first and stopped after the last; otherwise each pipeline opens its
    own. A pipeline whose loop fails stops only itself: its error is raised once the others
    have ended (the first one, naming its pipeline)."""
    from modeswitch.runners.engine import shared_engines

    names = [s.pipeline for s in pipelines]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"pipelines {twice}: each pipeline runs once; their names repeat")
    done: dict[str, list[EpochDone]] = {}
    failed: list[tuple[str, BaseException]] = []
    with contextlib.ExitStack() as stack:
        first = pipelines[0]
        name, _ = runner_choice(first.engine, airflow=False, served=served_engine())
        shared = None
        if name == "served" or (name == "warm" and shared_engines()):
            shared = stack.enter_context(open_runner(first))

        def loop(settings: PipelineSettings) -> None:
            def told(plan: EpochPlan, status: str, end: OffsetsMap) -> None:
                if on_epoch:
                    on_epoch(settings.pipeline, plan, status, end)

            try:
                done[settings.pipeline] = run_pipeline(
                    settings, runner=shared, should_stop=should_stop, on_epoch=told, **options
                )
            except BaseException as exc:
                log.error("pipeline %s stopped: %s", settings.pipeline, exc)
                failed.append((settings.pipeline, exc))

        threads = [
            threading.Thread(target=loop, args=(s,), name=f"run-{s.pipeline}") for s in pipelines
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if failed:
        pipeline, error = failed[0]
        raise ModeswitchError(f"pipeline {pipeline!r}: {error}") from error
    return done


def _with(settings: PipelineSettings, **changes: str) -> PipelineSettings:
    return PipelineSettings.from_mapping({**settings.to_mapping(), **changes})
