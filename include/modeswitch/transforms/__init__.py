"""The one transform both modes run: parse each record's JSON value, mark what does not parse.

The batch job and the stream job call the same ``transform(df) -> df`` on the ``bucketlog``
source DataFrame (columns ``bucket, offset, event_time, key, value``). The contract the sink
relies on:

- every input row comes out, exactly once: malformed records are *marked*, never dropped;
- the input columns are kept as they are (``value`` stays raw, for lineage), but for one: the
  transform built from ``value_schema`` with ``event_time_field`` set puts the payload's event
  time in ``event_time`` (:mod:`modeswitch.control.value_schema`); a transform of one's own
  keeps ``event_time`` as it is (a backfill's window, the watermark and the log's time index
  all count on it);
- typed columns parsed from the JSON ``value`` may be added (the default transform adds the
  ``value_schema`` setting's, :mod:`modeswitch.transforms.payload`; the demo's parse,
  :func:`parse_events`, adds :data:`EVENT_SCHEMA`'s: ``event_id long, user_id long, action
  string, amount double, country string``);
- a nullable string column :data:`QUARANTINE_REASON` is added: null for a good record, a short
  human-readable reason for a bad one (``"value is not valid JSON"``, ``"field user_id is
  missing or not an integer"``). The sink routes rows with a reason to the quarantine table.
  On such rows every typed column is null.

The transform is made of Spark SQL functions only (``from_json`` with an explicit schema and
column checks): no Python UDF, no action, no aggregation, so it runs unchanged on a streaming
DataFrame.

What Spark's JSON reader accepts and this transform therefore accepts too: text after a
complete JSON object is ignored (``{"event_id": 1} trailing``), a string field takes any JSON
value as its text (``"action": 5`` gives ``"5"``), and an integer is a valid double.

The transform is a setting, resolved by :func:`load_transform` to a :class:`Transform`: by
default ``value_schema`` (:data:`DEFAULT_TRANSFORM`), the transform built from the
``value_schema`` setting (:mod:`modeswitch.transforms.payload`: the payload parsed into its
columns in both forms, its ``event_time_field`` as the event time, or the records as they are
without a schema); or ``module:function``, the function it names, or the :class:`Transform` it
names as is (then ``value_schema`` and ``event_time_field`` must be empty).
:func:`check_output_schema` tells a transform whose output breaks the contract apart from a
working one; an Arrow form's output is checked before anything is written.

**An Arrow form** (optional): a transform may also say how to do the same work on Arrow
batches, without Spark: a :class:`Transform` built with ``arrow=``, a function of the input's
Spark schema that returns an :class:`ArrowForm` (a picklable function from the input's Arrow
batches to the output's, and the output's Spark schema). Batch waves with ``batch_reader =
arrow`` run it in the Python workers on the batches they read and write
(:mod:`modeswitch.sinks.arrow_wave`), and the ``bucketlog`` reader runs it where it reads
(its ``transform`` and ``valueSchema`` options, :func:`reader_options`); both forms must give
the same rows. The transform built from ``value_schema`` and the Arrow parse
(:data:`modeswitch.transforms.arrow.parse_events_arrow`) have one; a plain function has none.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from modeswitch.control.settings import SCHEMA_TRANSFORM, PipelineSettings
from modeswitch.control.value_schema import (
    EVENT_TIME_TYPES,
    MAX_MICROS,
    MAX_MILLIS,
    MIN_MICROS,
    MIN_MILLIS,
    TIMESTAMP_PATTERN,
)
from modeswitch.errors import ConfigError
from modeswitch.sources.kafka import NOT_UTF8_PREFIX

log = logging.getLogger(__name__)

QUARANTINE_REASON = "_quarantine_reason"
"""Name of the column that marks a malformed record: null when good, a reason when not."""

DEFAULT_TRANSFORM = SCHEMA_TRANSFORM
"""The ``transform`` setting's default value, ``value_schema``: the transform built from the
``value_schema`` setting (:mod:`modeswitch.transforms.payload`)."""

SPARK_SQL_TRANSFORM = "modeswitch.transforms:parse_events"
"""The demo's parse with Spark SQL's ``from_json`` (:func:`parse_events`); its Arrow parse is
``modeswitch.transforms.arrow:parse_events_arrow``."""

SOURCE_COLUMNS = ("bucket", "offset", "event_time", "key", "value")
"""The ``bucketlog`` source's columns; every transform keeps them."""

REQUIRED_OUTPUT: dict[str, str] = {
    "bucket": "int",
    "offset": "bigint",
    "event_time": "timestamp",
    "key": "string",
    "value": "string",
    QUARANTINE_REASON: "string",
}
"""Columns (and Spark simple type names) that a transform's output must have."""

EVENT_SCHEMA = StructType(
    [
        StructField("event_id", LongType()),
        StructField("user_id", LongType()),
        StructField("action", StringType()),
        StructField("amount", DoubleType()),
        StructField("country", StringType()),
    ]
)
"""The synthetic events' payload (see :mod:`modeswitch.devtools.produce`); every field is
required."""

_PARSED = "_modeswitch_parsed"
_FIELD = "_modeswitch_field_"
_CORRUPT = "_modeswitch_corrupt"
_JSON_OPTIONS = {
    "mode": "PERMISSIVE",
    "columnNameOfCorruptRecord": _CORRUPT,
    # NaN / Infinity are not JSON; refuse them rather than store them as doubles.
    "allowNonNumericNumbers": "false",
}


def parse_events(df: DataFrame) -> DataFrame:
    """The demo's parse: ``value`` parsed with :data:`EVENT_SCHEMA`, all fields required (what
    ``value_schema`` = :data:`modeswitch.transforms.payload.EVENT_VALUE_SCHEMA` gives)."""
    return parse_json_values(df, EVENT_SCHEMA)


def parse_json_values(
    df: DataFrame,
    schema: StructType,
    *,
    required: Sequence[str] | None = None,
    event_time: str | None = None,
) -> DataFrame:
    """Add ``schema``'s fields parsed from the JSON ``value`` and :data:`QUARANTINE_REASON`.

    ``required`` names the fields that must be present, non-null and of their type (default:
    all of them); a missing optional field is just null. Keeps every input column and row;
    on a row with a reason, every added field is null. Pure Spark SQL, streaming-safe.

    A timestamp field is read as text and converted by :func:`timestamp_from_text` (RFC 3339
    with an offset, :mod:`modeswitch.control.value_schema`), not by Spark's own timestamp
    parsing. ``event_time`` names a timestamp field, or a long field read as epoch
    milliseconds (null outside the years 0001-9999), whose time replaces the ``event_time``
    column on every row whose value is a JSON object with that field's time; the other rows
    keep theirs.

    The reason is the first of: ``value is null``, ``value is not UTF-8`` (a source kept
    undecodable bytes as :data:`~modeswitch.sources.kafka.NOT_UTF8_PREFIX` + base64),
    ``value is empty``, ``value is not valid
    JSON``, ``value is not a JSON object``, ``field F is missing or not <type>`` (the first
    required field, in schema order, that did not parse).
    """
    names = [f.name for f in schema.fields]
    required = check_parse_inputs(df.columns, schema, required, event_time=event_time)

    read_fields = [
        StructField(f.name, StringType()) if isinstance(f.dataType, TimestampType) else f
        for f in schema.fields
    ]
    parse_schema = StructType([*read_fields, StructField(_CORRUPT, StringType())])
    value = F.col("value")
    parsed = F.col(_PARSED)
    corrupt = parsed.getField(_CORRUPT)
    # Each CASE branch is evaluated only if the earlier ones did not match, so the second
    # parse (get_json_object / json_object_keys) runs on malformed records only.
    reason: Column = (
        F.when(value.isNull(), F.lit("value is null"))
        .when(value.startswith(NOT_UTF8_PREFIX), F.lit("value is not UTF-8"))
        .when(parsed.isNull(), F.lit("value is empty"))
        .when(
            corrupt.isNotNull() & F.get_json_object(value, "$").isNull(),
            F.lit("value is not valid JSON"),
        )
        .when(
            corrupt.isNotNull() & F.json_object_keys(value).isNull(),
            F.lit("value is not a JSON object"),
        )
    )
    # Fields whose parsed value is converted (a timestamp's text, an event time's range): in a
    # projection of their own, so that each conversion runs once per row.
    conversions: dict[str, Column] = {}
    for f in schema.fields:
        if isinstance(f.dataType, TimestampType):
            conversions[f.name] = timestamp_from_text(parsed.getField(f.name))
        elif f.name == event_time:
            millis = parsed.getField(f.name)
            conversions[f.name] = F.when(millis.between(MIN_MILLIS, MAX_MILLIS), millis)
    columns = {n: f"{_FIELD}{i}" for i, n in enumerate(names) if n in conversions}

    def field(name: str) -> Column:
        return F.col(columns[name]) if name in columns else parsed.getField(name)

    for name in required:
        kind = _type_word(schema[name].dataType, event_time=name == event_time)
        reason = reason.when(field(name).isNull(), F.lit(f"field {name} is missing or not {kind}"))
    # Three projections, so that from_json and the reason are each computed once per row
    # (Spark does not collapse projections that would repeat an expensive expression).
    with_parsed = df.withColumn(_PARSED, F.from_json(value, parse_schema, _JSON_OPTIONS))
    if conversions:
        with_parsed = with_parsed.select(
            "*", *[conversions[n].alias(c) for n, c in columns.items()]
        )
    with_reason = with_parsed.withColumn(QUARANTINE_REASON, reason)
    reason_column = F.col(QUARANTINE_REASON)
    good = reason_column.isNull()
    kept = [F.col(c) for c in df.columns]
    if event_time is not None:
        moment = field(event_time)
        if not isinstance(schema[event_time].dataType, TimestampType):
            moment = F.timestamp_millis(moment)
        # The payload's time on every row whose value is a JSON object (a good row, or one a
        # field quarantined), whatever the rest of the schema says: as the Arrow form does.
        an_object = good | reason_column.startswith("field ")
        replaced = F.coalesce(F.when(an_object, moment), F.col("event_time"))
        kept = [replaced.alias(c) if c == "event_time" else F.col(c) for c in df.columns]
    return with_reason.select(
        *kept,
        *[F.when(good, field(n)).alias(n) for n in names],
        reason_column,
    )


def timestamp_from_text(text: Column) -> Column:
    """A timestamp field's time from its JSON text (a string column), or null when the text
    is not RFC 3339 with an offset, names a day that does not exist or falls outside years
    0001-9999 UTC: :func:`modeswitch.control.value_schema.timestamp_text_micros` in Spark SQL,
    with no dependence on the session's time zone. One regular-expression match per value;
    the parts are then read at their fixed places."""
    whole = F.regexp_extract(text, "^" + TIMESTAMP_PATTERN, 0)
    length = F.length(text)
    zone = F.when(F.upper(F.substring(text, -1, 1)) == "Z", F.lit(1)).otherwise(F.lit(6))
    fraction = F.when(
        F.substring(text, 20, 1) == ".", text.substr(F.lit(21), length - 20 - zone)
    ).otherwise(F.lit(""))

    def number(part: Column) -> Column:
        return part.try_cast(LongType())

    days = F.unix_date(F.try_to_date(F.substring(text, 1, 10), "yyyy-MM-dd"))
    clock = (
        number(F.substring(text, 12, 2)) * 3600
        + number(F.substring(text, 15, 2)) * 60
        + number(F.substring(text, 18, 2))
    )
    offset = F.when(
        zone == 6,
        (
            number(text.substr(length - 4, F.lit(2))) * 3600
            + number(text.substr(length - 1, F.lit(2))) * 60
        )
        * F.when(text.substr(length - 5, F.lit(1)) == "-", F.lit(-1)).otherwise(F.lit(1)),
    ).otherwise(F.lit(0))
    micros = (
        days.cast(LongType()) * 86_400_000_000
        + (clock - offset) * 1_000_000
        + number(F.rpad(F.substring(fraction, 1, 6), 6, "0"))
    )
    return F.when(
        (whole == text) & micros.between(MIN_MICROS, MAX_MICROS), F.timestamp_micros(micros)
    )


def check_parse_inputs(
    columns: Sequence[str],
    schema: StructType,
    required: Sequence[str] | None,
    *,
    event_time: str | None = None,
) -> list[str]:
    """The required field names (default: all of ``schema``'s); refuses, before any job,
    required fields the schema lacks, payload fields that clash with input columns, an
    input without ``value``, and an ``event_time`` that is not a timestamp or long field of
    the schema (or an input without ``event_time``)."""
    names = [f.name for f in schema.fields]
    required = list(names if required is None else required)
    unknown = [n for n in required if n not in names]
    if unknown:
        raise ConfigError(
            f"transform: required fields {unknown} are not in the payload schema {names}"
        )
    columns = list(columns)
    clashes = [n for n in [*names, QUARANTINE_REASON] if n in columns]
    if clashes:
        raise ConfigError(f"transform: payload fields {clashes} clash with input columns {columns}")
    if "value" not in columns:
        raise ConfigError(f"transform: the input has no 'value' column (columns: {columns})")
    if event_time is not None:
        kind = schema[event_time].dataType.typeName() if event_time in names else None
        if kind not in EVENT_TIME_TYPES or "event_time" not in columns:
            raise ConfigError(
                f"event_time_field: {event_time!r} must be a timestamp or long field of the "
                f"payload schema {names}, and the input must have an event_time column "
                f"(columns: {columns})",
                setting="event_time_field",
            )
    return required


TYPE_WORDS = {
    **dict.fromkeys(("long", "integer", "short", "byte"), "an integer"),
    **dict.fromkeys(("double", "float", "decimal"), "a number"),
    "string": "a string",
    "timestamp": "a timestamp",
}
"""How a quarantine reason names a payload field's type, by Spark type name; an event-time
field's long is named as :data:`~modeswitch.control.value_schema.EVENT_TIME_TYPES` says."""


def _type_word(dtype: DataType, *, event_time: bool = False) -> str:
    if event_time and dtype.typeName() in EVENT_TIME_TYPES:
        return EVENT_TIME_TYPES[dtype.typeName()]
    return TYPE_WORDS.get(dtype.typeName(), f"a {dtype.simpleString()}")


MOVED_MODULES = {"modeswitch.arrow_parse": "modeswitch.transforms.arrow"}
"""Modules a ``transform`` setting may still name from before the package's subpackages."""


class ArrowForm(NamedTuple):
    """A transform's work on Arrow batches: ``function`` maps the input's batches (the
    ``bucketlog`` columns) to the output's, whose Spark schema is ``schema``. ``function`` is
    pickled to the Python workers."""

    function: Callable[[Iterator[Any]], Iterator[Any]]
    schema: StructType


@dataclass(frozen=True)
class Transform:
    """The pipeline's transform (module docstring): one piece of work in one or two forms.

    - ``name``: how errors name it; :func:`load_transform` gives a plain function the
      ``transform`` setting's value.
    - ``spark``: ``DataFrame -> DataFrame`` on the ``bucketlog`` columns, batch or streaming.
      Calling the transform runs it: ``transform(df)``.
    - ``arrow`` (optional): a function of the input's Spark schema that returns the same
      work's :class:`ArrowForm`; called on the driver (or in the reader's Python worker), its
      :attr:`ArrowForm.function` must be picklable. Both forms must give the same rows.

    Build one at module level and name it in the setting (``pkg.mod:my_transform``) to give
    a transform of your own an Arrow form.
    """

    name: str
    spark: Callable[[DataFrame], DataFrame]
    arrow: Callable[[StructType], ArrowForm] | None = None

    def __call__(self, df: DataFrame) -> DataFrame:
        """The Spark form on ``df``."""
        return self.spark(df)

    def arrow_form(self, input_schema: StructType | None = None) -> ArrowForm | None:
        """The Arrow form for input of ``input_schema`` (by default the ``bucketlog``
        records'), or None without one. Refuses, naming the transform, a form that is not an
        :class:`ArrowForm` or whose output breaks the sink's contract."""
        if self.arrow is None:
            return None
        if input_schema is None:
            from pyspark.sql.pandas.types import from_arrow_schema

            from modeswitch.sources.base import RECORD_SCHEMA

            input_schema = from_arrow_schema(RECORD_SCHEMA)
        form = self.arrow(input_schema)
        if not isinstance(form, ArrowForm):
            raise ConfigError(
                f"transform={self.name!r}: its Arrow form gave a {type(form).__name__}, not an "
                "ArrowForm"
            )
        check_output_schema(form.schema, spec=self.name)
        return form


def load_transform(
    spec: str = DEFAULT_TRANSFORM, *, value_schema: str = "", event_time_field: str = ""
) -> Transform:
    """Resolve the ``transform`` setting to a :class:`Transform`.

    ``value_schema`` (:data:`DEFAULT_TRANSFORM`) is the transform built from the
    ``value_schema`` and ``event_time_field`` settings, given here
    (:func:`modeswitch.transforms.payload.value_schema_transform`). Any other spec is
    ``module:function``, and ``value_schema`` and ``event_time_field`` must then be empty.
    ``function`` may be a dotted path inside the module (``pkg.mod:Parsers.orders``). A
    :class:`Transform` is used as is; a plain function becomes a Transform named ``spec``
    with no Arrow form. A module that moved (:data:`MOVED_MODULES`) is found at its new
    place. Raises :class:`ConfigError` naming the setting and the value when the spec is
    malformed, the module cannot be imported, the attribute is missing, is not callable, or
    is a function carrying an ``arrow_form`` attribute (the Arrow form's old place, no longer
    read: build a :class:`Transform` with ``arrow=`` instead).
    """
    if isinstance(spec, str) and spec.strip() == SCHEMA_TRANSFORM:
        from modeswitch.transforms.payload import value_schema_transform

        return value_schema_transform(value_schema, event_time_field=event_time_field)
    if event_time_field.strip():
        raise ConfigError(
            f"event_time_field: {event_time_field!r} is set, but transform={spec!r} parses the "
            f"records itself (and must keep the log's event_time); use "
            f"transform={SCHEMA_TRANSFORM!r} with value_schema, or leave event_time_field empty",
            setting="event_time_field",
        )
    if value_schema.strip():
        raise ConfigError(
            f"value_schema: {value_schema!r} is set, but transform={spec!r} parses the records "
            f"itself; use transform={SCHEMA_TRANSFORM!r} or leave value_schema empty",
            setting="value_schema",
        )
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ConfigError(f"transform={spec!r}: expected {SCHEMA_TRANSFORM!r} or 'module:function'")
    module_name, _, attr_path = (part.strip() for part in spec.partition(":"))
    module_name = MOVED_MODULES.get(module_name, module_name)
    if not module_name or not attr_path:
        raise ConfigError(f"transform={spec!r}: expected 'module:function'")
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"transform={spec!r}: module {module_name!r} cannot be imported ({exc})"
        ) from exc
    for attr in attr_path.split("."):
        try:
            target = getattr(target, attr)
        except AttributeError as exc:
            raise ConfigError(
                f"transform={spec!r}: module {module_name!r} has no attribute {attr_path!r}"
            ) from exc
    if isinstance(target, Transform):
        log.info("transform %s loaded (%s)", spec, target.name)
        return target
    if not callable(target):
        raise ConfigError(
            f"transform={spec!r}: {attr_path!r} is a {type(target).__name__}, not a callable"
        )
    if hasattr(target, "arrow_form"):
        raise ConfigError(
            f"transform={spec!r}: {attr_path!r} carries an arrow_form attribute, which is no "
            "longer read; make it a modeswitch.transforms.Transform(name, spark=..., "
            "arrow=...) to keep its Arrow form"
        )
    log.info("transform %s loaded (a Spark form only)", spec)
    return Transform(name=spec, spark=target)  # type: ignore[arg-type]


def reader_options(spec: str, value_schema: str = "", event_time_field: str = "") -> dict[str, str]:
    """The ``bucketlog`` reader's options that run the transform ``spec`` (with
    ``value_schema`` and ``event_time_field``) inside the reader: its ``transform`` and, when
    set, ``valueSchema`` and ``eventTimeField``."""
    return {
        "transform": spec,
        **({"valueSchema": value_schema} if value_schema else {}),
        **({"eventTimeField": event_time_field} if event_time_field else {}),
    }


def pipeline_transform(settings: PipelineSettings) -> Transform:
    """The pipeline's transform: :func:`load_transform` of its ``transform``, ``value_schema``
    and ``event_time_field`` settings."""
    return load_transform(
        settings.transform,
        value_schema=settings.value_schema,
        event_time_field=settings.event_time_field,
    )


def pipeline_reader_options(settings: PipelineSettings) -> dict[str, str]:
    """The ``bucketlog`` reader's options that run the pipeline's transform inside the reader
    (:func:`reader_options` of the same three settings)."""
    return reader_options(settings.transform, settings.value_schema, settings.event_time_field)


def check_output_schema(schema: StructType, *, spec: str | None = None) -> None:
    """Refuse a transform's output schema that breaks the sink's contract.

    The output must have the columns of :data:`REQUIRED_OUTPUT` with those types. Raises
    :class:`ConfigError` naming the missing or mistyped columns (and ``spec``, if given).
    """
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    missing = [name for name in REQUIRED_OUTPUT if name not in types]
    mistyped = [
        f"{name} ({types[name]}, expected {expected})"
        for name, expected in REQUIRED_OUTPUT.items()
        if name in types and types[name] != expected
    ]
    if not missing and not mistyped:
        return
    problems = []
    if missing:
        problems.append(f"lacks columns {', '.join(missing)}")
    if mistyped:
        problems.append(f"has mistyped columns {', '.join(mistyped)}")
    which = f"transform={spec!r}" if spec else "transform"
    raise ConfigError(
        f"{which}: the output {' and '.join(problems)}; a transform must keep "
        f"{', '.join(SOURCE_COLUMNS)} and add {QUARANTINE_REASON} (null for good records)"
    )


__all__ = [
    "DEFAULT_TRANSFORM",
    "EVENT_SCHEMA",
    "QUARANTINE_REASON",
    "REQUIRED_OUTPUT",
    "SOURCE_COLUMNS",
    "SPARK_SQL_TRANSFORM",
    "ArrowForm",
    "Transform",
    "check_output_schema",
    "check_parse_inputs",
    "load_transform",
    "parse_events",
    "parse_json_values",
    "reader_options",
]
