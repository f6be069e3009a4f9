"""Offsets maps: per bucket, the next offset to read (Kafka style, exclusive ends).

In memory an offsets map is a ``dict[int, int]``. On the wire (JSON options, Spark streaming
offsets, Delta commit metadata) its keys are strings: ``{"0": 120, "1": 98}``. These helpers
convert between the two and refuse anything else with an error naming where it came from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from modeswitch.errors import InvalidOffsetsError

OffsetsMap = dict[int, int]


def _as_int(value: Any, *, what: str, source: str) -> int:
    # bool is an int subclass; "true" is never a valid bucket or offset.
    if isinstance(value, bool):
        raise InvalidOffsetsError(f"{source}: {what} {value!r} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value, 10)
        except ValueError:
            pass
    raise InvalidOffsetsError(f"{source}: {what} {value!r} is not an integer")


def offsets_from_dict(data: Any, *, source: str = "offsets") -> OffsetsMap:
    """Validate a wire-format mapping (string or int keys) and return ``{bucket: offset}``.

    ``source`` names where the map came from (an option name, a table) for error messages.
    """
    if not isinstance(data, Mapping):
        raise InvalidOffsetsError(
            f"{source}: expected a JSON object of bucket -> offset, got {data!r}"
        )
    result: OffsetsMap = {}
    for key, value in data.items():
        bucket = _as_int(key, what="bucket", source=source)
        offset = _as_int(value, what=f"offset of bucket {key}", source=source)
        if bucket < 0:
            raise InvalidOffsetsError(f"{source}: bucket {bucket} is negative")
        if offset < 0:
            raise InvalidOffsetsError(f"{source}: offset {offset} of bucket {bucket} is negative")
        result[bucket] = offset
    return dict(sorted(result.items()))


def offsets_from_json(text: str, *, source: str = "offsets") -> OffsetsMap:
    """Parse an offsets map from JSON such as ``{"0": 120, "1": 98}``."""
    try:
        data = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise InvalidOffsetsError(f"{source}: {text!r} is not valid JSON ({exc})") from exc
    return offsets_from_dict(data, source=source)


def offsets_to_dict(offsets: Mapping[int, int]) -> dict[str, int]:
    """Wire format: string keys in bucket order, as Spark and JSON need them."""
    return {str(bucket): int(offsets[bucket]) for bucket in sorted(offsets)}


def offsets_to_json(offsets: Mapping[int, int]) -> str:
    """Compact JSON with buckets in numeric order, stable for comparison and logs."""
    return json.dumps(offsets_to_dict(offsets), separators=(",", ":"))
