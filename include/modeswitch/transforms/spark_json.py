"""The transform's Spark form for JSON payloads: Spark SQL's ``from_json`` with an explicit
schema and column checks, no Python UDF, no action, no aggregation, so it runs unchanged on a
streaming DataFrame (:func:`parse_json_values`; the demo's events: :func:`parse_events`).

What Spark's JSON reader accepts and this parse therefore accepts too: text after a complete
JSON object is ignored (``{"event_id": 1} trailing``), a string field takes any JSON value as
its text (``"action": 5`` gives ``"5"``), and an integer is a valid double. The Arrow form
(:mod:`modeswitch.transforms.arrow`) reads the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from modeswitch.control.field_types import (
    DATE_PATTERN,
    MAX_MICROS,
    MAX_MILLIS,
    MIN_MICROS,
    MIN_MILLIS,
    TIMESTAMP_PATTERN,
    WALL_CLOCK_PATTERN,
)
from modeswitch.control.value_schema import EVENT_TIME_TYPES
from modeswitch.errors import ConfigError
from modeswitch.sources.kafka import NOT_UTF8_PREFIX
from modeswitch.transforms.contract import QUARANTINE_REASON

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
    with an offset, :mod:`modeswitch.control.field_types`), a TIMESTAMP_NTZ field by
    :func:`wall_clock_from_text` (the same without one), not by Spark's own timestamp
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

    # Timestamps and dates as text (inside nested types too), converted by their rules below;
    # a decimal by from_json itself (a number's exact digits: as text it would be a double's).
    read_fields = [StructField(f.name, read_type(f.dataType)) for f in schema.fields]
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
        converted = from_text(parsed.getField(f.name), f.dataType)
        if converted is not None:
            conversions[f.name] = converted
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
    0001-9999 UTC: :func:`modeswitch.control.field_types.timestamp_text_micros` in Spark SQL,
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


def wall_clock_from_text(text: Column) -> Column:
    """A TIMESTAMP_NTZ field's wall-clock time from its JSON text (a string column), or null
    when the text is not ``YYYY-MM-DDThh:mm:ss[.fraction]`` (no offset) naming a day that
    exists: :func:`modeswitch.control.field_types.wall_clock_text_micros` in Spark SQL, built
    from its parts (no time zone is involved: a wall-clock time is not an instant)."""
    fraction = F.when(F.substring(text, 20, 1) == ".", text.substr(F.lit(21), F.lit(6)))
    seconds = F.concat(
        F.substring(text, 18, 2), F.lit("."), F.rpad(F.coalesce(fraction, F.lit("")), 6, "0")
    ).cast(DecimalType(8, 6))

    def part(start: int, length: int) -> Column:
        return F.substring(text, start, length).cast(IntegerType())

    return F.when(
        text.rlike(f"^{WALL_CLOCK_PATTERN}$"),
        F.try_make_timestamp_ntz(
            part(1, 4), part(6, 2), part(9, 2), part(12, 2), part(15, 2), seconds
        ),
    )


def date_from_text(text: Column) -> Column:
    """A DATE field's day from its JSON text (a string column), or null when the text is not
    ``YYYY-MM-DD`` naming a day that exists in years 0001-9999:
    :func:`modeswitch.control.field_types.date_text_days` in Spark SQL."""
    return F.when(text.rlike(f"^{DATE_PATTERN}$"), F.try_to_date(text, "yyyy-MM-dd"))


_FROM_TEXT: dict[type[DataType], Callable[[Column], Column]] = {
    TimestampType: timestamp_from_text,
    TimestampNTZType: wall_clock_from_text,
    DateType: date_from_text,
}
"""The types read as text and converted by their rules (:mod:`modeswitch.control.field_types`),
as the Arrow form's table of the same name does."""


def read_type(dtype: DataType) -> DataType:
    """The type ``from_json`` reads a ``dtype`` field as: the same, with every time in it (a
    timestamp, a wall-clock time, a date, at any depth) read as its text."""
    if type(dtype) in _FROM_TEXT:
        return StringType()
    if isinstance(dtype, StructType):
        return StructType([StructField(f.name, read_type(f.dataType)) for f in dtype.fields])
    if isinstance(dtype, ArrayType):
        return ArrayType(read_type(dtype.elementType))
    if isinstance(dtype, MapType):
        return MapType(dtype.keyType, read_type(dtype.valueType))
    return dtype


def from_text(column: Column, dtype: DataType) -> Column | None:
    """``column`` (a field read as :func:`read_type` reads ``dtype``) converted to ``dtype``:
    each time by its text rules (:data:`_FROM_TEXT`); None when ``dtype`` holds no time. At
    any depth, a time that does not read is what a value of another type is to ``from_json``
    (measured on Spark 4.2): a struct's field is null and its siblings are kept; an array or a
    map holding one (in itself, or in an array or a map inside it) is null whole."""
    if read_type(dtype) == dtype:
        return None
    convert = _FROM_TEXT.get(type(dtype))
    if convert is not None:
        return convert(column)
    if isinstance(dtype, StructType):
        return F.when(column.isNotNull(), F.struct(*[_field(column, f) for f in dtype.fields]))
    inner = dtype.elementType if isinstance(dtype, ArrayType) else dtype.valueType

    def one(item: Column) -> Column:
        return _item(item, dtype=inner)

    if isinstance(dtype, ArrayType):
        items, converted = column, F.transform(column, one)
    else:
        items, converted = F.map_values(column), F.transform_values(column, lambda _, v: one(v))
    unread = F.exists(items, lambda item: item.isNotNull() & one(item).isNull())
    return F.when(~unread, converted)


def _field(struct: Column, field: StructField) -> Column:
    part = struct.getField(field.name)
    return _item(part, dtype=field.dataType).alias(field.name)


def _item(item: Column, *, dtype: DataType) -> Column:
    converted = from_text(item, dtype)
    return item if converted is None else converted


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
    **dict.fromkeys(("double", "float"), "a number"),
    "string": "a string",
    "timestamp": "a timestamp",
    "timestamp_ntz": "a timestamp without an offset",
    "date": "a date",
    "struct": "an object",
    "map": "an object",
    "array": "an array",
}
"""How a quarantine reason names a payload field's type, by Spark type name; an event-time
field's long is named as :data:`~modeswitch.control.value_schema.EVENT_TIME_TYPES` says."""


def _type_word(dtype: DataType, *, event_time: bool = False) -> str:
    if event_time and dtype.typeName() in EVENT_TIME_TYPES:
        return EVENT_TIME_TYPES[dtype.typeName()]
    return type_word(type_name(dtype))


def type_name(dtype: DataType) -> str:
    """A payload field's Spark type as the parses name it: its ``typeName()`` (``long``), a
    decimal's with its size (``decimal(7,2)``)."""
    return dtype.simpleString() if isinstance(dtype, DecimalType) else dtype.typeName()


def type_word(type_name: str) -> str:
    """How a quarantine reason names a Spark type (by its type name): :data:`TYPE_WORDS`, a
    decimal as ``a number of DECIMAL(p,s)``."""
    if type_name.startswith("decimal("):
        return f"a number of {type_name.upper()}"
    return TYPE_WORDS.get(type_name, f"a {type_name}")


__all__ = [
    "EVENT_SCHEMA",
    "TYPE_WORDS",
    "check_parse_inputs",
    "date_from_text",
    "from_text",
    "parse_events",
    "parse_json_values",
    "read_type",
    "timestamp_from_text",
    "type_name",
    "type_word",
    "wall_clock_from_text",
]
