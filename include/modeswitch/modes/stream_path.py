"""The stream seam: how a stream epoch's query (and the warm-up's) reads, transforms and writes,
chosen once.

:func:`choose_stream_path` is a pure function (no Spark, no I/O) of what the log can do (its
:class:`~modeswitch.sources.base.LogCapabilities`), whether the transform has an Arrow form and
the ``stream_writer`` setting. :func:`modeswitch.modes.stream.sink_stream` does what the
:class:`StreamPath` says, for the epoch's query and for the warm-up's.

=============  ==========  =============  =========  ===============  ==========================
spark_source   transform   stream_writer  reader     transform runs   writer
=============  ==========  =============  =========  ===============  ==========================
any            Arrow form  auto, arrow    the log's  wave             arrow
any            Spark only  arrow          ConfigError
kafka          any         w              kafka      spark            w
kafka          Spark only  auto           kafka      spark            python
bucketlog      Arrow form  w              bucketlog  arrow            w
bucketlog      Spark only  w              bucketlog  spark            w
bucketlog      Spark only  auto           bucketlog  spark            python
=============  ==========  =============  =========  ===============  ==========================

(``w``: ``python`` or ``delta_spark``.) ``arrow`` commits each micro-batch as an Arrow wave
(:mod:`modeswitch.modes.stream_waves`): the query's reader (``kafka`` or ``bucketlog``) only
gives Spark the micro-batch's offsets, and the log's own reader, the transform's Arrow form and
the sink's pyarrow writer do the rest, in the driver for a small micro-batch, in Spark tasks
for a large one (``wave``). ``kafka`` is Spark's own Kafka source
(:func:`modeswitch.sources.spark_kafka.read_stream`), whose rows reach Python only for the
transform's Spark form; ``bucketlog`` is the Python data source (:mod:`modeswitch.sources.spark`),
which runs a transform's Arrow form where it reads (``arrow``: the rows reach the JVM parsed,
with no second trip to Python). The other writers: ``python``, the ``modeswitch_delta`` sink,
and ``delta_spark``, Delta's own writer in ``foreachBatch`` (:mod:`modeswitch.sinks.delta_spark`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from modeswitch.control.settings import STREAM_WRITERS
from modeswitch.errors import ConfigError

if TYPE_CHECKING:
    from modeswitch.sources.base import LogCapabilities

StreamReader = Literal["kafka", "bucketlog"]
"""``kafka``: Spark's Kafka source; ``bucketlog``: the Python data source."""

StreamTransform = Literal["spark", "arrow", "wave"]
"""``arrow``: the transform's Arrow form inside the ``bucketlog`` reader; ``spark``: its Spark
form on the DataFrame read; ``wave``: its Arrow form in the micro-batch's wave (the query's
DataFrame is not read)."""

StreamWriter = Literal["arrow", "python", "delta_spark"]
"""The ``stream_writer`` setting's values (module docstring)."""


@dataclass(frozen=True)
class StreamPath:
    """How a stream query reads, transforms and writes; see the module docstring."""

    reader: StreamReader
    transform: StreamTransform
    writer: StreamWriter
    reason: str
    """Why this path, in a sentence naming the settings: for the job's log."""


def choose_stream_path(
    capabilities: LogCapabilities, *, arrow_form: bool, stream_writer: str
) -> StreamPath:
    """The path of a stream on a log with ``capabilities`` (a log or its class:
    :func:`modeswitch.sources.log_type`), for a transform with (``arrow_form``) or without an
    Arrow form, written by ``stream_writer``: the module docstring's table. Raises
    :class:`ConfigError` naming the setting for an unknown ``stream_writer``."""
    if stream_writer not in STREAM_WRITERS:
        raise ConfigError(
            f"stream_writer: {stream_writer!r} is not one of {', '.join(STREAM_WRITERS)}",
            setting="stream_writer",
        )
    written = f"stream_writer={stream_writer!r}"
    if stream_writer in ("auto", "arrow") and arrow_form:
        return StreamPath(
            capabilities.spark_source,
            "wave",
            "arrow",
            f"{written}: each micro-batch an Arrow wave, the {capabilities.spark_source} "
            "source giving its offsets",
        )
    if stream_writer == "arrow":
        raise ConfigError(
            "stream_writer: 'arrow' needs a transform with an Arrow form; this one has only a "
            "Spark form (use auto, python or delta_spark)",
            setting="stream_writer",
        )
    writer: StreamWriter = "delta_spark" if stream_writer == "delta_spark" else "python"
    if capabilities.spark_source == "kafka":
        return StreamPath(
            "kafka", "spark", writer, f"a Kafka topic: Spark's Kafka source, Spark form; {written}"
        )
    if arrow_form:
        return StreamPath(
            "bucketlog", "arrow", writer, f"bucketlog, the Arrow form in its reader; {written}"
        )
    return StreamPath(
        "bucketlog", "spark", writer, f"bucketlog, a transform with a Spark form only; {written}"
    )


__all__ = ["StreamPath", "StreamReader", "StreamTransform", "StreamWriter", "choose_stream_path"]
