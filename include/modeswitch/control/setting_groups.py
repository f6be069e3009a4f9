"""The setting groups a :class:`~modeswitch.control.settings.PipelineSettings` holds: the
switching policy's thresholds (:class:`PolicySettings`), the batch planner's sizes
(:class:`PlannerSettings`) and ``modeswitch maintain``'s (:class:`MaintenanceSettings`).

Each is declared like the pipeline's own settings (:func:`~modeswitch.control.values.setting`
at each field) and read from the same flat layers; a group alone is what a pure function of
its part takes (:func:`~modeswitch.control.policy.decide_mode`,
:mod:`modeswitch.control.planning`, :mod:`modeswitch.ops.maintenance`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import ClassVar, Literal

from modeswitch.control.flat_settings import FlatSettings
from modeswitch.control.values import (
    at_least,
    check_settings,
    greater_than_zero,
    not_negative,
    parse_choice,
    parse_duration,
    parse_positive_int,
    parse_threshold_count,
    parse_threshold_duration,
    setting,
    threshold_above_zero,
)
from modeswitch.errors import ConfigError

# --- planner settings ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PlannerSettings(FlatSettings):
    """How a batch epoch's backlog is cut into splits (one read task's range in one bucket)
    and waves (the splits committed together in one sink commit).

    The constructor validates (:func:`~modeswitch.control.values.check_settings`): every value
    a whole number > 0, else :class:`ConfigError` naming the setting and the value. Strings
    are accepted only through :meth:`from_mapping`.
    """

    settings_kind: ClassVar[str] = "planner"

    max_split_records: int = setting(
        1_000_000, parse=parse_positive_int, rule=greater_than_zero, doc="maximum split size"
    )
    # The "large checkpoint interval" of backlog mode (FLIP-309).
    wave_records: int = setting(
        10_000_000,
        parse=parse_positive_int,
        rule=greater_than_zero,
        doc="batch wave size (records per sink commit)",
    )
    # The default deployment is local[*] on 2 cores.
    parallelism: int = setting(
        2,
        parse=parse_positive_int,
        rule=greater_than_zero,
        doc="read tasks at once; each wave has at most this many partitions",
    )

    def __post_init__(self) -> None:
        check_settings(self)


# --- maintenance settings --------------------------------------------------------------------

MIN_VACUUM_RETENTION = timedelta(hours=1)
"""Vacuum never deletes files younger than this, whatever the setting: a reader that opened
the table's previous version (a dashboard query, a batch job's wave) must still find them."""
MIN_LOG_RETENTION = timedelta(minutes=10)
"""Log files are kept at least this long: a writer's conflict check and a reader opening the
previous version read them, and maintenance summarises them first."""


@dataclass(frozen=True, kw_only=True)
class MaintenanceSettings(FlatSettings):
    """What ``modeswitch maintain`` (:mod:`modeswitch.ops.maintenance`) does to the tables."""

    settings_kind: ClassVar[str] = "maintenance"

    # delta-rs ``optimize.compact``'s ``target_size``.
    compact_target_mb: int = setting(
        128,
        parse=parse_positive_int,
        rule=greater_than_zero,
        doc="maintenance: the size compaction aims at for the sink's and quarantine's files",
    )
    # A stream leaves one tombstone per micro-batch, 36 000 an hour at 100 ms, and every
    # checkpoint carries them. Delta's own default is 7 days; the default matches
    # log_retention, the reach of time travel anyway.
    vacuum_retention: timedelta = setting(
        timedelta(hours=2),
        parse=parse_duration,
        rule=at_least(
            MIN_VACUUM_RETENTION,
            f"is less than {MIN_VACUUM_RETENTION}: a reader of the previous version could lose "
            "its files",
        ),
        doc="maintenance: files compaction or a rewind removed are deleted once this old (at "
        "least `1h`); twice it is the tables' `delta.deletedFileRetentionDuration`, which "
        "bounds the tombstones every reader loads",
    )
    # Every commit of a delta-rs writer on a local or network filesystem lists the whole
    # _delta_log folder: a sink append took 6 ms beside 6 log files and 110 ms beside 16 800
    # (bench/bench_soak.py), so the log a stream keeps (this retention times its commit rate)
    # is what each micro-batch's commit pays for; Delta's default of 30 days would stall a
    # stream within hours. It must exceed the time between maintenance runs, which summarise
    # the log before the writers' own checkpoints clean it (the audit reports commits no
    # summary covers).
    log_retention: timedelta | None = setting(
        timedelta(hours=2),
        parse=parse_threshold_duration,
        rule=at_least(
            MIN_LOG_RETENTION,
            f"must be a duration of at least {MIN_LOG_RETENTION} (or none): maintenance must "
            "summarise the log first",
        ),
        doc="maintenance: every table's `delta.logRetentionDuration` (at least `10m`; `none`: "
        "leave the tables' own); time travel reaches back this far; each commit lists the log "
        "it keeps, so a fast stream wants it short",
    )
    progress_horizon: timedelta = setting(
        timedelta(days=7),
        parse=parse_duration,
        rule=greater_than_zero,
        doc="maintenance: `progress` rows older than this are merged, one per epoch and hour "
        "(keeping the offsets, counts and max event times)",
    )
    maintenance_lease: timedelta = setting(
        timedelta(hours=1),
        parse=parse_duration,
        rule=greater_than_zero,
        doc="maintenance: how long a run holds the pipeline's lease at most (a second run is "
        "refused meanwhile; a lease left by a run that died is taken over)",
    )

    def __post_init__(self) -> None:
        check_settings(self)


# --- policy settings -------------------------------------------------------------------------

OffsetLagMeasure = Literal["total", "max_bucket"]


@dataclass(frozen=True, kw_only=True)
class PolicySettings(FlatSettings):
    """Thresholds of the backlog strategies and of the hysteresis around them.

    Strategies (FLIP-328), OR-combined; a threshold of ``None`` turns its strategy off:
    ``watermark_lag_threshold``, ``offset_lag_threshold`` (with ``offset_lag_measure``).
    ``idle_timeout`` and ``allowed_lateness`` shape the watermark they read.

    Hysteresis (beyond FLIP-328, which never switches back); lag here is watermark lag:
    stream -> batch only once the backlog signal, with lag above ``enter_threshold``, has held
    for ``enter_dwell``; batch -> stream only once the backlog is drained and lag is at most
    ``exit_threshold``, which must be <= ``enter_threshold`` (``None`` for either drops the lag
    condition); no switch out of a mode sooner than ``min_time_in_stream`` /
    ``min_time_in_batch``.

    The constructor validates: thresholds ``None`` or > 0, durations >= 0, exit <= enter,
    else :class:`ConfigError` naming the setting and the value. Strings (``30s``, ``5m``,
    ``PT5M``, ``none``) are accepted through :meth:`from_mapping`.
    """

    settings_kind: ClassVar[str] = "policy"

    watermark_lag_threshold: timedelta | None = setting(
        timedelta(minutes=5),
        parse=parse_threshold_duration,
        rule=threshold_above_zero,
        doc="backlog while watermark lag (now - watermark) exceeds it",
    )
    offset_lag_threshold: int | None = setting(
        None,
        parse=parse_threshold_count,
        rule=threshold_above_zero,
        doc="backlog while records behind the latest offsets exceed it",
    )
    offset_lag_measure: OffsetLagMeasure = setting(
        "total",
        parse=parse_choice,
        doc="records behind in `total`, or in the worst bucket (`max_bucket`)",
    )
    enter_threshold: timedelta | None = setting(
        timedelta(minutes=5),
        parse=parse_threshold_duration,
        rule=threshold_above_zero,
        doc="stream → batch once lag is above it ...",
    )
    enter_dwell: timedelta = setting(
        timedelta(minutes=1),
        parse=parse_duration,
        rule=not_negative,
        doc="... for this long (dwell)",
    )
    exit_threshold: timedelta | None = setting(
        timedelta(seconds=30),
        parse=parse_threshold_duration,
        rule=threshold_above_zero,
        doc="batch → stream once drained and lag is at most this (at most `enter_threshold`)",
    )
    min_time_in_stream: timedelta = setting(
        timedelta(minutes=5),
        parse=parse_duration,
        rule=not_negative,
        doc="minimum time in stream mode",
    )
    min_time_in_batch: timedelta = setting(
        timedelta(0), parse=parse_duration, rule=not_negative, doc="minimum time in batch mode"
    )
    allowed_lateness: timedelta = setting(
        timedelta(0), parse=parse_duration, rule=not_negative, doc="subtracted from the watermark"
    )
    idle_timeout: timedelta | None = setting(
        timedelta(minutes=1),
        parse=parse_threshold_duration,
        rule=threshold_above_zero,
        doc="a quiet, drained bucket stops holding the watermark back after this long (`none`: "
        "no bucket is ever idle)",
    )

    def __post_init__(self) -> None:
        check_settings(self)
        enter, exit_ = self.enter_threshold, self.exit_threshold
        if enter is not None and exit_ is not None and exit_ > enter:
            raise ConfigError(
                f"exit_threshold: {exit_} must be at most enter_threshold ({enter}), "
                "otherwise the pipeline would switch back and forth",
                setting="exit_threshold",
            )
