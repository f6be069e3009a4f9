"""A sensor that waits until a pipeline's watermark lag or offset lag crosses a threshold,
deferred to the triggerer (no worker slot held) by default."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from functools import cached_property
from typing import Any

from airflow.sdk import BaseSensorOperator

from modeswitch.airflow.lag import measure_lag
from modeswitch.airflow.settings import (
    connection_storage_options,
    deployment_fleet,
    settings_from_airflow,
    source_credentials,
)
from modeswitch.airflow.triggers import LagThresholdTrigger
from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ModeswitchError


class LagThresholdSensor(BaseSensorOperator):
    """Succeed once the watermark lag exceeds ``watermark_lag_threshold`` or the offset lag
    exceeds ``offset_lag_threshold`` records; returns the reading (XCom).

    The pipeline's settings are resolved at run time from the Variables (plus ``settings``
    overrides), once per task run (:attr:`pipeline_settings`): its pokes and the trigger it
    defers to all use them. With ``deferrable=True`` (default) the wait runs in the triggerer.
    """

    template_fields = ("settings",)

    def __init__(
        self,
        *,
        watermark_lag_threshold: timedelta | None = None,
        offset_lag_threshold: int | None = None,
        settings: Mapping[str, Any] | None = None,
        pipeline: str | None = None,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if watermark_lag_threshold is None and offset_lag_threshold is None:
            raise ValueError("set watermark_lag_threshold or offset_lag_threshold (or both)")
        self.watermark_lag_threshold = watermark_lag_threshold
        self.offset_lag_threshold = offset_lag_threshold
        self.settings = dict(settings or {})
        self.pipeline = pipeline  # one of the pipelines folder's; None: modeswitch's
        self.deferrable = deferrable

    @cached_property
    def pipeline_settings(self) -> PipelineSettings:
        """The pipeline's settings (``pipeline``'s, a pipeline the deployment's pipelines folder
        declares, with its file and its own Variables; ``modeswitch``'s by default): the
        Variables, then ``settings`` over them; read and validated on first use in a task
        run, then kept for the rest of it."""
        declared = deployment_fleet().get(self.pipeline) if self.pipeline else None
        return settings_from_airflow(self.settings, pipeline=declared)

    def _check(self) -> dict[str, Any] | None:
        settings = self.pipeline_settings
        with source_credentials(settings):
            reading = measure_lag(settings, storage_options=connection_storage_options(settings))
        reason = reading.crosses(
            watermark_lag_threshold=self.watermark_lag_threshold,
            offset_lag_threshold=self.offset_lag_threshold,
        )
        if reason is None:
            return None
        return {"status": "crossed", "reason": reason, **reading.to_event()}

    def poke(self, context: Any) -> bool:
        return self._check() is not None

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            super().execute(context)
            return self._check()
        crossed = self._check()
        if crossed is not None:
            return crossed
        self.defer(
            trigger=LagThresholdTrigger(
                settings=self.pipeline_settings.to_json(),
                watermark_lag_threshold=(
                    None
                    if self.watermark_lag_threshold is None
                    else self.watermark_lag_threshold.total_seconds()
                ),
                offset_lag_threshold=self.offset_lag_threshold,
                poll_interval=self.poke_interval,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "crossed":
            raise ModeswitchError(f"lag sensor: {event.get('reason', event)}")
        self.log.info("lag crossed: %s", event["reason"])
        return event
