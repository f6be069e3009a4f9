"""An engine's lanes: one per pipeline it serves (:class:`Engine`: that pipeline's epochs one
at a time, a retry's ``run`` attaching, the handoff after a batch), the set of them
(:class:`Lanes`), and what binds a lane's thread to the session (:func:`bind_thread`). Why a
lane is a thread of its own and what binding it does: :mod:`modeswitch.runners.engine_server`.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from modeswitch.control.settings import PipelineSettings
from modeswitch.control.settings_layers import load_job_settings
from modeswitch.runners.engine import EngineRefusedError

log = logging.getLogger(__name__)

ENDED_KEPT = 16
"""Epochs that ran to their end, remembered so that a task that comes for one after its end
is told it is done (:meth:`Engine.submit`); epoch ids only grow, so a few suffice."""


class Engine:
    """One pipeline's lane: runs its epochs one at a time in the session; a ``run`` of the
    running epoch attaches.

    The epochs run in the thread that calls :meth:`run_next` (the lane's, bound to the session:
    :func:`bind_thread`); the request handlers only queue them and wait."""

    def __init__(
        self,
        spark: Any,
        pipeline: str,
        runner: Callable[..., None] | None = None,
        *,
        handoff: bool = True,
    ):
        self.spark = spark
        self.pipeline = pipeline
        self.handoff = handoff
        self._runner = runner or run_epoch
        self._lock = threading.Lock()
        self._running: tuple[str, int, Future] | None = None
        self._ended: dict[tuple[str, int], Future] = {}  # the last epochs that ran to their end
        self._queue: queue.Queue[tuple[str, int, PipelineSettings, Future]] = queue.Queue()

    def running(self) -> tuple[str, int] | None:
        with self._lock:
            if self._running is None or self._running[2].done():
                return None
            return self._running[0], self._running[1]

    def submit(self, kind: str, epoch: int, config: str) -> Future:
        """Run ``kind`` epoch ``epoch``, or attach to it: while it runs, and once it has run
        to its end here (a stream the engine handed a batch over to may stop, on a command or
        its policy, before the next DAG run's task comes for it; running it again would lose
        why it stopped). An epoch whose run failed runs again (a task's retry)."""
        with self._lock:
            ended = self._ended.get((kind, epoch))
            if ended is not None:
                log.info("engine: %s epoch %d already ran to its end here", kind, epoch)
                return ended
            if self._running is not None and not self._running[2].done():
                running_kind, running_epoch, future = self._running
                if (running_kind, running_epoch) == (kind, epoch):
                    log.info("engine: attached to %s epoch %d, still running", kind, epoch)
                    return future
                raise EngineRefusedError(
                    f"engine of pipeline {self.pipeline!r} is running {running_kind} epoch "
                    f"{running_epoch}; {kind} epoch {epoch} waits for it to end"
                )
            return self._enqueue(kind, epoch, load_job_settings(config, pipeline=self.pipeline))

    def attached(self, kind: str, epoch: int) -> Future | None:
        """The run of ``kind`` epoch ``epoch`` here, to wait on: the one running, the last one
        that ended (failed or not), or one of the epochs that ran to their end; None if this
        engine has not run it (it was restarted since, or was never asked)."""
        with self._lock:
            ended = self._ended.get((kind, epoch))
            if ended is not None:
                return ended
            if self._running is not None and self._running[:2] == (kind, epoch):
                return self._running[2]
            return None

    def _enqueue(self, kind: str, epoch: int, settings: PipelineSettings) -> Future:
        """Make ``kind`` epoch ``epoch`` the running one and queue it (``_lock`` held)."""
        future: Future = Future()
        self._running = (kind, epoch, future)
        self._queue.put((kind, epoch, settings, future))
        return future

    def pending(self) -> bool:
        """Whether an epoch waits to run."""
        return not self._queue.empty()

    def run_next(self, timeout: float) -> tuple[str, PipelineSettings] | None:
        """Run the next queued epoch, if one comes within ``timeout`` seconds; returns its
        kind and settings."""
        try:
            kind, epoch, settings, future = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if not future.set_running_or_notify_cancel():
            return None
        log.info("engine: running %s epoch %d", kind, epoch)
        try:
            self._runner(kind, self.spark, epoch, settings)
        except BaseException as exc:
            future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return kind, settings
        stream = self._hand_off(epoch, settings) if kind == "batch" and self.handoff else None
        with self._lock:
            self._ended[(kind, epoch)] = future
            while len(self._ended) > ENDED_KEPT:
                del self._ended[next(iter(self._ended))]
            if stream is not None:
                log.info("engine: handing off to stream epoch %d at once", stream)
                self._enqueue("stream", stream, settings)
        # Told done only now: the batch's task ends with its epoch closed and the stream
        # queued, so the next DAG run's decide re-attaches what the engine opened.
        future.set_result(None)
        return kind, settings

    def _hand_off(self, batch_epoch: int, settings: PipelineSettings) -> int | None:
        """After a batch epoch: close it and, if the policy (or a pending command) chooses
        stream, open the stream epoch, without waiting for the next DAG run; returns its id
        (the caller queues it at once). That run's ``decide`` re-attaches the open epoch and
        its ``stream`` task attaches to the run queued; a ``close_epoch`` task finds the batch
        epoch closed. Whatever decides batch or pause is left to the next DAG run."""
        from modeswitch.runners.lifecycle import hand_off_to_stream

        try:
            return hand_off_to_stream(settings, batch_epoch, decided_by="engine")
        except Exception as exc:  # the next DAG run decides as always
            log.warning("engine: no handoff after batch epoch %d: %s", batch_epoch, exc)
        return None

    def close(self) -> None:
        while not self._queue.empty():
            self._queue.get_nowait()[3].cancel()


def run_epoch(kind: str, spark: Any, epoch: int, settings: PipelineSettings) -> None:
    from modeswitch.runners.jobs import run

    run(kind, spark, settings, epoch=epoch)  # type: ignore[arg-type]


def bind_thread(spark: Any, pipeline: str) -> None:
    """Make this thread run Spark for ``spark`` as ``pipeline``: the session its JVM thread's
    active one (pyspark pins a Python thread to one JVM thread for its life) and the
    pipeline's scheduler pool for the jobs it starts (the queries it starts inherit both)."""
    if spark is None:  # a stand-in session (tests)
        return
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", pipeline)


class Lanes:
    """The pipelines an engine serves, a lane each (:class:`Engine`), opened when a pipeline
    first comes (``shared``; else only ``first``'s) and started with ``start(lane)``."""

    def __init__(
        self,
        first: str,
        make: Callable[[str], Engine],
        start: Callable[[Engine], None] = lambda lane: None,
        *,
        shared: bool = False,
    ) -> None:
        self.first, self.shared = first, shared
        self._make, self._start = make, start
        self._lock = threading.Lock()
        self._lanes: dict[str, Engine] = {}

    @classmethod
    def single(cls, engine: Engine) -> Lanes:
        """One lane, run by whoever calls its ``run_next`` (tests, stand-ins)."""
        lanes = cls(engine.pipeline, lambda name: engine)
        lanes._lanes[engine.pipeline] = engine
        return lanes

    def lane(self, pipeline: str | None) -> Engine:
        """``pipeline``'s lane (the first one's when a request names none), opened now if it
        is new here and the engine is shared; else an :class:`EngineRefusedError`."""
        name = pipeline or self.first
        with self._lock:
            lane = self._lanes.get(name)
            if lane is not None:
                return lane
            if not self.shared and name != self.first:
                raise EngineRefusedError(
                    f"this engine runs pipeline {self.first!r} only, not {name!r} (an engine "
                    "per pipeline: MODESWITCH_ENGINE_SHARING=pipeline)"
                )
            lane = self._lanes[name] = self._make(name)
        log.info("engine: a lane for pipeline %s", name)
        self._start(lane)
        return lane

    def running(self) -> dict[str, tuple[str, int]]:
        """The epoch each lane runs, by pipeline (lanes that run none left out)."""
        with self._lock:
            lanes = dict(self._lanes)
        return {name: run for name, lane in lanes.items() if (run := lane.running()) is not None}

    def close(self) -> None:
        with self._lock:
            lanes = list(self._lanes.values())
        for lane in lanes:
            lane.close()
