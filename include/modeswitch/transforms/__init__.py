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

A transform's Spark form runs unchanged on a streaming DataFrame: Spark SQL functions only, no
action, no aggregation (the JSON parse: :mod:`modeswitch.transforms.spark_json`).

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
(its ``arrowForm`` option, :func:`modeswitch.sources.spark_options.arrow_form_options`); both forms
must give the same rows. The transform built from ``value_schema`` and the Arrow parse
(:data:`modeswitch.transforms.arrow.parse_events_arrow`) have one; a plain function has none.

This package's face only: the contract and the two forms' types
(:mod:`~modeswitch.transforms.contract`), the Spark JSON parse
(:mod:`~modeswitch.transforms.spark_json`), the setting resolved
(:mod:`~modeswitch.transforms.loading`), the transform built from ``value_schema``
(:mod:`~modeswitch.transforms.payload`) and the Arrow parse (:mod:`~modeswitch.transforms.arrow`).
"""

from __future__ import annotations

from modeswitch.transforms.contract import (
    DEFAULT_TRANSFORM,
    QUARANTINE_REASON,
    REQUIRED_OUTPUT,
    SOURCE_COLUMNS,
    SPARK_SQL_TRANSFORM,
    ArrowForm,
    Transform,
    check_output_schema,
)
from modeswitch.transforms.loading import load_transform, payload_transform, pipeline_transform
from modeswitch.transforms.spark_json import (
    EVENT_SCHEMA,
    check_parse_inputs,
    parse_events,
    parse_json_values,
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
    "payload_transform",
    "pipeline_transform",
]
