"""A record's key decoded too (``key_format = avro`` or ``protobuf``): the value's transform,
then the key's decoder, as one :class:`~modeswitch.transforms.contract.Transform`.

:func:`with_key` chains the two in both forms: the value's transform runs first (its columns
and its reason), then the key's decoder (:mod:`modeswitch.transforms.avro` or
:mod:`~modeswitch.transforms.protobuf` on the ``key`` column; its columns are ``key_<field>``,
its reasons name the key: ``key does not decode as Avro with schema id 7 (version 1 of
orders-key)``). A record's reason is the value's where it has one, else the key's; a null key
is no reason and gives null key columns. The ``key`` column stays as the source gave it.

:func:`check_key_names` refuses, before anything runs, a key column named as a value's column.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from modeswitch.errors import ConfigError
from modeswitch.transforms.contract import QUARANTINE_REASON, ArrowForm, Transform

_VALUE_REASON = "_modeswitch_value_reason"
"""The value's reason while the key's decoder adds its own."""


def with_key(value: Transform, key: Transform) -> Transform:
    """``value`` then ``key`` (the key's decoder's transform), as the module docstring says:
    named, faster in the form and with its columns from where ``value``'s are."""
    return Transform(
        name=value.name,
        spark=functools.partial(_spark, value=value, key=key),
        arrow=functools.partial(_arrow, value=value, key=key),
        faster=value.faster,
        columns_from=value.columns_from,
    )


def check_key_names(key_names: Sequence[str], value_names: Sequence[str], *, what: str) -> None:
    """Refuses, naming both, a key column (``key_<field>``) named, case aside, as a column of
    the value's (``what``: where the value's columns come from)."""
    values = {name.lower(): name for name in value_names}
    for name in key_names:
        if name.lower() in values:
            raise ConfigError(
                f"key_format: the key's column {name!r} (its field {name[4:]!r}) clashes with "
                f"the field {values[name.lower()]!r} of {what}; rename one of them, or keep "
                "key_format = 'text'",
                setting="key_format",
            )


def _spark(df: Any, *, value: Transform, key: Transform) -> Any:
    from pyspark.sql import functions as F

    decoded = key(value(df).withColumnRenamed(QUARANTINE_REASON, _VALUE_REASON))
    reason = F.coalesce(F.col(_VALUE_REASON), F.col(QUARANTINE_REASON))
    kept = [f"`{name}`" for name in decoded.columns if name not in _REASONS]
    return decoded.select(*kept, reason.alias(QUARANTINE_REASON))


_REASONS = (_VALUE_REASON, QUARANTINE_REASON)


def _arrow(input_schema: Any, *, value: Transform, key: Transform) -> ArrowForm:
    from pyspark.sql.types import StructField, StructType

    first = value.arrow_form(input_schema)
    assert first is not None and key.arrow is not None, "both transforms have an Arrow form"
    between = StructType(
        [
            StructField(_VALUE_REASON, field.dataType) if field.name == QUARANTINE_REASON else field
            for field in first.schema.fields
        ]
    )
    second = key.arrow(between)
    fields = [f for f in second.schema.fields if f.name not in _REASONS]
    reason = next(f for f in second.schema.fields if f.name == QUARANTINE_REASON)
    return ArrowForm(
        functools.partial(_batches, first=first.function, second=second.function),
        StructType([*fields, reason]),
    )


def _batches(
    batches: Iterator[pa.RecordBatch], *, first: Any, second: Any
) -> Iterator[pa.RecordBatch]:
    renamed = (
        batch.rename_columns(
            [_VALUE_REASON if n == QUARANTINE_REASON else n for n in batch.schema.names]
        )
        for batch in first(batches)
    )
    for batch in second(renamed):
        names = [n for n in batch.schema.names if n not in _REASONS]
        reason = pc.coalesce(batch.column(_VALUE_REASON), batch.column(QUARANTINE_REASON))
        yield pa.RecordBatch.from_arrays(
            [*(batch.column(n) for n in names), reason], names=[*names, QUARANTINE_REASON]
        )


__all__ = ["check_key_names", "with_key"]
