"""What the decoders of binary payloads share (Avro's, :mod:`modeswitch.transforms.avro`;
Protobuf's, :mod:`modeswitch.transforms.protobuf`): a value's bytes back from the source's
text, decoded rows made the payload's columns, and a decoder's Arrow form.

A decoder here is an object with ``columns`` (the payload's Arrow fields) and
``decode(values, buckets, offsets)``, which gives the columns and the reasons of a batch's
values.
"""

from __future__ import annotations

import binascii
import functools
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from modeswitch.sources.kafka import NOT_UTF8_PREFIX
from modeswitch.transforms.contract import QUARANTINE_REASON, ArrowForm

_PREFIX_LENGTH = len(NOT_UTF8_PREFIX)
_DOES_NOT_FIT = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError)


def value_bytes(text: str) -> bytes:
    """A value's bytes from the text a source keeps them as
    (:data:`~modeswitch.sources.kafka.NOT_UTF8_PREFIX` and base64 where they are not UTF-8,
    the text's UTF-8 otherwise)."""
    if text.startswith(NOT_UTF8_PREFIX):
        return binascii.a2b_base64(text[_PREFIX_LENGTH:])
    return text.encode("utf-8")


def fitted_columns(
    rows: list[tuple | dict | None],
    reasons: list[str | None],
    struct: pa.StructType,
    reason_of: Callable[[int], str],
) -> list[pa.Array]:
    """``rows`` as the columns of ``struct`` (null where a row is None). A row whose values do
    not fit their columns (a decimal wider than its precision, a time out of range) is made
    None, its reason in ``reasons`` ``reason_of(its index)``."""
    try:
        return pa.array(rows, struct).flatten()
    except _DOES_NOT_FIT:
        for index, row in enumerate(rows):
            if row is None:
                continue
            try:
                pa.array([row], struct)
            except _DOES_NOT_FIT:
                rows[index] = None
                reasons[index] = reason_of(index)
        return pa.array(rows, struct).flatten()


def decoder_form(input_schema: Any, *, decoder: Any) -> ArrowForm:
    """The Arrow form of ``decoder`` for input of ``input_schema``: its batches with the
    payload's columns and :data:`~modeswitch.transforms.contract.QUARANTINE_REASON` added."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StringType, StructField, StructType

    payload = from_arrow_schema(pa.schema(decoder.columns))
    out = StructType(
        [*input_schema.fields, *payload.fields, StructField(QUARANTINE_REASON, StringType())]
    )
    return ArrowForm(
        functools.partial(decoded_batches, decoder=decoder, keep=list(input_schema.names)), out
    )


def decoded_batches(
    batches: Iterator[pa.RecordBatch], *, decoder: Any, keep: list[str]
) -> Iterator[pa.RecordBatch]:
    """The Arrow form's work: each batch's ``keep`` columns with the payload's columns and the
    reason added."""
    names = [column.name for column in decoder.columns]
    for batch in batches:
        columns, reasons = decoder.decode(
            batch.column("value"), batch.column("bucket"), batch.column("offset")
        )
        yield pa.RecordBatch.from_arrays(
            [*(batch.column(name) for name in keep), *columns, reasons],
            names=[*keep, *names, QUARANTINE_REASON],
        )


__all__ = ["decoded_batches", "decoder_form", "fitted_columns", "value_bytes"]
