"""A deferrable trigger that fires when a pipeline's lag crosses a threshold.

Runs in the triggerer's event loop: the control-table and log reads are synchronous, so each
poll runs them in a thread (``asyncio.to_thread``); between polls it only sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from modeswitch.airflow.lag import measure_lag
from modeswitch.airflow.settings import aconnection_kafka_config, aconnection_storage_options
from modeswitch.control.settings import PipelineSettings
from modeswitch.sources.kafka import kafka_config_scope


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
