"""The wave seam: how a batch wave, or a backfill's window, is read and written, chosen once.

:func:`choose_wave_path` is a pure function (no Spark, no I/O) of what the log can do (its
:class:`~modeswitch.sources.base.LogCapabilities`), the ``batch_reader`` and ``batch_writer``
settings and the transform's forms (:class:`~modeswitch.transforms.Transform`). Batch epochs
(:mod:`modeswitch.modes.batch`) and backfills (:mod:`modeswitch.modes.backfill_job`) both ask
it, and do what the :class:`WavePath` says.

``batch_reader = auto`` (the default) is first resolved by :func:`auto_reader` to the reader
below that runs the transform's faster form: ``arrow`` for a transform whose Arrow form is
the faster (the JSON parse), ``native`` where the log has Spark's own reader (Parquet files, a
Kafka topic) for one whose Spark form is (an Avro payload's ``from_avro``) or that has none,
``bucketlog`` for one without an Arrow form on another log.

Batch waves (``job = "batch"``):

============  ======================  ============  ==========  =========  ===========  =====
batch_reader  log                     batch_writer  transform   reader     writer       count
============  ======================  ============  ==========  =========  ===========  =====
arrow         any                     (ignored)     Arrow form  arrow      arrow        [1]
arrow         any                     any           Spark only  ConfigError
native        Parquet files           native        any         native     native       [1]
native        Parquet files           python        any         bucketlog  python       no
native        Spark source (Kafka)    w             any         kafka      w            no
native        neither                 w             any         bucketlog  w            no
bucketlog     any                     w             any         bucketlog  w            no
============  ======================  ============  ==========  =========  ===========  =====

[1] the writer checks the wave's record count against its offsets only on a contiguous log
(Kafka's offsets have gaps: transaction markers, compaction). The transform runs in the
reader's Python workers (its Arrow form) on the ``arrow`` path, as its Spark form on the read
DataFrame on the others. ``kafka`` is Spark's own Kafka source reading each partition's range
of the wave (:func:`modeswitch.sources.spark_kafka.read_batch`).

Backfills (``job = "backfill"``) support fewer paths: their writer is always the staged
replace-where commit (``batch_writer`` is ignored), they have no Arrow waves, and they never
check a count (the window's event-time filter keeps fewer records than the ranges hold):

============  ======================  ==========  =========  ================================
batch_reader  log                     transform   reader     transform runs
============  ======================  ==========  =========  ================================
native        Parquet files           any         native     Spark form on the read DataFrame
native        Spark source (Kafka)    any         kafka      Spark form on the read DataFrame
any other     any                     Arrow form  bucketlog  Arrow form inside the reader
any other     any                     Spark only  bucketlog  Spark form on the read DataFrame
============  ======================  ==========  =========  ================================
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from modeswitch.control.settings import BATCH_READERS, BATCH_WRITERS
from modeswitch.errors import ConfigError

if TYPE_CHECKING:
    from modeswitch.sources.base import LogCapabilities
    from modeswitch.transforms import Transform

WaveReader = Literal["arrow", "native", "kafka", "bucketlog"]
"""``arrow``: the wave's Python tasks read their ranges with the log's own reader
(:mod:`modeswitch.sinks.arrow_wave`); ``native``: Spark's Parquet reader on the segment files
(:mod:`modeswitch.sources.native`); ``kafka``: Spark's Kafka source
(:mod:`modeswitch.sources.spark_kafka`); ``bucketlog``: the Python data source
(:mod:`modeswitch.sources.spark`)."""

WaveWriter = Literal["arrow", "native", "python", "replace_where"]
"""``arrow``: the same Python tasks write the files with pyarrow, the driver commits;
``native``: Spark's Parquet writer, then the sink's commit; ``python``: the
``modeswitch_delta`` data source writer; ``replace_where``: a backfill's staged Parquet and
its replace-where commits (:mod:`modeswitch.modes.backfill_job`)."""

TransformForm = Literal["spark", "arrow"]
"""Where the transform runs: ``arrow``, its Arrow form inside the reader's Python workers (the
wave's tasks, or the ``bucketlog`` reader's ``transform`` option); ``spark``, its Spark form
on the DataFrame read."""

WaveJob = Literal["batch", "backfill"]
"""Who asks: a batch epoch's waves, or a backfill's window."""


@dataclass(frozen=True)
class WavePath:
    """How a wave is read and written; see the module docstring."""

    reader: WaveReader
    writer: WaveWriter
    transform: TransformForm
    count_checked: bool
    """The writer refuses to commit unless it wrote exactly ``end - start`` records per
    split (``expectedRecords``): only on a contiguous log."""
    reason: str
    """Why this path, in a sentence naming the settings: for the job's log."""


def choose_wave_path(
    capabilities: LogCapabilities,
    *,
    batch_reader: str,
    batch_writer: str,
    transform: Transform,
    job: WaveJob = "batch",
    source: str = "",
) -> WavePath:
    """The path of a ``job``'s waves on a log with ``capabilities`` (the log, or its class:
    :func:`modeswitch.sources.log_type`), by the module docstring's tables.

    ``source`` (the setting's value) is only named in messages. Raises :class:`ConfigError`
    naming the settings and their values for an unknown reader or writer, and for
    ``batch_reader = arrow`` in a batch with a transform that has no Arrow form.
    """
    if batch_reader not in BATCH_READERS:
        raise ConfigError(
            f"batch_reader: {batch_reader!r} is not one of " + ", ".join(BATCH_READERS)
        )
    if batch_writer not in BATCH_WRITERS:
        raise ConfigError(
            f"batch_writer: {batch_writer!r} is not one of " + ", ".join(BATCH_WRITERS)
        )
    if batch_reader == "auto":
        chosen = auto_reader(capabilities, transform)
        found = choose_wave_path(
            capabilities,
            batch_reader=chosen,
            batch_writer=batch_writer,
            transform=transform,
            job=job,
            source=source,
        )
        faster = "no Arrow form" if transform.arrow is None else f"its {transform.faster} form"
        why = f"batch_reader='auto' chose {chosen!r} (transform {transform.name!r}: {faster})"
        return replace(found, reason=f"{why}; {found.reason}")
    on = f"source={source!r}" if source else "this source"
    native = batch_reader == "native" and capabilities.parquet_files
    no_files = (
        f"batch_reader='native' on a log without Parquet files ({on}) reads through bucketlog"
    )
    has_arrow = transform.arrow is not None
    if job == "backfill":
        if native:
            return WavePath("native", "replace_where", "spark", False, "backfill: native read")
        if batch_reader == "native" and capabilities.spark_source == "kafka":
            return WavePath(
                "kafka",
                "replace_where",
                "spark",
                False,
                f"backfill: batch_reader='native' on a Kafka topic ({on}): Spark's Kafka source",
            )
        why = no_files if batch_reader == "native" else "backfills read through bucketlog"
        if has_arrow:
            return WavePath(
                "bucketlog", "replace_where", "arrow", False, f"{why}; Arrow form in the reader"
            )
        return WavePath("bucketlog", "replace_where", "spark", False, f"{why}; Spark form")
    if batch_reader == "arrow":
        if not has_arrow:
            raise ConfigError(
                f"batch_reader: 'arrow' runs the transform's Arrow form, and transform="
                f"{transform.name!r} has none (modeswitch.transforms, 'An Arrow form'; a "
                "value_schema with a nested type is read by from_json alone); use 'native' or "
                "'bucketlog', or a transform with one"
            )
        return WavePath(
            "arrow", "arrow", "arrow", capabilities.contiguous, "batch_reader='arrow': Arrow waves"
        )
    if native and batch_writer == "native":
        return WavePath(
            "native",
            "native",
            "spark",
            capabilities.contiguous,
            "batch_reader='native', batch_writer='native': Spark's reader and writer",
        )
    writer: WaveWriter = "native" if batch_writer == "native" else "python"
    if batch_reader == "native" and capabilities.spark_source == "kafka":
        return WavePath(
            "kafka",
            writer,
            "spark",
            False,
            f"batch_reader='native' on a Kafka topic ({on}): Spark's Kafka source, "
            f"batch_writer={batch_writer!r}",
        )
    if batch_reader == "bucketlog":
        why = "batch_reader='bucketlog'"
    elif capabilities.parquet_files:
        why = "batch_reader='native' with batch_writer='python' reads through bucketlog"
    else:
        why = no_files
    return WavePath("bucketlog", writer, "spark", False, why)


def auto_reader(capabilities: LogCapabilities, transform: Transform) -> str:
    """The reader ``batch_reader = auto`` stands for (module docstring): the one that runs
    ``transform``'s faster form (:attr:`~modeswitch.transforms.Transform.faster`) on a log with
    ``capabilities``."""
    if transform.arrow is not None and transform.faster == "arrow":
        return "arrow"
    if capabilities.parquet_files or capabilities.spark_source == "kafka":
        return "native"
    return "arrow" if transform.arrow is not None else "bucketlog"


__all__ = [
    "TransformForm",
    "WaveJob",
    "WavePath",
    "WaveReader",
    "WaveWriter",
    "auto_reader",
    "choose_wave_path",
]
