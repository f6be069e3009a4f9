"""The vectorised parse: a payload's JSON parse done on Arrow batches in Python with msgspec, in
place of Spark's ``from_json``: the Arrow form of the default transform (built from
``value_schema``, :mod:`modeswitch.transforms.payload`) and of the demo's parse.

:data:`parse_events_arrow` (``transform = "modeswitch.transforms.arrow:parse_events_arrow"``) gives
the same columns as :func:`modeswitch.transforms.parse_events`, and the same quarantine
reasons, through ``DataFrame.mapInArrow``: each Arrow batch of the source goes to a Python
worker, which decodes every ``value`` with a msgspec decoder built for the payload schema (a
typed decode in C, ~1.2 M records/s on one core here against ~0.3 M for ``from_json``) and
falls back, for a record the typed decode refuses, to a record-by-record reading that follows
Spark's rules (:mod:`modeswitch.transforms.jackson`). It runs unchanged on a streaming
DataFrame (``mapInArrow`` is a narrow map).

What it accepts and refuses, record by record, in this order (the reason of the first that
applies; the typed columns are null on a row with a reason):

- ``value is null``; ``value is not UTF-8`` (a source's
  :data:`~modeswitch.sources.kafka.NOT_UTF8_PREFIX`); ``value is empty`` (nothing but
  whitespace);
- ``value is not valid JSON``: the first JSON value in it does not parse (RFC 8259; text
  after a complete value is ignored, as Spark does);
- ``value is not a JSON object``: it is an array, a string, a number, a boolean or ``null``
  (a string holding a lone UTF-16 surrogate, ``"\\ud800"``, is not valid JSON, as in Spark);
- an object with a raw control character inside a string (which ``from_json`` refuses and
  Spark's ``get_json_object`` takes) is read as an object of nulls, as Spark reads it;
- ``field F is missing or not <type>``: the first required field, in schema order, that is
  absent, null, or of the wrong JSON type. An integer field takes a JSON integer within its
  type's range; a floating-point field any JSON number; a boolean ``true``/``false``; a
  string field any JSON value: a string's text, or the compact JSON text of anything else
  as Spark's Jackson writes it (``5`` gives ``"5"``, ``{"a": [1, "😀"]}`` gives
  ``{"a":[1,"\\uD83D\\uDE00"]}``); a repeated name gives its last value of the right
  type, or null if that is a null.

Where it differs from ``from_json``, deliberately:

- Spark's JSON reader also accepts single-quoted strings and names (``{'a': 1}``); this parse
  is strict JSON and quarantines them as ``value is not valid JSON``.
- A string field given a number with a fraction or an exponent (alone or inside an object or
  array) gets the shortest digits that read back as the same double, as Java 19+ writes it;
  Spark on Java 17 sometimes writes one more (``1e23`` -> ``9.999999999999999E22``).

The property test (``tests/spark/test_arrow_parse.py``) checks the rest against ``from_json``
on generated records: types, nulls, nesting, unicode, trailing text, huge values.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, NamedTuple

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from modeswitch.control.field_types import (
    MAX_MILLIS,
    MIN_MILLIS,
    date_text_days,
    decimal_type,
    timestamp_text_micros,
    wall_clock_text_micros,
)
from modeswitch.control.value_schema import EVENT_TIME_TYPES
from modeswitch.errors import ConfigError
from modeswitch.sources.kafka import NOT_UTF8_PREFIX
from modeswitch.transforms.contract import QUARANTINE_REASON, ArrowForm, Transform
from modeswitch.transforms.jackson import (
    LENIENT_JSON,
    MISTYPED,
    STRICT_JSON,
    JsonObject,
    field_converter,
    integer_range,
    not_an_object_reason,
    raw_decimal_converter,
)
from modeswitch.transforms.spark_json import (
    EVENT_SCHEMA,
    check_parse_inputs,
    type_name,
    type_word,
)

ARROW_TRANSFORM = "modeswitch.transforms.arrow:parse_events_arrow"
"""The ``transform`` setting's value for the demo's events with this parse."""

_ARROW_TYPES = {
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "double": pa.float64(),
    "float": pa.float32(),
    "string": pa.string(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
    "date": pa.date32(),
}


_FROM_TEXT = {
    "timestamp": timestamp_text_micros,
    "timestamp_ntz": wall_clock_text_micros,
    "date": date_text_days,
}
"""The types read as text and converted by their rules (:mod:`modeswitch.control.field_types`)
to what their Arrow type holds: microseconds, days."""


def _arrow_type(spark_type: str) -> pa.DataType | None:
    size = decimal_type(spark_type)
    return _ARROW_TYPES.get(spark_type) if size is None else pa.decimal128(*size)


class ParsedValues(NamedTuple):
    """What :meth:`PayloadParser.parse_values` gives: the payload's columns (null on a
    quarantined row), the reasons (null when good), and the event-time field's time in
    microseconds on every row whose value is a JSON object holding one, quarantined or not
    (null elsewhere, and without an event-time field)."""

    columns: list[pa.Array]
    reasons: pa.Array
    event_micros: pa.Array


class PayloadParser:
    """Parses JSON values into the columns of a payload schema and a quarantine reason.

    ``fields`` are ``(name, type)`` pairs, ``type`` a Spark simple type name (``long``,
    ``integer``, ``short``, ``byte``, ``double``, ``float``, ``string``, ``boolean``,
    ``timestamp``: RFC 3339 text, :func:`~modeswitch.control.value_schema.timestamp_text_micros`);
    ``required`` the names that must be present, non-null and of their type; ``event_time``
    the field (``timestamp``, or ``long`` read as epoch milliseconds) whose time
    :meth:`parse_values` gives, as :func:`modeswitch.transforms.parse_json_values` reads it.
    """

    def __init__(
        self,
        fields: Sequence[tuple[str, str]],
        required: Sequence[str],
        event_time: str | None = None,
    ) -> None:
        unsupported = [f"{n} ({t})" for n, t in fields if _arrow_type(t) is None]
        if unsupported:
            raise ConfigError(
                f"transform: the Arrow parse takes fields of types {sorted(_ARROW_TYPES)} and "
                f"decimal(p,s); "
                f"{', '.join(unsupported)} need modeswitch.transforms:parse_json_values"
            )
        types = dict(fields)
        if event_time is not None and types.get(event_time) not in EVENT_TIME_TYPES:
            raise ConfigError(
                f"event_time_field: {event_time!r} must be a timestamp or long field of the "
                f"payload ({', '.join(f'{n} ({t})' for n, t in fields)})",
                setting="event_time_field",
            )
        self.fields = list(fields)
        self.names = [n for n, _ in fields]
        self.required = [n for n in self.names if n in set(required)]
        self.event_time = event_time
        self.schema = pa.schema([(n, _arrow_type(t)) for n, t in fields])

        def word(name: str, kind: str) -> str:
            if name == event_time:
                return EVENT_TIME_TYPES[kind]
            return type_word(kind)

        self._reasons = {
            n: f"field {n} is missing or not {word(n, t)}" for n, t in fields if n in required
        }
        self._from_text = [
            (i, convert) for i, (_, t) in enumerate(fields) if (convert := _FROM_TEXT.get(t))
        ]
        self._decimals = [
            (i, converter)
            for i, (_, t) in enumerate(fields)
            if (converter := raw_decimal_converter(t)) is not None
        ]
        self._event_position = None if event_time is None else self.names.index(event_time)
        self._required_positions = [self.names.index(n) for n in self.required]
        # Positional attribute names, renamed to the payload's: a JSON name need not be a
        # Python identifier ("user-id", "class").
        self._attributes = [f"f{i}" for i in range(len(self.names))]
        struct = msgspec.defstruct(
            "Payload",
            [
                (a, _python_type(t) | None, None)
                for a, (_, t) in zip(self._attributes, self.fields, strict=True)
            ],
            rename=dict(zip(self._attributes, self.names, strict=True)),
        )
        self._typed = msgspec.json.Decoder(struct)
        self._converters = {n: field_converter(t) for n, t in fields}

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by its arguments (msgspec's decoders do not pickle): how Spark ships it to
        the Python workers."""
        return PayloadParser, (self.fields, self.required, self.event_time)

    def parse(self, values: pa.Array) -> tuple[list[pa.Array], pa.Array]:
        """The payload columns (null on a quarantined row) and the reasons (null when good)
        of a string array of JSON values."""
        parsed = self.parse_values(values)
        return parsed.columns, parsed.reasons

    def parse_values(self, values: pa.Array) -> ParsedValues:
        """:meth:`parse`, with the event time (:class:`ParsedValues`).

        One typed decode per value in a tight loop; the columns are built from the decoded
        records field by field; the values the typed decode refused are read by
        :meth:`_slowly`; then a timestamp's text becomes its time and an event time out of
        its years becomes null; required fields that came out null are found on the Arrow
        columns.
        """
        decode = self._typed.decode
        records: list[Any] = []
        append = records.append
        refused: list[int] = []
        texts = values.to_pylist()
        for index, value in enumerate(texts):
            try:
                append(decode(value))
            except (msgspec.DecodeError, msgspec.ValidationError, TypeError):  # TypeError: null
                append(None)
                refused.append(index)
        lists = [[None if r is None else getattr(r, a) for r in records] for a in self._attributes]
        for position, convert in self._decimals:  # its raw JSON: a decimal's exact digits
            column = lists[position]
            for index, raw in enumerate(column):
                if raw is not None:
                    column[index] = convert(raw)
                    if column[index] is MISTYPED:
                        refused.append(index)  # read again, as Spark reads a repeated name
        refused = sorted(set(refused))
        reasons: list[str | None] = [None] * len(records)
        for index in refused:
            reason, row = self._refused(texts[index])
            if reason is not None:
                reasons[index] = reason
            for column, parsed in zip(lists, row or [None] * len(lists), strict=True):
                column[index] = parsed
        for position, convert in self._from_text:
            lists[position] = [None if v is None else convert(v) for v in lists[position]]
        event: list[Any] = []
        if self._event_position is not None:
            times = lists[self._event_position]
            if self.fields[self._event_position][1] == "long":
                times = [v if v is None or MIN_MILLIS <= v <= MAX_MILLIS else None for v in times]
                lists[self._event_position] = times
                event = [None if v is None else v * 1000 for v in times]
            else:
                event = times
        event_micros = pa.array(event if event else [None] * len(records), pa.int64())
        columns = [pa.array(c, f.type) for c, f in zip(lists, self.schema, strict=True)]
        if self.required:
            positions = self._required_positions
            missing = columns[positions[0]].is_null()
            for position in positions[1:]:
                missing = pc.or_(missing, columns[position].is_null())
            for index in pc.indices_nonzero(missing).to_pylist():
                if reasons[index] is None:
                    first = next(p for p in positions if lists[p][index] is None)
                    reasons[index] = self._reasons[self.names[first]]
        reason_array = pa.array(reasons, pa.string())
        quarantined = reason_array.is_valid()
        if reason_array.null_count != len(reason_array):
            columns = [pc.if_else(quarantined, pa.scalar(None, c.type), c) for c in columns]
        return ParsedValues(columns, reason_array, event_micros)

    def _refused(self, value: str | None) -> tuple[str | None, tuple[Any, ...] | None]:
        """The reason, or the row, of a value the typed decode refused."""
        if value is None:
            return "value is null", None
        if value.startswith(NOT_UTF8_PREFIX):
            return "value is not UTF-8", None
        return self._slowly(value)

    def _slowly(self, value: str) -> tuple[str | None, tuple[Any, ...] | None]:
        """A value the typed decode refused, read the way Spark's ``from_json`` reads it."""
        text = value.lstrip(" \t\n\r")
        if not text:
            return "value is empty", None
        try:
            first, _ = STRICT_JSON.raw_decode(text)
        except ValueError:
            try:
                first, _ = LENIENT_JSON.raw_decode(text)
            except ValueError:
                return "value is not valid JSON", None
            if not isinstance(first, JsonObject):
                return not_an_object_reason(first), None
            first = JsonObject()  # from_json's row of nulls
        if not isinstance(first, JsonObject):
            return not_an_object_reason(first), None
        values: dict[str, Any] = {}
        for name, raw in first:  # a repeated name: its last value that converts (as Spark)
            convert = self._converters.get(name)
            if convert is not None and (parsed := convert(raw)) is not MISTYPED:
                values[name] = parsed
        # The required fields are checked by parse_values, on the converted columns.
        return None, tuple(values.get(n) for n in self.names)

    def batches(
        self, batches: Iterator[pa.RecordBatch], keep: Sequence[str]
    ) -> Iterator[pa.RecordBatch]:
        """``mapInArrow``'s function: each batch with ``keep``'s columns, the payload's and
        :data:`QUARANTINE_REASON`; with an event-time field, ``event_time`` is its time where
        the value holds one (:class:`ParsedValues`) and the batch's elsewhere."""
        for batch in batches:
            parsed = self.parse_values(batch.column("value"))
            kept = [batch.column(n) for n in keep]
            if self.event_time is not None:
                at = keep.index("event_time")
                log_times = kept[at]
                kept[at] = pc.coalesce(parsed.event_micros.cast(log_times.type), log_times)
            yield pa.RecordBatch.from_arrays(
                [*kept, *parsed.columns, parsed.reasons],
                names=[*keep, *self.names, QUARANTINE_REASON],
            )


def _python_type(spark_type: str) -> Any:
    bounds = integer_range(spark_type)
    if bounds is not None:
        return Annotated[int, msgspec.Meta(ge=bounds[0], le=bounds[1])]
    if decimal_type(spark_type) is not None:
        return msgspec.Raw  # converted by raw_decimal_converter: msgspec's own reads "NaN"
    types = {"double": float, "float": float, "string": str, "boolean": bool}
    return types.get(spark_type, str)  # a timestamp's or a date's text (_FROM_TEXT)


def parse_json_values_arrow(
    df: Any,
    schema: Any,
    *,
    required: Sequence[str] | None = None,
    event_time: str | None = None,
) -> Any:
    """:func:`modeswitch.transforms.parse_json_values` through ``mapInArrow`` and
    :class:`PayloadParser`: the same columns, rows, reasons and event times (see the module's
    doc for the deliberate differences). ``schema`` is a Spark ``StructType`` of simple
    fields."""
    form = json_values_form(df.schema, schema, required=required, event_time=event_time)
    return df.mapInArrow(form.function, form.schema)


def json_values_form(
    input_schema: Any,
    schema: Any,
    *,
    required: Sequence[str] | None = None,
    event_time: str | None = None,
) -> ArrowForm:
    """The Arrow form (:class:`~modeswitch.transforms.ArrowForm`) of
    :func:`parse_json_values_arrow` for input of the Spark schema ``input_schema``: what
    ``mapInArrow`` runs, and what a batch wave's tasks run on the batches they read
    (``batch_reader = arrow``)."""
    from pyspark.sql.types import StringType, StructField, StructType

    required = check_parse_inputs(input_schema.names, schema, required, event_time=event_time)
    parser = PayloadParser(
        [(f.name, type_name(f.dataType)) for f in schema.fields], required, event_time
    )
    out = StructType(
        [*input_schema.fields, *schema.fields, StructField(QUARANTINE_REASON, StringType())]
    )
    return ArrowForm(functools.partial(parser.batches, keep=list(input_schema.names)), out)


@functools.lru_cache(maxsize=8)
def _event_time_parser(field: str, kind: str) -> PayloadParser:
    return PayloadParser([(field, kind)], [], event_time=field)


def payload_event_times(
    values: pa.Array, log_times: pa.Array, *, field: str, kind: str
) -> pa.Array:
    """The event times rows get with ``event_time_field = field`` (a ``kind`` field:
    ``timestamp`` or ``long``): the field's time where the value is a JSON object holding
    one, ``log_times`` elsewhere. Read with this one field alone, which gives what the
    transform built from the whole ``value_schema`` gives (a field is read apart from the
    others): how a backfill's window and the audit of what it filled are matched to records
    without the pipeline's schema."""
    micros = _event_time_parser(field, kind).parse_values(values).event_micros
    return pc.coalesce(micros.cast(log_times.type), log_times)


def _parse_events_with_arrow(df: Any) -> Any:
    return parse_json_values_arrow(df, EVENT_SCHEMA)


def _events_form(input_schema: Any) -> ArrowForm:
    return json_values_form(input_schema, EVENT_SCHEMA)


parse_events_arrow = Transform(
    name=ARROW_TRANSFORM, spark=_parse_events_with_arrow, arrow=_events_form
)
"""The demo's parse with the Arrow parse: ``value`` parsed into
:data:`~modeswitch.transforms.EVENT_SCHEMA`, every field required; its Spark form runs the
parse through ``mapInArrow``, its Arrow form is what a batch wave's tasks and the
``bucketlog`` reader run (:func:`json_values_form`)."""
