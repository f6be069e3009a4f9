"""Settings, validated in one place (hence one module past 600 lines).

Layering (code defaults < config file < Airflow Variables < run params) builds on the value
parsers of :mod:`modeswitch.control.values`. Every parser takes the setting's name so that its
error names the setting and the bad value.

STYLE.md asks for settings validated in one place: every setting's default, layer and
cross-field rule is here, in four groups (pipeline, policy, planner, maintenance). Not
pydantic-settings (installed with Airflow): its sources (environment, files) are not our
layers (Airflow Variables, one per setting, and a run's param); its errors name a field path
and a pydantic error type where ours name the Airflow Variable or the param and the bad
value; and durations (``250ms``, ``PT5M``), ``none`` thresholds and cross-field rules (enter
above exit) would still be our own validators.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any, Literal

from modeswitch.control.locations import KafkaLocation, is_kafka_source
from modeswitch.control.value_schema import parse_value_schema
from modeswitch.control.values import (
    MIN_DRIVER_MEMORY,
    _refuse_unknown,
    parse_bool,
    parse_duration,
    parse_fraction,
    parse_jvm_memory,
    parse_positive_int,
    parse_rate,
    parse_threshold_count,
    parse_threshold_duration,
)
from modeswitch.errors import ConfigError

__all__ = [
    "MIN_DRIVER_MEMORY",
    "SCHEMA_TRANSFORM",
    "MaintenanceSettings",
    "PipelineSettings",
    "PlannerSettings",
    "PolicySettings",
    "layer_settings",
    "load_job_settings",
    "parse_bool",
    "parse_duration",
    "parse_fraction",
    "parse_jvm_memory",
    "parse_positive_int",
    "parse_rate",
    "parse_threshold_count",
    "parse_threshold_duration",
    "read_settings_file",
    "setting_origins",
]

# --- planner settings ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PlannerSettings:
    """How a batch epoch's backlog is cut into splits and waves.

    - ``max_split_records``: no split (one read task's range in one bucket) is larger.
    - ``wave_records``: no wave (the splits committed together in one sink commit) is larger;
      the "large checkpoint interval" of backlog mode (FLIP-309).
    - ``parallelism``: read tasks that run at once; each wave has at most this many partitions.

    The constructor validates: every value a whole number > 0, else :class:`ConfigError`
    naming the setting and the value. Strings are accepted only through :meth:`from_mapping`.
    """

    max_split_records: int = 1_000_000
    wave_records: int = 10_000_000
    parallelism: int = 2  # the default deployment is local[*] on 2 cores

    def __post_init__(self) -> None:
        for name in ("max_split_records", "wave_records", "parallelism"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name}: {value!r} is not a whole number", setting=name)
            if value <= 0:
                raise ConfigError(f"{name}: {value!r} must be greater than 0", setting=name)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> PlannerSettings:
        """Settings from raw values (strings as Airflow Variables hold them); defaults fill
        the gaps; an unknown name is refused, naming it."""
        _refuse_unknown(raw, (f.name for f in fields(cls)), what="planner")
        return cls(**{name: parse_positive_int(value, setting=name) for name, value in raw.items()})


# --- maintenance settings --------------------------------------------------------------------

MIN_VACUUM_RETENTION = timedelta(hours=1)
"""Vacuum never deletes files younger than this, whatever the setting: a reader that opened
the table's previous version (a dashboard query, a batch job's wave) must still find them."""
MIN_LOG_RETENTION = timedelta(minutes=10)
"""Log files are kept at least this long: a writer's conflict check and a reader opening the
previous version read them, and maintenance summarises them first."""


@dataclass(frozen=True, kw_only=True)
class MaintenanceSettings:
    """What ``modeswitch maintain`` (:mod:`modeswitch.ops.maintenance`) does to the tables.

    - ``compact_target_mb`` (128): the file size compaction aims at (delta-rs
      ``optimize.compact``'s ``target_size``).
    - ``vacuum_retention`` (``2h``; at least ``1h``): files a compaction or a rewind removed
      are deleted once they are this old; twice it is the tables'
      ``delta.deletedFileRetentionDuration``, how long every checkpoint carries a tombstone
      for each removed file, so it bounds what each reader of the sink loads: a stream leaves
      one tombstone per micro-batch, 36 000 an hour at 100 ms. Delta's own default is 7 days;
      the default matches ``log_retention``, the reach of time travel anyway.
    - ``log_retention`` (``2h``; at least ``10m``; ``none``: leave the tables' own): the
      sink's, quarantine's and control tables' ``delta.logRetentionDuration``, set by
      maintenance; time travel reaches back this far. Every commit of a delta-rs writer on a
      local or network filesystem lists the whole ``_delta_log`` folder: a sink append took
      6 ms beside 6 log files and 110 ms beside 16 800 (``bench/bench_soak.py``), so the log
      a stream keeps (this retention times its commit rate) is what each micro-batch's
      commit pays for. Delta's default of 30 days would stall a stream within hours. It must
      exceed the time between maintenance runs, which summarise the log before the writers'
      own checkpoints clean it (the audit reports commits no summary covers).
    - ``progress_horizon`` (``7d``): ``progress`` rows older than this are merged, one row
      per epoch and hour, keeping the offsets, counts and max event times.
    - ``maintenance_lease`` (``1h``): a run holds the pipeline's maintenance lease this long
      at most; a second run is refused while it holds it, and takes over a lease left by a
      run that died.
    """

    compact_target_mb: int = 128
    vacuum_retention: timedelta = timedelta(hours=2)
    log_retention: timedelta | None = timedelta(hours=2)
    progress_horizon: timedelta = timedelta(days=7)
    maintenance_lease: timedelta = timedelta(hours=1)

    def __post_init__(self) -> None:
        value = self.compact_target_mb
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(
                f"compact_target_mb: {value!r} must be a whole number > 0",
                setting="compact_target_mb",
            )
        for name in ("vacuum_retention", "progress_horizon", "maintenance_lease"):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise ConfigError(
                    f"{name}: {value!r} must be a duration greater than 0", setting=name
                )
        retention = self.log_retention
        if retention is not None and (
            not isinstance(retention, timedelta) or retention < MIN_LOG_RETENTION
        ):
            raise ConfigError(
                f"log_retention: {retention!r} must be a duration of at least "
                f"{MIN_LOG_RETENTION} (or none): maintenance must summarise the log first",
                setting="log_retention",
            )
        if self.vacuum_retention < MIN_VACUUM_RETENTION:
            raise ConfigError(
                f"vacuum_retention: {self.vacuum_retention} is less than "
                f"{MIN_VACUUM_RETENTION}: a reader of the previous version could lose its files",
                setting="vacuum_retention",
            )

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> MaintenanceSettings:
        """Settings from raw values; defaults fill the gaps; an unknown name is refused."""
        _refuse_unknown(raw, (f.name for f in fields(cls)), what="maintenance")
        return cls(
            **{
                name: parse_positive_int(value, setting=name)
                if name == "compact_target_mb"
                else parse_threshold_duration(value, setting=name)
                if name == "log_retention"
                else parse_duration(value, setting=name)
                for name, value in raw.items()
            }
        )


# --- policy settings -------------------------------------------------------------------------

OffsetLagMeasure = Literal["total", "max_bucket"]
_OFFSET_LAG_MEASURES: tuple[str, ...] = ("total", "max_bucket")
_DURATION_THRESHOLDS = ("watermark_lag_threshold", "enter_threshold", "exit_threshold")
_DURATIONS = ("allowed_lateness", "enter_dwell", "min_time_in_stream", "min_time_in_batch")


@dataclass(frozen=True, kw_only=True)
class PolicySettings:
    """Thresholds of the backlog strategies and of the hysteresis around them.

    Strategies (FLIP-328), OR-combined; a threshold of ``None`` turns its strategy off:

    - ``watermark_lag_threshold``: backlog while now - watermark exceeds it.
    - ``offset_lag_threshold`` (records) with ``offset_lag_measure``: backlog while the records
      behind the latest offsets, in total or in the worst bucket, exceed it.
    - ``idle_timeout``: a bucket with nothing to read and no new data for this long does not
      hold the watermark back (``None``: no bucket is ever idle).
    - ``allowed_lateness``: subtracted from the event-time watermark.

    Hysteresis (beyond FLIP-328, which never switches back); lag here is watermark lag:

    - ``enter_threshold``, ``enter_dwell``: stream -> batch only once the backlog signal, with
      lag above ``enter_threshold``, has held for ``enter_dwell``.
    - ``exit_threshold``: batch -> stream only once the backlog is drained and lag is at most
      this; must be <= ``enter_threshold``. ``None`` for either drops the lag condition.
    - ``min_time_in_stream``, ``min_time_in_batch``: no switch out of a mode sooner.

    The constructor validates: thresholds ``None`` or > 0, durations >= 0, exit <= enter,
    else :class:`ConfigError` naming the setting and the value. Strings (``30s``, ``5m``,
    ``PT5M``, ``none``) are accepted through :meth:`from_mapping`.
    """

    watermark_lag_threshold: timedelta | None = timedelta(minutes=5)
    offset_lag_threshold: int | None = None
    offset_lag_measure: OffsetLagMeasure = "total"
    idle_timeout: timedelta | None = timedelta(minutes=1)
    allowed_lateness: timedelta = timedelta(0)
    enter_threshold: timedelta | None = timedelta(minutes=5)
    exit_threshold: timedelta | None = timedelta(seconds=30)
    enter_dwell: timedelta = timedelta(minutes=1)
    min_time_in_stream: timedelta = timedelta(minutes=5)
    min_time_in_batch: timedelta = timedelta(0)

    def __post_init__(self) -> None:
        for name in (*_DURATION_THRESHOLDS, "idle_timeout"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, timedelta):
                raise ConfigError(
                    f"{name}: {value!r} is not a duration (timedelta) or None", setting=name
                )
            if value <= timedelta(0):
                raise ConfigError(
                    f"{name}: {value!r} must be greater than 0 (use None to turn it off)",
                    setting=name,
                )
        for name in _DURATIONS:
            value = getattr(self, name)
            if not isinstance(value, timedelta):
                raise ConfigError(f"{name}: {value!r} is not a duration (timedelta)", setting=name)
            if value < timedelta(0):
                raise ConfigError(f"{name}: {value!r} is negative", setting=name)
        threshold = self.offset_lag_threshold
        if threshold is not None:
            if isinstance(threshold, bool) or not isinstance(threshold, int):
                raise ConfigError(
                    f"offset_lag_threshold: {threshold!r} is not a whole number",
                    setting="offset_lag_threshold",
                )
            if threshold <= 0:
                raise ConfigError(
                    f"offset_lag_threshold: {threshold!r} must be greater than 0 "
                    "(use None to turn it off)",
                    setting="offset_lag_threshold",
                )
        if self.offset_lag_measure not in _OFFSET_LAG_MEASURES:
            raise ConfigError(
                f"offset_lag_measure: {self.offset_lag_measure!r} is not one of "
                f"{', '.join(_OFFSET_LAG_MEASURES)}",
                setting="offset_lag_measure",
            )
        enter, exit_ = self.enter_threshold, self.exit_threshold
        if enter is not None and exit_ is not None and exit_ > enter:
            raise ConfigError(
                f"exit_threshold: {exit_} must be at most enter_threshold ({enter}), "
                "otherwise the pipeline would switch back and forth",
                setting="exit_threshold",
            )

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> PolicySettings:
        """Settings from raw values (strings as Airflow Variables hold them); defaults fill
        the gaps; an unknown name is refused, naming it."""
        _refuse_unknown(raw, (f.name for f in fields(cls)), what="policy")
        values: dict[str, Any] = {}
        for name, value in raw.items():
            if name in (*_DURATION_THRESHOLDS, "idle_timeout"):
                values[name] = parse_threshold_duration(value, setting=name)
            elif name in _DURATIONS:
                values[name] = parse_duration(value, setting=name)
            elif name == "offset_lag_threshold":
                values[name] = parse_threshold_count(value, setting=name)
            else:  # offset_lag_measure
                values[name] = str(value).strip().lower()
        return cls(**values)


# --- the whole pipeline's settings -----------------------------------------------------------

_PIPELINE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_DURATION_SETTINGS = ("trigger_interval", "max_stream_runtime", "stream_standby_lead")
_COUNT_SETTINGS: tuple[str, ...] = ("stream_checkpoints_kept",)
_OPTIONAL_COUNT_SETTINGS = ("max_records_per_trigger",)
STREAM_TRIGGERS = ("processing_time", "available_now")
BATCH_WRITERS = ("native", "python")
BATCH_READERS = ("arrow", "bucketlog", "native")
START_FROM = ("earliest", "latest")
ENGINES = ("submit", "warm")
SCHEMA_TRANSFORM = "value_schema"
"""The ``transform`` setting's default: the transform built from ``value_schema``
(:mod:`modeswitch.transforms.payload`): the payload parsed into its columns, or, with no
``value_schema``, the records as they are."""
_TEXT_SETTINGS = (
    "pipeline",
    "source",
    "warehouse",
    "sink",
    "quarantine",
    "state_root",
    "checkpoint_root",
    "transform",
    "value_schema",
    "storage_connection",
    "kafka_connection",
)


@dataclass(frozen=True, kw_only=True)
class PipelineSettings:
    """Everything one pipeline run needs, validated in one place.

    Locations (local paths are made absolute; URIs are kept):

    - ``source``: the bucketed log: the embedded log's root, or ``kafka://<topic>`` (the
      client configuration is not a setting: ``kafka_connection``); ``warehouse``: where
      tables live by default;
    - ``sink`` (default ``<warehouse>/<pipeline>``), ``quarantine``
      (``<warehouse>/<pipeline>_quarantine``), ``state_root``
      (``<warehouse>/_modeswitch/<pipeline>``), ``checkpoint_root``
      (``<state_root>/checkpoints``; one folder per stream epoch).

    Stream mode: ``trigger_interval`` (the micro-batch trigger), ``max_records_per_trigger``
    (the read limit; ``none``: no limit), ``max_stream_runtime`` (a stream epoch ends after this
    at the latest), ``stream_trigger`` (``processing_time``, the live default, or
    ``available_now``: read what is there, then end the epoch; for catch-up runs and
    benchmarks), ``stream_standby`` (``true``, the default: while a batch epoch runs, the local
    runner starts the next stream job ahead of its epoch, its Spark session up and its Python
    workers warm, and hands it the stream epoch when one opens; see
    :class:`modeswitch.runners.local.StreamStandby`), ``stream_standby_lead`` (``60s``: how
    long before the batch epoch's expected end, by its throughput so far, the standby starts;
    its start-up and warm-up took 20-30 s here while a batch job ran, and an estimate from the
    first wave alone runs long: that wave pays for the job's first Spark query).
    Batch mode: ``batch_reader`` (``arrow``, the default: each of a wave's tasks reads its
    ranges, runs the transform's Arrow form and writes the files with pyarrow in one Python
    worker, no row in the JVM, any log (:mod:`modeswitch.sinks.arrow_wave`; needs a transform
    with an Arrow form, as the default one); ``native``: Spark's Parquet reader reads the wave's
    segment files of the embedded log, a bucket's newest segment from a snapshot (a hard link; a
    copy of the range the wave needs where no link can be made), and the native writer checks the
    wave's record count before committing; ``bucketlog``: the Python data source, which the
    ``python`` writer always uses, and every non-``arrow`` read of a Kafka source, which has no
    files); ``batch_writer`` (for ``native`` and ``bucketlog`` reads: ``native``, the default,
    Spark's own Parquet writer writes the data files, then the sink's exactly-once commit;
    ``python``: the ``modeswitch_delta`` data source writer, which streaming always uses; see
    docs/SINK.md); ``batch_driver_memory``
    (``1g``; ``none``: Spark's default, a quarter of the machine's
    memory): the batch job's driver JVM heap, fixed (``spark.driver.memory`` and the same initial
    size). On a local master the driver runs the tasks too, so this bounds the job's memory whatever
    the backlog: a wave is streamed through, never held.
    ``value_schema`` (empty by default) is the records' JSON payload as a Spark DDL schema
    (``"id BIGINT NOT NULL, user STRING, amount DOUBLE"``; the types and what ``NOT NULL`` means:
    :mod:`modeswitch.control.value_schema`), checked here, with no JVM. ``transform`` is
    ``value_schema`` (the default: :data:`SCHEMA_TRANSFORM`), the transform built from that
    schema: each ``value`` parsed into the schema's columns, malformed ones quarantined, in both
    forms (Spark's ``from_json``; the Arrow parse in the Python workers), or with no schema the
    records as they are (only a value that is not UTF-8 is quarantined); or ``module:function``,
    a transform of your own (``modeswitch.transforms.arrow:parse_events_arrow`` and
    ``modeswitch.transforms:parse_events`` parse the demo's events), and then ``value_schema``
    must be empty: the two settings never both say how to parse.
    ``quarantine_warn_fraction`` (0.5; ``0 < f <= 1``): once more than this fraction of the
    records an epoch's job has committed went to quarantine, the job logs a warning, once per
    epoch; the status shows it and the next decision's reason mentions it.
    ``storage_connection`` names the Airflow Connection whose extras are the tables' storage
    options (credentials); only the id is a setting, the options travel in the environment
    (:mod:`modeswitch.storage`). ``kafka_connection``
    (``kafka_default``) names the Airflow Connection whose extras are a Kafka source's client
    configuration (librdkafka settings); outside Airflow it is ``MODESWITCH_KAFKA_CONFIG``
    (:mod:`modeswitch.sources.kafka`). ``start_from`` (``earliest``): where a bucket the sink
    holds nothing of starts; ``latest`` goes live at once, at the offsets of the epoch that
    opens, and leaves the history below them to backfill runs in ``fill`` mode
    (:mod:`modeswitch.modes.backfill`). ``stream_checkpoints_kept`` (3): how many ended stream
    epochs keep their Spark checkpoint folders (closing an epoch deletes older ones; within an epoch
    Spark keeps its last ``spark.sql.streaming.minBatchesToRetain`` micro-batches, 100 by
    default). ``engine`` (``submit``): under Airflow each epoch is its own spark-submit job;
    ``warm`` hands the epochs to the pipeline's long-lived engine instead, one Spark
    application that runs them all (:mod:`modeswitch.runners.engine`). ``policy`` and ``planner``
    hold the switching and planning settings, ``maintenance`` those of ``modeswitch maintain``.

    Layering (code defaults < config file < Airflow Variables < run params) is
    :func:`layer_settings`; every layer is a flat mapping of setting name to raw value.
    """

    pipeline: str = "modeswitch"
    source: str = ".demo/log"
    warehouse: str = ".demo/warehouse"
    sink: str = ""
    quarantine: str = ""
    state_root: str = ""
    checkpoint_root: str = ""
    trigger_interval: timedelta = timedelta(milliseconds=100)
    max_records_per_trigger: int | None = 100_000
    stream_trigger: str = "processing_time"
    max_stream_runtime: timedelta = timedelta(minutes=10)
    stream_standby: bool = True
    stream_standby_lead: timedelta = timedelta(seconds=60)
    batch_writer: str = "native"
    batch_reader: str = "arrow"
    batch_driver_memory: str = "1g"
    transform: str = SCHEMA_TRANSFORM
    value_schema: str = ""
    quarantine_warn_fraction: float = 0.5
    storage_connection: str = ""
    kafka_connection: str = "kafka_default"
    start_from: str = "earliest"
    stream_checkpoints_kept: int = 3
    engine: str = "submit"
    policy: PolicySettings = PolicySettings()
    planner: PlannerSettings = PlannerSettings()
    maintenance: MaintenanceSettings = MaintenanceSettings()

    def __post_init__(self) -> None:
        if not isinstance(self.pipeline, str) or not _PIPELINE_NAME.match(self.pipeline):
            raise ConfigError(
                f"pipeline: {self.pipeline!r} is not a valid name (letters, digits, '_', '.', '-')",
                setting="pipeline",
            )
        for name in ("source", "warehouse"):
            if not getattr(self, name):
                raise ConfigError(f"{name}: a location is required", setting=name)
        if self.trigger_interval <= timedelta(0):
            raise ConfigError(
                f"trigger_interval: {self.trigger_interval} must be greater than 0",
                setting="trigger_interval",
            )
        if self.max_stream_runtime <= timedelta(0):
            raise ConfigError(
                f"max_stream_runtime: {self.max_stream_runtime} must be greater than 0",
                setting="max_stream_runtime",
            )
        if self.stream_trigger not in STREAM_TRIGGERS:
            raise ConfigError(
                f"stream_trigger: {self.stream_trigger!r} is not one of "
                + ", ".join(STREAM_TRIGGERS),
                setting="stream_trigger",
            )
        if not isinstance(self.stream_standby, bool):
            raise ConfigError(
                f"stream_standby: {self.stream_standby!r} is not true or false",
                setting="stream_standby",
            )
        if self.batch_writer not in BATCH_WRITERS:
            raise ConfigError(
                f"batch_writer: {self.batch_writer!r} is not one of " + ", ".join(BATCH_WRITERS),
                setting="batch_writer",
            )
        if self.stream_checkpoints_kept < 1:
            raise ConfigError(
                f"stream_checkpoints_kept: {self.stream_checkpoints_kept!r} must be greater than 0",
                setting="stream_checkpoints_kept",
            )
        if self.start_from not in START_FROM:
            raise ConfigError(
                f"start_from: {self.start_from!r} is not one of " + ", ".join(START_FROM),
                setting="start_from",
            )
        if self.batch_reader not in BATCH_READERS:
            raise ConfigError(
                f"batch_reader: {self.batch_reader!r} is not one of " + ", ".join(BATCH_READERS),
                setting="batch_reader",
            )
        if self.engine not in ENGINES:
            raise ConfigError(
                f"engine: {self.engine!r} is not one of " + ", ".join(ENGINES), setting="engine"
            )
        if self.batch_driver_memory != parse_jvm_memory(
            self.batch_driver_memory, setting="batch_driver_memory"
        ):
            raise ConfigError(
                f"batch_driver_memory: {self.batch_driver_memory!r} is not written as Spark "
                "takes it (e.g. '1g')",
                setting="batch_driver_memory",
            )
        if self.max_records_per_trigger is not None and self.max_records_per_trigger <= 0:
            raise ConfigError(
                f"max_records_per_trigger: {self.max_records_per_trigger!r} must be greater than 0",
                setting="max_records_per_trigger",
            )
        if self.transform != SCHEMA_TRANSFORM and ":" not in self.transform:
            raise ConfigError(
                f"transform: {self.transform!r} is neither {SCHEMA_TRANSFORM!r} nor "
                "'module:function'",
                setting="transform",
            )
        parse_value_schema(self.value_schema)  # a ConfigError naming value_schema
        if self.value_schema.strip() and self.transform != SCHEMA_TRANSFORM:
            raise ConfigError(
                f"value_schema: {self.value_schema!r} is set, but transform = {self.transform!r} "
                f"parses the records itself; set transform to {SCHEMA_TRANSFORM!r} (the "
                "default) to parse them into value_schema's columns, or leave value_schema empty",
                setting="value_schema",
            )
        fraction = self.quarantine_warn_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise ConfigError(
                f"quarantine_warn_fraction: {fraction!r} is not a fraction",
                setting="quarantine_warn_fraction",
            )
        if not 0 < fraction <= 1:
            raise ConfigError(
                f"quarantine_warn_fraction: {fraction!r} must be greater than 0 and at most 1",
                setting="quarantine_warn_fraction",
            )
        if is_kafka_source(self.source):
            KafkaLocation.parse(self.source)  # a ConfigError naming the setting
        warehouse = _location(self.warehouse)
        state_root = _location(self.state_root) or f"{warehouse}/_modeswitch/{self.pipeline}"
        resolved = {
            "source": _location(self.source),
            "warehouse": warehouse,
            "sink": _location(self.sink) or f"{warehouse}/{self.pipeline}",
            "quarantine": _location(self.quarantine) or f"{warehouse}/{self.pipeline}_quarantine",
            "state_root": state_root,
            "checkpoint_root": _location(self.checkpoint_root) or f"{state_root}/checkpoints",
        }
        for name, value in resolved.items():
            object.__setattr__(self, name, value)

    def checkpoint(self, epoch: int) -> str:
        """The stream checkpoint of one epoch: fresh per epoch, reused by its restarts."""
        return f"{self.checkpoint_root}/epoch-{epoch}"

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every setting name a layer may hold (pipeline, policy and planner settings)."""
        own = tuple(f.name for f in fields(cls) if f.name not in _GROUPS)
        return (*own, *(f.name for group in _GROUPS.values() for f in fields(group)))

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> PipelineSettings:
        """Settings from one flat mapping of raw values; unknown names are refused."""
        _refuse_unknown(raw, cls.names(), what="pipeline")
        values: dict[str, Any] = {
            key: group.from_mapping(
                {k: v for k, v in raw.items() if k in {f.name for f in fields(group)}}
            )
            for key, group in _GROUPS.items()
        }
        for name, value in raw.items():
            if name in _DURATION_SETTINGS:
                values[name] = parse_duration(value, setting=name)
            elif name in _COUNT_SETTINGS:
                values[name] = parse_positive_int(value, setting=name)
            elif name in _OPTIONAL_COUNT_SETTINGS:
                values[name] = parse_threshold_count(value, setting=name)
            elif name in ("stream_trigger", "batch_writer", "batch_reader", "start_from", "engine"):
                values[name] = str(value).strip().lower()
            elif name == "stream_standby":
                values[name] = parse_bool(value, setting=name)
            elif name == "quarantine_warn_fraction":
                values[name] = parse_fraction(value, setting=name)
            elif name == "batch_driver_memory":
                values[name] = parse_jvm_memory(value, setting=name)
            elif name in _TEXT_SETTINGS:
                if not isinstance(value, str):
                    raise ConfigError(f"{name}: {value!r} is not text", setting=name)
                values[name] = value.strip()
        return cls(**values)

    def to_mapping(self) -> dict[str, str]:
        """A flat mapping of strings that :meth:`from_mapping` reads back to equal settings."""
        out: dict[str, str] = {}
        for group in (self, self.policy, self.planner, self.maintenance):
            for f in fields(group):
                if f.name in _GROUPS:
                    continue
                value = getattr(group, f.name)
                if value is None:
                    out[f.name] = "none"
                elif isinstance(value, timedelta):
                    out[f.name] = f"{value.total_seconds():g}s"
                elif isinstance(value, bool):
                    out[f.name] = "true" if value else "false"
                else:
                    out[f.name] = str(value)
        return out

    def to_json(self) -> str:
        import json

        return json.dumps(self.to_mapping(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PipelineSettings:
        import json

        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"settings: {text[:80]!r} is not valid JSON ({exc})") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"settings: expected a JSON object, got {type(raw).__name__}")
        return cls.from_mapping(raw)


_GROUPS: dict[str, Any] = {
    "policy": PolicySettings,
    "planner": PlannerSettings,
    "maintenance": MaintenanceSettings,
}
"""The setting groups a flat layer's names are sorted into, by the group's field names."""


def _location(value: str) -> str:
    from modeswitch.storage import absolute_location

    value = value.strip()
    return absolute_location(value) if value else value


def read_settings_file(path: str) -> dict[str, Any]:
    """A config file's flat mapping: TOML (``.toml``) or JSON (anything else)."""
    import json
    import tomllib

    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle) if path.endswith(".toml") else json.load(handle)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path!r} does not exist") from exc
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"config file {path!r} is not valid: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r}: expected a table/object of settings")
    return data


def layer_settings(*layers: tuple[str, Mapping[str, Any] | None]) -> PipelineSettings:
    """Apply named layers in order (later wins) over the code defaults, then validate.

    Each layer is ``(where, mapping)``, e.g. ``("Airflow Variable", {...})``; a bad value is
    reported as ``<where> <setting>: ...`` so the operator knows what to fix.
    """
    merged: dict[str, Any] = {}
    for _, mapping in layers:
        merged.update(mapping or {})
    origin = setting_origins(*layers)
    try:
        return PipelineSettings.from_mapping(merged)
    except ConfigError as exc:
        where = origin.get(exc.setting) if exc.setting else None
        raise ConfigError(f"{where} {exc}" if where else str(exc), setting=exc.setting) from exc


def setting_origins(*layers: tuple[str, Mapping[str, Any] | None]) -> dict[str, str]:
    """Where each setting that a layer sets got its value: the last layer that sets it, as
    :func:`layer_settings` names it (``config file pipeline.toml:``); settings no layer sets
    have their code default."""
    origin: dict[str, str] = {}
    for where, mapping in layers:
        origin.update(dict.fromkeys(mapping or {}, where))
    return origin


def load_job_settings(config: str, *, pipeline: str) -> PipelineSettings:
    """The settings a Spark job was given with ``--config``: inline JSON or a JSON/TOML file.

    The ``decide`` step resolves and validates every layer, then hands the result to the job,
    so both see the same values. ``pipeline`` must match the settings' pipeline.
    """
    raw = config.strip()
    if raw.startswith("{"):
        settings = PipelineSettings.from_json(raw)
    else:
        settings = PipelineSettings.from_mapping(read_settings_file(raw))
    if settings.pipeline != pipeline:
        raise ConfigError(
            f"--pipeline {pipeline!r} does not match the settings' pipeline {settings.pipeline!r}"
        )
    return settings
