"""Triggers, run in Airflow's triggerer: :class:`LagThresholdTrigger` fires when a pipeline's
lag crosses a threshold (a deferred sensor waits on it); :class:`SinkProgressTrigger` watches
the sink for its live Asset (an ``AssetWatcher``); :class:`EngineEpochTrigger` waits for an
epoch the warm engine runs (a deferred epoch task).

They run in the triggerer's event loop: the control-table and log reads are synchronous, so
each poll runs them in a thread (``asyncio.to_thread``); between polls they only sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pendulum
import pyarrow.compute as pc
from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from modeswitch.airflow.event_extras import progress_extra, table_uri
from modeswitch.airflow.lag import measure_lag
from modeswitch.airflow.settings import (
    aconnection_kafka_config,
    aconnection_storage_options,
    settings_from_airflow,
)
from modeswitch.control.settings import PipelineSettings
from modeswitch.runners.served import await_epoch
from modeswitch.sources.kafka import kafka_config_scope
from modeswitch.state import StateStore


class LagThresholdTrigger(BaseTrigger):
    """Poll every ``poll_interval`` seconds until the watermark lag exceeds
    ``watermark_lag_threshold`` seconds or the offset lag exceeds ``offset_lag_threshold``
    records (a threshold of None is off; at least one must be set).

    ``settings`` is the pipeline's resolved settings JSON (``PipelineSettings.to_json``).
    The event's payload: ``status`` ("crossed" or "error"), ``reason``, and the reading
    (``watermark_lag_seconds``, ``watermark_state``, ``offset_lag``, ``at``).
    """

    def __init__(
        self,
        *,
        settings: str,
        watermark_lag_threshold: float | None = None,
        offset_lag_threshold: int | None = None,
        poll_interval: float = 30.0,
    ) -> None:
        super().__init__()
        if watermark_lag_threshold is None and offset_lag_threshold is None:
            raise ValueError("set watermark_lag_threshold or offset_lag_threshold (or both)")
        if watermark_lag_threshold is not None and watermark_lag_threshold <= 0:
            raise ValueError(f"watermark_lag_threshold: {watermark_lag_threshold!r} must be > 0")
        if offset_lag_threshold is not None and offset_lag_threshold <= 0:
            raise ValueError(f"offset_lag_threshold: {offset_lag_threshold!r} must be > 0")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval: {poll_interval!r} must be > 0")
        self.settings = settings
        self.watermark_lag_threshold = watermark_lag_threshold
        self.offset_lag_threshold = offset_lag_threshold
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "settings": self.settings,
                "watermark_lag_threshold": self.watermark_lag_threshold,
                "offset_lag_threshold": self.offset_lag_threshold,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        settings = PipelineSettings.from_json(self.settings)
        try:
            # The settings carry the Connection's id only: its extras are read here, in the
            # triggerer, and handed to each reading (never put in the shared environment).
            options = await aconnection_storage_options(settings)
            kafka = await aconnection_kafka_config(settings)
        except Exception as exc:  # reported to the sensor, which fails with it
            yield TriggerEvent({"status": "error", "reason": f"{type(exc).__name__}: {exc}"})
            return
        threshold = (
            None
            if self.watermark_lag_threshold is None
            else timedelta(seconds=self.watermark_lag_threshold)
        )
        while True:
            try:
                with kafka_config_scope(kafka):  # to_thread runs in a copy of this context
                    reading = await asyncio.to_thread(
                        measure_lag, settings, storage_options=options
                    )
            except Exception as exc:  # reported to the sensor, which fails with it
                yield TriggerEvent({"status": "error", "reason": f"{type(exc).__name__}: {exc}"})
                return
            reason = reading.crosses(
                watermark_lag_threshold=threshold, offset_lag_threshold=self.offset_lag_threshold
            )
            if reason is not None:
                self.log.info("pipeline %s: %s", settings.pipeline, reason)
                yield TriggerEvent({"status": "crossed", "reason": reason, **reading.to_event()})
                return
            await asyncio.sleep(self.poll_interval)


class SinkProgressTrigger(BaseEventTrigger):
    """The watcher of the sink's live Asset (:func:`modeswitch.airflow.assets.live_sink_asset`):
    every ``poll_interval`` seconds it looks at the pipeline's ``progress`` table, and fires
    for the sink commits recorded since its last event (:func:`~modeswitch.airflow.
    event_extras.progress_extra`), at most once per ``asset_event_interval``. It never ends.

    ``settings``: the pipeline's settings JSON; None (what a DAG file gives) resolves them from
    the Airflow Variables at each look, as the pipeline's tasks do, so a changed interval or
    table takes effect without a re-parse. Where it left off (the last sink version announced
    and when) is kept in the Asset's state store, so a restarted triggerer goes on from there;
    its first look starts at the sink's newest recorded commit (no flood of history). A look
    that fails (a table out of reach, a bad setting) is logged and tried again at the next:
    the watcher stays up. If the triggerer dies between an event and its record in the
    metadata database, that event is lost; the epoch's own event on the sink's Asset, at its
    close, still covers its rows.
    """

    LAST_VERSION = "last_version"
    EMITTED_AT = "emitted_at"

    def __init__(self, *, poll_interval: float = 10.0, settings: str | None = None) -> None:
        super().__init__()
        if poll_interval <= 0:
            raise ValueError(f"poll_interval: {poll_interval!r} must be > 0")
        self.poll_interval = poll_interval
        self.settings = settings
        self._memory: dict[str, Any] = {}  # the state without an Asset state store (tests)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"poll_interval": self.poll_interval, "settings": self.settings},
        )

    async def _get(self, key: str) -> Any:
        if self.asset_state_store is None:
            return self._memory.get(key)
        return await self.asset_state_store.aget(key)

    async def _set(self, key: str, value: Any) -> None:
        if self.asset_state_store is None:
            self._memory[key] = value
        else:
            await self.asset_state_store.aset(key, value)

    def _resolve(self) -> PipelineSettings:
        if self.settings is not None:
            return PipelineSettings.from_json(self.settings)
        return settings_from_airflow()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                event = await self._look()
            except Exception as exc:  # the watcher stays up; the log says why
                self.log.warning("sink progress: %s: %s", type(exc).__name__, exc)
                event = None
            if event is not None:
                yield event
            await asyncio.sleep(self.poll_interval)

    async def _look(self) -> TriggerEvent | None:
        """One look: an event for the commits since the last one, or None (nothing new, or
        the interval since the last event not over yet)."""
        settings = self._resolve()
        options = await aconnection_storage_options(settings)
        store = StateStore.from_settings(settings, storage_options=options)
        last = await self._get(self.LAST_VERSION)
        if last is None:
            newest = await asyncio.to_thread(_newest_recorded_version, store)
            await self._set(self.LAST_VERSION, newest)
            self.log.info("sink progress of %s: following from version %d", store, newest)
            return None
        emitted_at = await self._get(self.EMITTED_AT)
        now = pendulum.now("UTC")
        interval = settings.asset_event_interval
        if emitted_at is not None and now < pendulum.parse(emitted_at) + interval:
            return None
        commits = await asyncio.to_thread(store.progress.after_version, int(last))
        if not commits:
            return None
        extra = progress_extra(settings.pipeline, table_uri(settings.sink), commits)
        await self._set(self.LAST_VERSION, extra["last_version"])
        await self._set(self.EMITTED_AT, now.isoformat())
        self.log.info(
            "sink progress of %s: %d records in versions %s-%s",
            settings.pipeline,
            extra["records"],
            extra["first_version"],
            extra["last_version"],
        )
        return TriggerEvent(extra)


def _newest_recorded_version(store: StateStore) -> int:
    """The newest sink version the ``progress`` table records, -1 for none."""
    versions = store.tables.table("progress").read(columns=["sink_version"])
    column = versions.column("sink_version").drop_null()
    return int(pc.max(column).as_py()) if len(column) else -1


class EngineEpochTrigger(BaseTrigger):
    """Wait for the end of ``kind`` epoch ``epoch`` in the pipeline's engine, found at
    ``follow_at`` (the warm engine's address file, or ``tcp://HOST:PORT`` of the deployment's
    served engine: :func:`modeswitch.runners.served.await_epoch`): the epoch
    task defers to it once the engine has taken the epoch, so no worker slot is held while
    the engine runs it. The event's payload: ``status`` (``done``, ``failed``: the epoch's own
    error, ``lost``: the engine went away or never ran it), ``error``, ``kind``, ``epoch``.

    A triggerer that restarts makes the trigger again: it attaches to the epoch anew. The
    engine's token is never in the trigger's arguments: a warm engine's stays in its address
    file, read where the trigger runs (the engine's host: the warm engine is chosen only for
    executors that run tasks there); a served engine's is the triggerer's own
    ``MODESWITCH_ENGINE_TOKEN``."""

    def __init__(
        self,
        *,
        follow_at: str,
        kind: str,
        epoch: int,
        check_every: float = 10.0,
        pipeline: str = "",
    ) -> None:
        super().__init__()
        if kind not in ("batch", "stream"):
            raise ValueError(f"kind: {kind!r} is not batch or stream")
        self.follow_at = follow_at
        self.kind = kind
        self.epoch = int(epoch)
        self.check_every = check_every
        self.pipeline = pipeline  # its lane in an engine that several pipelines share

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "follow_at": self.follow_at,
                "kind": self.kind,
                "epoch": self.epoch,
                "check_every": self.check_every,
                "pipeline": self.pipeline,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        self.log.info("waiting for %s epoch %d in the engine", self.kind, self.epoch)
        ended = await await_epoch(
            self.follow_at,
            self.kind,  # type: ignore[arg-type]
            self.epoch,
            check_every=self.check_every,
            pipeline=self.pipeline,
        )
        self.log.info("%s epoch %d in the engine: %s", self.kind, self.epoch, ended["status"])
        yield TriggerEvent({**ended, "kind": self.kind, "epoch": self.epoch})
