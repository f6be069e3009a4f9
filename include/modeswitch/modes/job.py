"""A job resolved once: the settings turned into what a batch, stream or backfill job runs.

Every entry that runs a job (the ``spark-submit`` jobs and the local runner's, through
:mod:`modeswitch.runners.jobs`; the warm engine's epochs; the stream standby's warm-up) calls
:func:`resolve_job` once, and the mode (:mod:`modeswitch.modes.batch`,
:mod:`~modeswitch.modes.stream`, :mod:`~modeswitch.modes.backfill_job`) takes the
:class:`JobPlan`: the log's kind and what it can do, the payload read once from its settings,
the transform built once, and the path each seam chose (the waves':
:func:`~modeswitch.modes.wave_path.choose_wave_path`; the stream's:
:func:`~modeswitch.modes.stream_path.choose_stream_path`). A setting that cannot work is refused
here, naming it, before the job reads or writes anything.

The transform's Arrow form is built (and its output checked) the first time a path needs it,
once per job; the ``bucketlog`` reader gets it as built (:attr:`JobPlan.reader_arrow_options`),
so no Python worker loads the transform again by its setting's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from modeswitch.control.value_schema import Payload
from modeswitch.modes.stream_path import StreamPath, choose_stream_path
from modeswitch.modes.wave_path import WavePath, choose_wave_path
from modeswitch.sources import log_type
from modeswitch.sources.base import spark_record_schema
from modeswitch.sources.spark_options import arrow_form_options
from modeswitch.transforms import ArrowForm, Transform, payload_transform

if TYPE_CHECKING:
    from modeswitch.control.settings import PipelineSettings
    from modeswitch.sources.base import BucketedLog, LogCapabilities
    from modeswitch.transforms.schema_ids import SeenByColumn

JobKind = Literal["batch", "stream", "backfill"]


@dataclass(frozen=True)
class JobPlan:
    """What one job runs, resolved from its settings by :func:`resolve_job`."""

    kind: JobKind
    settings: PipelineSettings
    """The settings it was resolved from: the sink's, the planner's and the policy's."""
    log: type[BucketedLog]
    """The kind of log the ``source`` setting names; its class attributes are what it can do
    (:class:`~modeswitch.sources.base.LogCapabilities`)."""
    payload: Payload
    transform: Transform
    waves: WavePath | None = None
    """How a batch's waves or a backfill's window are read and written (None for a stream)."""
    stream: StreamPath | None = None
    """How a stream's query reads, transforms and writes (None for a batch or a backfill)."""

    @property
    def source(self) -> str:
        """The ``source`` setting: where the log is read from."""
        return self.settings.source

    @cached_property
    def arrow(self) -> ArrowForm:
        """The transform's Arrow form on the log's records (their headers too where the source
        keeps them), built and checked once. Only a
        path whose transform runs as ``arrow`` asks for it, and those are chosen only for a
        transform that has one."""
        form = self.transform.arrow_form(spark_record_schema(self.source))
        assert form is not None, f"transform={self.transform.name!r} has no Arrow form"
        return form

    @cached_property
    def reader_arrow_options(self) -> dict[str, str]:
        """The ``bucketlog`` reader's options that run :attr:`arrow` where it reads."""
        return arrow_form_options(self.arrow.function, self.arrow.schema)

    def stream_path_on(self, capabilities: LogCapabilities) -> StreamPath:
        """The stream path on another log than the pipeline's (the warm-up's own), with this
        job's transform and writer."""
        return choose_stream_path(
            capabilities,
            arrow_form=self.transform.arrow is not None,
            stream_writer=self.settings.stream_writer,
        )


def resolve_job(
    settings: PipelineSettings, kind: JobKind, seen: SeenByColumn | None = None
) -> JobPlan:
    """The :class:`JobPlan` of a ``kind`` job on ``settings``: the payload described and the
    transform built once (a binary payload's with what the job's earlier runs learned of its
    schema ids, ``seen``, by column), and the seam that job kind uses chosen. Raises
    :class:`~modeswitch.errors.ConfigError` naming the setting for a transform that cannot be
    loaded or a path that cannot run (``batch_reader = arrow`` with a transform without an Arrow
    form, an unknown reader or writer)."""
    log = log_type(settings.source)
    payload = settings.describe_payload()
    transform = payload_transform(payload, seen)
    stream = (
        JobPlan(kind, settings, log, payload, transform).stream_path_on(log)
        if kind == "stream"
        else None
    )
    waves = (
        None
        if kind == "stream"
        else choose_wave_path(
            log,
            batch_reader=settings.batch_reader,
            batch_writer=settings.batch_writer,
            transform=transform,
            job=kind,
            source=settings.source,
        )
    )
    return JobPlan(kind, settings, log, payload, transform, waves=waves, stream=stream)


__all__ = ["JobKind", "JobPlan", "resolve_job"]
