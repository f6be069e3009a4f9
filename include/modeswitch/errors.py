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
    """A setting has a bad value; the message names the setting and the value. ``setting`` is
    the setting's name when the error is about one (how a layered lookup tells which layer
    gave the bad value), else None."""

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class InvalidTimestampError(ModeswitchError, ValueError):
    """A timestamp is not a datetime or is naive; policy inputs must be timezone-aware (UTC)."""


class FencedError(ModeswitchError):
    """A commit from an ended epoch (a zombie) or out of order was refused by the sink."""


class SchemaMismatchError(ModeswitchError, ValueError):
    """Written columns differ from the table's: new columns without mergeSchema, or a type
    change. The message names the columns."""


class SchemaChangedError(ModeswitchError):
    """A value is written with a version of its schema registered after the job began, and
    ``on_schema_change = fail``: the job stops, having committed nothing of the wave or
    micro-batch that holds it. The message names the subject, the versions and the record."""


class UnknownSchemaIdError(ModeswitchError):
    """A registry-framed value names a schema id the job did not know when it began (raised in
    a Spark task, by either form of the decode): the job stops before committing anything of
    that wave or micro-batch, and the driver asks the registry what the id is
    (:func:`modeswitch.transforms.schema_ids.learn_schema_id`). The message names the id, the
    subject, the record and the version the job reads as."""


class OffsetsContinuityError(ModeswitchError):
    """A commit's offsets do not continue where the sink's last commit ended (a gap, an
    overlap, or offsets going backwards without a recorded rewind)."""


class InvalidStateInputError(ModeswitchError, ValueError):
    """A value given to the control state (a mode, a status, a command, a split) is refused."""


class StateRecordNotFoundError(ModeswitchError, LookupError):
    """An epoch, split or command that the control tables do not hold."""


class InvalidStateTransitionError(ModeswitchError):
    """A status change the control state does not allow (e.g. reopening a closed epoch)."""


class EpochStillOpenError(InvalidStateTransitionError):
    """A new epoch was refused because another one is still running: the pipeline's fencing."""


class StateConflictError(ModeswitchError):
    """A control-table write lost to concurrent writers on every one of its attempts."""


class RewindRefusedError(ModeswitchError, ValueError):
    """A rewind command that cannot be applied (an unknown bucket, an offset above the
    committed offset or below the source's retention); nothing was written."""


class BackfillRefusedError(ModeswitchError, ValueError):
    """A backfill run that cannot go ahead (a window in the future or beyond retention, a
    pipeline that does not exist, another run holding an overlapping window); nothing was
    written."""


class MaintenanceRefusedError(ModeswitchError):
    """A maintenance run that cannot start: another run of the pipeline holds the lease."""


class StreamQueryError(ModeswitchError):
    """A stream epoch's Structured Streaming query stopped or failed; the message names the
    epoch, and the query's own exception is chained as the cause."""


class SourceUnavailableError(ModeswitchError):
    """The source log did not answer (a Kafka broker down or restarting); the message names
    it. A stream rides it out for ``source_outage_grace``; a job fails with it."""


class TopicNotFoundError(ModeswitchError, LookupError):
    """The Kafka broker answered, and the pipeline's topic is not there (not created yet, or
    deleted); the message names the topic and the topics the broker has."""


class SinkLogCleanedError(ModeswitchError):
    """The sink's log no longer holds the pipeline's newest commit (a writer outside the
    pipeline cleaned it up): its committed offsets are unknown, and guessing would lose or
    repeat records."""


class StorageWriteError(ModeswitchError, OSError):
    """Writing a table's data file failed (no space left on the device, a read-only
    filesystem, ...): the message names the file and the cause. Nothing of it was committed."""
