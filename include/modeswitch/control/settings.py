"""The pipeline's settings, declared and validated in one place: :class:`PipelineSettings`,
the choices its settings take (``ENGINES``, ``BATCH_READERS``, ...), :data:`SCHEMA_TRANSFORM`.

Each setting is one field, declared with :func:`~modeswitch.control.values.setting`: its type
(a choice is a ``Literal``), code default, parser, rule and doc (the settings table's text).
Parsing and writing a flat layer (:mod:`modeswitch.control.flat_settings`), the constructors'
checks and the docs' table (:mod:`modeswitch.control.settings_table`) all read the fields;
``__post_init__`` spells out only the rules between settings (value_schema and
event_time_field only with the transform built from them, event_time_field a time field of
value_schema). The groups it holds are :mod:`modeswitch.control.setting_groups`; the layers
(code defaults < config file < Airflow Variables < run params),
:mod:`modeswitch.control.settings_layers`.

Not pydantic-settings: its sources are not our layers, its errors name a field path where ours
name the Variable or param and the bad value, and our parsers (``250ms``, ``none``) would stay.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import ClassVar, Literal, get_args

from modeswitch.control.flat_settings import FlatSettings
from modeswitch.control.locations import KafkaLocation, is_kafka_source
from modeswitch.control.payload_settings import PayloadSettings
from modeswitch.control.setting_groups import MaintenanceSettings, PlannerSettings, PolicySettings
from modeswitch.control.value_schema import (
    SCHEMA_TRANSFORM,
    Payload,
    describe_payload,
    parse_value_schema,
)
from modeswitch.control.values import (
    MIN_DRIVER_MEMORY,
    check_settings,
    greater_than_zero,
    not_negative,
    parse_bool,
    parse_choice,
    parse_duration,
    parse_fraction,
    parse_instant,
    parse_jvm_memory,
    parse_positive_int,
    parse_rate,
    parse_text,
    parse_threshold_count,
    parse_threshold_duration,
    setting,
    threshold_above_zero,
    within_fraction,
)
from modeswitch.errors import ConfigError

__all__ = [
    "MIN_DRIVER_MEMORY",
    "SCHEMA_TRANSFORM",
    "SETTINGS_CLASSES",
    "PipelineSettings",
    "parse_bool",
    "parse_duration",
    "parse_fraction",
    "parse_jvm_memory",
    "parse_positive_int",
    "parse_rate",
    "parse_threshold_count",
    "parse_threshold_duration",
]

# --- the whole pipeline's settings -----------------------------------------------------------

StreamTrigger = Literal["processing_time", "available_now"]
BatchWriter = Literal["native", "python"]
StreamWriter = Literal["auto", "arrow", "python", "delta_spark"]
BatchReader = Literal["auto", "arrow", "bucketlog", "native"]
StartFrom = Literal["earliest", "latest"]
Engine = Literal["auto", "submit", "warm"]
STREAM_TRIGGERS: tuple[str, ...] = get_args(StreamTrigger)
BATCH_WRITERS: tuple[str, ...] = get_args(BatchWriter)
STREAM_WRITERS: tuple[str, ...] = get_args(StreamWriter)
BATCH_READERS: tuple[str, ...] = get_args(BatchReader)
START_FROM: tuple[str, ...] = get_args(StartFrom)
ENGINES: tuple[str, ...] = get_args(Engine)

_PIPELINE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def pipeline_name_rule(value: str) -> str | None:
    """Why ``value`` cannot name a pipeline (None: it can): the ``pipeline`` setting's rule."""
    if _PIPELINE_NAME.match(value):
        return None
    return "is not a valid name (letters, digits, '_', '.', '-')"


def _required_location(value: str) -> str | None:
    return None if value.strip() else "is empty: a location is required"


def _source_location(value: str) -> str | None:
    if is_kafka_source(value):
        KafkaLocation.parse(value)  # a ConfigError naming the setting
    return _required_location(value)


def _spark_memory(value: str) -> str | None:
    if value != parse_jvm_memory(value, setting="batch_driver_memory"):
        return "is not written as Spark takes it (e.g. '1g')"
    return None


def _transform_name(value: str) -> str | None:
    if value == SCHEMA_TRANSFORM or ":" in value:
        return None
    return f"is neither {SCHEMA_TRANSFORM!r} nor 'module:function'"


def _ddl_schema(value: str) -> str | None:
    parse_value_schema(value)  # a ConfigError naming value_schema
    return None


DERIVED_LOCATIONS = ("sink", "quarantine", "state_root", "checkpoint_root")
"""The location settings that, left empty, are derived from ``warehouse`` and ``pipeline``
(:class:`PipelineSettings`)."""


@dataclass(frozen=True, kw_only=True)
class PipelineSettings(FlatSettings):
    """Everything one pipeline run needs, validated in one place.

    Each field declared with :func:`~modeswitch.control.values.setting` is one setting, and
    its ``doc`` says what it does (the settings table:
    :func:`~modeswitch.control.settings_table.settings_table`). ``policy`` and
    ``planner`` hold the switching and planning settings, ``maintenance`` those of
    ``modeswitch maintain``; a flat layer holds the settings of all four.

    Locations: local paths are made absolute, URIs are kept, and an empty ``sink``,
    ``quarantine``, ``state_root`` or ``checkpoint_root`` is derived from ``warehouse`` and
    ``pipeline`` (their ``shown`` default).

    Layering (code defaults < config file < Airflow Variables < run params) is
    :func:`~modeswitch.control.settings_layers.layer_settings`; every layer is a flat mapping
    of setting name to raw value (:class:`~modeswitch.control.flat_settings.FlatSettings`).
    """

    settings_kind: ClassVar[str] = "pipeline"
    setting_groups: ClassVar[Mapping[str, type[FlatSettings]]] = {
        "policy": PolicySettings,
        "planner": PlannerSettings,
        "maintenance": MaintenanceSettings,
        "payload": PayloadSettings,
    }

    pipeline: str = setting(
        "modeswitch",
        parse=parse_text,
        rule=pipeline_name_rule,
        doc="pipeline id (names the sink and control tables)",
    )
    source: str = setting(
        ".demo/log",
        parse=parse_text,
        rule=_source_location,
        doc="the source log's root (path or URI), or `kafka://<topic>` (client configuration: "
        "`kafka_connection`'s; `?headers=true` keeps the headers: [KAFKA.md](KAFKA.md#headers))",
    )
    warehouse: str = setting(
        ".demo/warehouse",
        parse=parse_text,
        rule=_required_location,
        doc="where the tables live by default",
    )
    sink: str = setting(
        "", parse=parse_text, shown="<warehouse>/<pipeline>", doc="the sink Delta table"
    )
    quarantine: str = setting(
        "",
        parse=parse_text,
        shown="<warehouse>/<pipeline>_quarantine",
        doc="malformed records",
    )
    state_root: str = setting(
        "", parse=parse_text, shown="<warehouse>/_modeswitch/<pipeline>", doc="control tables"
    )
    checkpoint_root: str = setting(
        "",
        parse=parse_text,
        shown="<state_root>/checkpoints",
        doc="stream checkpoints, one per epoch (and one per restart that could not resume it)",
    )
    trigger_interval: timedelta = setting(
        timedelta(milliseconds=100),
        parse=parse_duration,
        rule=greater_than_zero,
        doc="stream micro-batch trigger",
    )
    max_records_per_trigger: int | None = setting(
        100_000,
        parse=parse_threshold_count,
        rule=greater_than_zero,
        doc="stream read limit per micro-batch (`none`: no limit)",
    )
    stream_trigger: StreamTrigger = setting(
        "processing_time",
        parse=parse_choice,
        doc="`processing_time`: the live stream; `available_now`: read what is there, then "
        "end the epoch (catch-up runs, benchmarks)",
    )
    max_stream_runtime: timedelta = setting(
        timedelta(minutes=10),
        parse=parse_duration,
        rule=greater_than_zero,
        doc="a stream epoch ends after this at the latest",
    )
    stream_ends_by: datetime | None = setting(  # an end: the engine may start a stream late
        None,
        parse=parse_instant,
        doc="a stream epoch also ends at this time; `modeswitch run --for` sets it",
    )
    # A Kafka broker restarting answers again in ~15 s here (tests/kafka/test_broker_faults.py).
    source_outage_grace: timedelta = setting(
        timedelta(minutes=2),
        parse=parse_duration,
        rule=greater_than_zero,
        doc="while the source cannot tell its latest offsets (a Kafka broker restarting), a "
        "stream epoch decides on those it saw last for this long, then fails naming the "
        "source (Airflow's retry runs it again)",
    )
    # The standby: modeswitch.runners.local.StreamStandby.
    stream_standby: bool = setting(
        True,
        parse=parse_bool,
        doc="local runner only (`make demo-local`, `modeswitch run` with `engine = submit`): "
        "start the next stream job in standby while a batch epoch runs (Spark session up, "
        "Python workers warmed by a throwaway stream) and hand it the stream epoch, for a "
        "faster handoff; under Airflow see `modeswitch_engine`",
    )
    # Start-up and warm-up took 20-30 s here beside a batch; a first wave's estimate runs long.
    stream_standby_lead: timedelta = setting(
        timedelta(seconds=60),
        parse=parse_duration,
        rule=not_negative,
        doc="how long before the batch epoch's expected end (by its throughput so far, timed "
        "from the job's plan, not its start) the standby starts; a one-wave batch epoch gets "
        "no standby",
    )
    # The sinks: docs/SINK.md.
    batch_writer: BatchWriter = setting(
        "native",
        parse=parse_choice,
        doc="for `native` and `bucketlog` reads: Spark's Parquet writer + the sink's commit, "
        "or `python` (the `modeswitch_delta` data source writer, which streaming always "
        "uses; [SINK.md](SINK.md))",
    )
    stream_writer: StreamWriter = setting(
        "auto",
        parse=parse_choice,
        doc="a stream's micro-batches: `arrow` (an Arrow wave each, as a batch's; `auto`'s for a "
        "transform with an Arrow form, else `python`), `python` (the `modeswitch_delta` data "
        "source) or `delta_spark` (delta-spark's writer in `foreachBatch`; [SINK.md](SINK.md))",
    )
    stream_driver_records: int = setting(
        100_000,
        parse=parse_positive_int,
        rule=greater_than_zero,
        doc="`arrow` writer: a micro-batch of at most this many records runs in the driver, a "
        "larger one in Spark tasks",
    )
    # The readers: modeswitch.sinks.arrow_wave (arrow), modeswitch.modes.wave_path.
    batch_reader: BatchReader = setting(
        "auto",
        parse=parse_choice,
        doc="`auto`: the faster path for the transform, as measured "
        "([BENCHMARKS.md](BENCHMARKS.md)): `arrow` for one whose Arrow form is the faster "
        "(JSON's `value_schema`), `native` where the log has Spark's own reader for one whose "
        "Spark form is (an Avro payload: Spark's `from_avro`) or that has no Arrow form (else "
        "`bucketlog`); "
        "`arrow`: each task of a batch wave reads its ranges, runs the transform's Arrow "
        "form and writes the files with pyarrow in one Python worker, no row in the JVM, on any "
        "log (needs a transform with an Arrow form; another is refused before "
        "anything is read); `native`: Spark's Parquet reader reads the wave's segment files of "
        "the embedded log (with `batch_writer = native`; a bucket's newest segment, which may "
        "still grow, from a snapshot: a hard link, or a copy of the range the wave needs where "
        "no link can be made; the `native` writer checks the wave's record count before "
        "committing); on a Kafka topic `native` is Spark's own Kafka source (each partition's "
        "range of the wave, read_committed); `bucketlog`: the Python data source, which the "
        "`python` writer uses on the embedded log "
        '([ARCHITECTURE.md](ARCHITECTURE.md#how-it-works), "The batch paths")',
    )
    # On a local master the driver runs the tasks too: a wave is streamed through, never held.
    batch_driver_memory: str = setting(
        "1g",
        parse=parse_jvm_memory,
        rule=_spark_memory,
        doc="the batch job's driver JVM heap, fixed (`spark.driver.memory` and `-Xms`); on a "
        "local master it bounds the job's memory whatever the backlog; `none`: Spark's default "
        "(a quarter of the machine's memory)",
    )
    # The transforms: modeswitch.transforms, .payload (from value_schema), .arrow (its parse).
    transform: str = setting(
        SCHEMA_TRANSFORM,
        parse=parse_text,
        rule=_transform_name,
        doc="`value_schema`: the transform built from `modeswitch_value_schema` "
        "(`modeswitch.transforms.payload`): each `value` parsed into its columns, with Spark's "
        "`from_json` where Spark runs the transform and the same parse with msgspec on Arrow "
        "batches in the Python workers that read them (batch waves; the stream's `bucketlog` "
        "reader), the same rows and quarantine reasons (`modeswitch.transforms.arrow` lists "
        "the deliberate differences); with no `value_schema`, the records land as they are "
        "(`bucket, offset, event_time, key, value`; only a value that is not UTF-8 is "
        "quarantined). Or `module:function`, a transform of your own, which may carry an Arrow "
        'form (`modeswitch.transforms`, "An Arrow form"); `value_schema` must then be empty. '
        "`modeswitch.transforms.arrow:parse_events_arrow` and "
        "`modeswitch.transforms:parse_events` (`from_json` only: set `batch_reader` to "
        "`native` or `bucketlog`) parse the demo's events",
    )
    # The types and what NOT NULL means: modeswitch.control.value_schema (checked, no JVM).
    value_schema: str = setting(
        "",
        parse=parse_text,
        rule=_ddl_schema,
        doc="the records' JSON `value` as a Spark DDL schema, e.g. `id BIGINT NOT NULL, user "
        "STRING, amount DOUBLE`: `name TYPE [NOT NULL] [COMMENT '...']`, types `BIGINT`/`LONG`, "
        "`INT`/`INTEGER`, `SMALLINT`/`SHORT`, `DOUBLE`, `FLOAT`/`REAL`, `DECIMAL(p,s)` (a JSON "
        "number's exact digits, or a string; half up), `STRING`, `BOOLEAN`, `DATE` "
        "(`2026-05-01`), `TIMESTAMP` (RFC 3339 text with its offset, "
        "`2026-05-01T12:00:00.250+02:00`), `TIMESTAMP_NTZ` (a wall-clock time, the same text "
        "without an offset, kept as written), `STRUCT<a: INT, ...>`, `ARRAY<T>`, `MAP<STRING, T>` "
        "(times inside too; read by `from_json` alone); others (`TINYINT`) are refused. A `NOT "
        "NULL` field must be present and of its type, or the record is quarantined (`field id "
        "is missing or not an integer`); another is null when missing or mistyped. Used by the "
        "default `transform`; `make demo` sets the demo's events (`payload.EVENT_VALUE_SCHEMA`)",
    )
    # The event time's rule: modeswitch.control.value_schema; backfills: modeswitch.modes.backfill.
    event_time_field: str = setting(
        "",
        parse=parse_text,
        doc="empty: each record's event time is the log's record timestamp. Else a field of "
        "`modeswitch_value_schema`, a `TIMESTAMP` or a `BIGINT` of epoch milliseconds, whose "
        "time is each record's `event_time` in the sink and the quarantine, alike in both forms "
        "of the transform; the watermark, its lag and backfill windows then go by it. A record "
        "whose value holds no time there keeps the log's timestamp, or, the field being `NOT "
        "NULL`, is quarantined (`field at is missing or not a timestamp`). Refused with a "
        "`transform` of your own, without `value_schema`, naming a field it lacks or of another "
        "type, and beside a `kafka://<topic>?event_time=<field>` source. Backfill windows then "
        "read each bucket from its earliest retained offset, and a backfill whose rows got their "
        "event time under another value of this setting is refused; a rewind to an `event_time` "
        "still goes by the log's timestamps ([OPERATIONS.md](OPERATIONS.md#backfills))",
    )
    quarantine_warn_fraction: float = setting(
        0.5,
        parse=parse_fraction,
        rule=within_fraction,
        doc="when more than this fraction of what an epoch committed went to quarantine, the "
        "batch or stream job logs a warning (once per epoch, with the counts and the most "
        "common reason), `modeswitch status` and the page show it, and the next decision's "
        "reason mentions it; `0 < f <= 1` (`80%` also reads)",
    )
    # Lag alerts (modeswitch.control.alerts, the modeswitch_lag_alerts DAG): apart from the
    # switching thresholds above, which decide modes, not whom to tell.
    alert_watermark_lag: timedelta | None = setting(
        None,
        parse=parse_threshold_duration,
        rule=threshold_above_zero,
        doc="alert while the watermark lag exceeds it (`none`: no watermark alert)",
    )
    alert_offset_lag: int | None = setting(
        None,
        parse=parse_threshold_count,
        rule=threshold_above_zero,
        doc="alert while the records behind the latest offsets exceed it (`none`: no offset alert)",
    )
    alert_after: timedelta = setting(
        timedelta(minutes=5),
        parse=parse_duration,
        rule=not_negative,
        doc="a lag must stay over an alert threshold this long before the notifiers are told",
    )
    alert_notifiers: str = setting(
        "",
        parse=parse_text,
        doc="comma-separated `module:name` of Airflow notifiers (e.g. your own module's "
        "`SmtpNotifier(...)` or `SlackNotifier(...)` instance): each called once when a breach "
        "begins and once when it ends",
    )
    # The sink's live Asset (modeswitch.airflow.assets.live_sink_asset), watched in the
    # triggerer by modeswitch.airflow.triggers.SinkProgressTrigger.
    asset_event_interval: timedelta = setting(
        timedelta(minutes=1),
        parse=parse_duration,
        rule=greater_than_zero,
        doc="at most one event per this interval on the sink's live Asset (the rows committed "
        "since the last one, while an epoch runs), for DAGs scheduled on it; each closed epoch "
        "is one event on the sink table's own Asset whatever this is",
    )
    # Only the id is a setting; the options travel in the environment (modeswitch.storage).
    storage_connection: str = setting(
        "",
        parse=parse_text,
        doc="Connection whose extras are the tables' storage options",
    )
    # Outside Airflow the configuration is MODESWITCH_KAFKA_CONFIG (modeswitch.sources.kafka).
    kafka_connection: str = setting(
        "kafka_default",
        parse=parse_text,
        doc="Connection whose extras are a `kafka://` source's client configuration "
        "(librdkafka settings)",
    )
    # The backfill runs: modeswitch.modes.backfill.
    start_from: StartFrom = setting(
        "earliest",
        parse=parse_choice,
        doc="where a bucket the sink holds nothing of starts; `latest`: go live at once, at the "
        "offsets of the epoch that opens, and fill the history below them with backfills "
        "([OPERATIONS.md](OPERATIONS.md#backfills))",
    )
    # Within an epoch Spark keeps its last spark.sql.streaming.minBatchesToRetain (100) batches.
    stream_checkpoints_kept: int = setting(
        3,
        parse=parse_positive_int,
        rule=greater_than_zero,
        doc="ended stream epochs whose Spark checkpoint folders are kept; closing a stream "
        "epoch deletes older ones",
    )
    # The engine: modeswitch.runners.engine.
    engine: Engine = setting(
        "auto",
        parse=parse_choice,
        doc="`warm` hands every epoch to the pipeline's long-lived engine, one Spark application "
        'that runs them all ("The warm engine" above), under Airflow and `modeswitch run` '
        "alike; `submit`: under Airflow each epoch is its own `spark-submit` job, under "
        "`modeswitch run` a child process; `auto`: `warm` on a local or standalone master in "
        "client deploy mode with an executor that runs tasks on one host (LocalExecutor) and "
        "under `modeswitch run`, else `submit` (cluster deploy mode, YARN, Kubernetes, Celery): "
        "the task's log says which and why",
    )
    # The groups are frozen dataclasses, so one default instance is shared safely.
    policy: PolicySettings = PolicySettings()  # noqa: RUF009
    planner: PlannerSettings = PlannerSettings()  # noqa: RUF009
    maintenance: MaintenanceSettings = MaintenanceSettings()  # noqa: RUF009
    payload: PayloadSettings = PayloadSettings()  # noqa: RUF009

    def __post_init__(self) -> None:
        check_settings(self)
        self._check_event_time_field()
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

    def _check_event_time_field(self) -> None:
        """The payload settings together (``describe_payload`` writes their rules), and a
        Kafka source that does not take its event time from a field as well."""
        self.describe_payload()
        name = self.event_time_field
        kafka = is_kafka_source(self.source)
        if name and kafka and KafkaLocation.parse(self.source).event_time_field:
            raise ConfigError(
                f"event_time_field: {name!r} is set, and source {self.source!r} takes the event "
                "time from a field of its own (?event_time=); keep one: event_time_field (typed "
                "by value_schema, read alike by both forms of the transform) or the source's",
                setting="event_time_field",
            )

    def describe_payload(self) -> Payload:
        """What the records hold and what parses them, from the payload settings
        (:func:`~modeswitch.control.value_schema.describe_payload`)."""
        return describe_payload(
            self.transform,
            self.value_schema,
            self.event_time_field,
            formats=self.payload,
            source=self.source,
        )

    def checkpoint(self, epoch: int) -> str:
        """The stream checkpoint of one epoch: fresh per epoch, reused by its restarts."""
        return f"{self.checkpoint_root}/epoch-{epoch}"


SETTINGS_CLASSES: tuple[type, ...] = (PipelineSettings, *PipelineSettings.setting_groups.values())
"""Every settings class, in the settings table's order: the pipeline's, then its groups'."""


def _location(value: str) -> str:
    from modeswitch.storage import absolute_location

    value = value.strip()
    return absolute_location(value) if value else value
