"""Spark's offsets log in a stream's checkpoint: the end offsets of each micro-batch, which
the stream sink's commits cover and a rerun stream is checked against
(:mod:`modeswitch.sinks.delta`, :mod:`modeswitch.modes.resume`)."""

from __future__ import annotations

import json

from modeswitch.errors import ModeswitchError
from modeswitch.offsets import OffsetsMap, offsets_from_dict, offsets_from_json
from modeswitch.storage import filesystem


def offsets_log_entry(checkpoint: str, batch_id: int) -> OffsetsMap | None:
    """The end offsets Spark's offsets log records for micro-batch ``batch_id`` of the stream
    whose checkpoint is at ``checkpoint`` (None if there is no such entry).

    Spark writes ``<checkpoint>/offsets/<id>`` before it runs a micro-batch: a version line,
    a line of metadata, then one line of end offsets per source. The exactly-once sink
    supports one source: the ``bucketlog`` stream, whose offsets are an offsets map, or Spark's
    Kafka source reading one topic, whose offsets are ``{"<topic>": {"<partition>": offset}}``
    (:mod:`modeswitch.sources.spark_kafka`).
    """
    fs, root = filesystem(checkpoint)
    path = f"{root}/offsets/{batch_id}"
    try:
        with fs.open_input_stream(path) as src:
            lines = src.read().decode().splitlines()
    except FileNotFoundError:
        return None
    sources = [line for line in lines[2:] if line.strip()]
    if len(sources) != 1:
        raise ModeswitchError(
            f"sink: {path} lists {len(sources)} sources; the exactly-once sink supports "
            "queries with exactly one bucketlog source"
        )
    return _source_offsets(sources[0], path)


def _source_offsets(line: str, path: str) -> OffsetsMap:
    """A source's line of the offsets log: an offsets map, or a Kafka source's
    ``{"<topic>": {"<partition>": offset}}`` of one topic."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        return offsets_from_json(line, source=path)  # names the file and the problem
    if isinstance(data, dict) and data and all(isinstance(v, dict) for v in data.values()):
        if len(data) != 1:
            raise ModeswitchError(
                f"sink: {path} holds offsets of topics {sorted(data)}; the exactly-once sink "
                "supports a Kafka source reading one topic"
            )
        [data] = data.values()
    return offsets_from_dict(data, source=path)
