"""The transform's contract with the sink, and its two forms.

What every transform gives the sink (the package's docstring, :mod:`modeswitch.transforms`,
says it in full): the ``bucketlog`` columns kept, every row out exactly once, and
:data:`QUARANTINE_REASON`, null for a good record. :class:`Transform` holds one transform's
work in its Spark form and, optionally, its Arrow form (:class:`ArrowForm`);
:func:`check_output_schema` refuses an output that breaks the contract.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from modeswitch.control.value_schema import SCHEMA_TRANSFORM
from modeswitch.errors import ConfigError

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
    - ``faster``: which form does the work on less CPU, for the paths chosen with
      ``batch_reader = auto`` (:func:`modeswitch.modes.wave_path.auto_reader`): ``arrow`` (the
      JSON parse's msgspec form), or ``spark`` (an Avro payload's ``from_avro``).
    - ``columns_from``: what a sink's error names when a column would change type.

    Build one at module level and name it in the setting (``pkg.mod:my_transform``) to give
    a transform of your own an Arrow form.
    """

    name: str
    spark: Callable[[DataFrame], DataFrame]
    arrow: Callable[[StructType], ArrowForm] | None = None
    faster: Literal["arrow", "spark"] = "arrow"
    columns_from: str = ""
    """What the payload's columns and their types come from, as a message names it
    (``value_schema``, ``version 2 of subject 'orders-value'``); empty for a transform of
    one's own."""

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
    "QUARANTINE_REASON",
    "REQUIRED_OUTPUT",
    "SOURCE_COLUMNS",
    "SPARK_SQL_TRANSFORM",
    "ArrowForm",
    "Transform",
    "check_output_schema",
]
