"""The package's exceptions, in one place.

Every error names the thing it is about (an option, a bucket, a path) and the bad value, so
that an operator reading an Airflow log knows what to change.
"""

from __future__ import annotations


class ModeswitchError(Exception):
    """Base of every error raised on purpose by modeswitch."""


class InvalidOffsetsError(ModeswitchError, ValueError):
    """An offsets map (JSON or dict) is malformed: not an object, a non-integer key or value."""


class UnknownBucketError(ModeswitchError, ValueError):
    """A bucket id that the source log does not have."""


class OffsetOutOfRangeError(ModeswitchError, ValueError):
    """A requested offset lies below retention or beyond the latest offset of its bucket."""


class SegmentConflictError(ModeswitchError):
    """Another appender published a segment at the same offset of the same bucket first."""


class ConfigError(ModeswitchError, ValueError):
    """A setting has a bad value; the message names the setting and the value."""
