"""The ``modeswitch_delta`` sink options both modes' jobs give their writes."""

from __future__ import annotations

from collections.abc import Mapping

from modeswitch.config import PipelineSettings


def sink_options(
    settings: PipelineSettings, epoch: int, mode: str, *, storage_options: Mapping[str, str]
) -> dict[str, str]:
    """The ``modeswitch_delta`` options of epoch ``epoch``'s writes in ``mode``, with the
    tables' ``storage_options`` as ``storage.<key>`` options (the executors' writers need
    them; Spark shows option values in its UI, so only a job's own writes carry them)."""
    return {
        "pipeline": settings.pipeline,
        "epoch": str(epoch),
        "mode": mode,
        "quarantinePath": settings.quarantine,
        **{f"storage.{key}": value for key, value in storage_options.items()},
    }
