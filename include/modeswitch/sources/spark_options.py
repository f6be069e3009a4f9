"""The ``bucketlog`` data source's options (:mod:`modeswitch.sources.spark` documents them),
parsed and checked on the driver: :class:`BucketLogOptions`, the ``arrowForm`` option's
function (:func:`arrow_form_options` builds it, :func:`arrow_function` unpickles it in the
workers), and :func:`resolve_offsets`, which turns ``startingOffsets`` / ``endingOffsets`` into
checked offsets maps. Each error names the option and its value.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType

from modeswitch.errors import InvalidOffsetsError, OffsetOutOfRangeError, UnknownBucketError
from modeswitch.offsets import OffsetsMap, offsets_from_json
from modeswitch.sources.base import BucketedLog, check_range
from modeswitch.storage import absolute_location

DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000


@dataclass(frozen=True)
class BucketLogOptions:
    """The data source's options, parsed and checked on the driver."""

    path: str
    source: str
    starting: str | None
    ending: str | None
    max_records_per_partition: int
    max_records_per_trigger: int | None
    partitions: tuple[tuple[tuple[int, int, int], ...], ...] | None = None
    parallelism: int = 2
    arrow_form: str | None = None
    """``arrowForm``: the pickled function, base64 (:func:`arrow_form_options`)."""
    arrow_schema: str | None = None
    """``arrowSchema``: its output's Spark schema as JSON."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> BucketLogOptions:
        opts = {k.lower(): v for k, v in options.items()}
        path = opts.get("path") or opts.get("log")
        if not path:
            raise ValueError(
                "option path: the log's root is required (pass it to load() or .option('path'))"
            )
        from modeswitch.sources.kafka import is_kafka_source

        kafka = is_kafka_source(path)
        source = opts.get("source", "kafka" if kafka else "segments").lower()
        if source not in ("segments", "kafka"):
            raise ValueError(f"option source={source!r}: expected 'segments' or 'kafka'")
        if (source == "kafka") != kafka:
            raise ValueError(
                f"option source={source!r}: does not match path {path!r} (a Kafka log's path "
                "is kafka://<topic>)"
            )
        return cls(
            path=absolute_location(path),
            source=source,
            starting=opts.get("startingoffsets"),
            ending=opts.get("endingoffsets"),
            max_records_per_partition=_positive_int(
                opts, "maxRecordsPerPartition", DEFAULT_MAX_RECORDS_PER_PARTITION
            ),
            max_records_per_trigger=_positive_int(opts, "maxRecordsPerTrigger", None),
            partitions=_partitions_option(opts.get("partitions")),
            parallelism=_positive_int(opts, "numPartitions", None) or os.cpu_count() or 2,
            **_arrow_form_option(opts.get("arrowform"), opts.get("arrowschema")),
        )

    def open_log(self) -> BucketedLog:
        from modeswitch.sources import open_log

        return open_log(self.path)


def arrow_form_options(function: Any, schema: StructType) -> dict[str, str]:
    """The reader's ``arrowForm`` and ``arrowSchema`` options that run ``function`` (from the
    records' Arrow batches to the output's, picklable) inside the reader, its output of Spark
    schema ``schema``."""
    from pyspark import cloudpickle

    return {
        "arrowForm": base64.b64encode(cloudpickle.dumps(function)).decode("ascii"),
        "arrowSchema": schema.json(),
    }


def _arrow_form_option(encoded: str | None, schema: str | None) -> dict[str, str | None]:
    """The ``arrowForm`` and ``arrowSchema`` options, checked on the driver: both or neither,
    the function one that unpickles to a callable, the schema a Spark struct's JSON."""
    if (encoded is None) != (schema is None):
        given, missing = (
            ("arrowForm", "arrowSchema") if schema is None else ("arrowSchema", "arrowForm")
        )
        raise ValueError(f"option {given}: needs {missing} too (arrow_form_options gives both)")
    if encoded is None:
        return {}
    if not callable(arrow_function(encoded)):
        raise ValueError("option arrowForm: does not hold a function")
    try:
        StructType.fromJson(json.loads(schema))
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(
            f"option arrowSchema={schema[:200]!r}: not a Spark schema ({exc})"
        ) from exc
    return {"arrow_form": encoded, "arrow_schema": schema}


_ARROW_FUNCTIONS: dict[str, Any] = {}


def arrow_function(encoded: str) -> Any:
    """The function an ``arrowForm`` option holds, unpickled once per process."""
    function = _ARROW_FUNCTIONS.get(encoded)
    if function is None:
        try:
            function = pickle.loads(base64.b64decode(encoded, validate=True))
        except Exception as exc:  # any unpickling failure: the option is what is wrong
            raise ValueError(
                f"option arrowForm={encoded[:40]!r}...: not a pickled function ({exc!r})"
            ) from exc
        _ARROW_FUNCTIONS[encoded] = function
    return function


def _partitions_option(raw: str | None) -> tuple | None:
    if raw is None:
        return None
    problem = f"option partitions={raw[:200]!r}: expected a JSON list of partitions, each a "
    problem += "list of [bucket, start, end] ranges"
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{problem} ({exc})") from exc
    try:
        parts = tuple(
            tuple((int(b), int(lo), int(hi)) for b, lo, hi in partition) for partition in data
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(problem) from exc
    for partition in parts:
        for bucket, lo, hi in partition:
            if lo > hi or lo < 0:
                raise ValueError(f"{problem}: range [{lo}, {hi}) of bucket {bucket} is invalid")
    return parts


def _positive_int(opts: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"option {name}={raw!r}: expected a positive integer")
    return value


def resolve_offsets(
    option: str,
    value: str | None,
    *,
    default: str,
    earliest: Mapping[int, int],
    latest: Mapping[int, int],
    fill: Mapping[int, int],
) -> OffsetsMap:
    """Turn ``earliest`` / ``latest`` / a JSON map into a full, checked offsets map.

    Buckets missing from a JSON map take their offset from ``fill``. Raises ValueError
    naming the option and its value for malformed JSON, unknown buckets, offsets below
    retention or beyond the latest offset.
    """
    text = (value if value is not None else default).strip()
    if text.lower() == "earliest":
        return dict(earliest)
    if text.lower() == "latest":
        return dict(latest)
    try:
        given = offsets_from_json(text, source=f"option {option}={text!r}")
    except InvalidOffsetsError as exc:
        raise InvalidOffsetsError(
            f"{exc}; expected 'earliest', 'latest' or a JSON object of bucket -> offset "
            'such as {"0": 120, "1": 98}'
        ) from exc
    resolved = dict(fill)
    for bucket, offset in given.items():
        try:
            check_range(bucket, offset, offset, earliest=earliest, latest=latest, what="")
        except (UnknownBucketError, OffsetOutOfRangeError) as exc:
            raise type(exc)(f"option {option}={text!r}: {exc}") from exc
        resolved[bucket] = offset
    return resolved


__all__ = [
    "DEFAULT_MAX_RECORDS_PER_PARTITION",
    "BucketLogOptions",
    "arrow_form_options",
    "arrow_function",
    "resolve_offsets",
]
