"""A transform's Arrow form (modeswitch.transforms.ArrowForm): how batch waves with
``batch_reader = arrow`` find it, and refuse before anything is written when there is none."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError
from modeswitch.modes.batch import run_batch_epoch, wave_arrow_form
from modeswitch.sources.base import RECORD_SCHEMA
from modeswitch.transforms import (
    EVENT_SCHEMA,
    QUARANTINE_REASON,
    ArrowForm,
    arrow_form_of,
    parse_events,
)
from modeswitch.transforms.arrow import ARROW_TRANSFORM, parse_events_arrow

INPUT = from_arrow_schema(RECORD_SCHEMA)


def records(values: list[str | None]) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([0] * n, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.array([0] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            pa.array(["k"] * n),
            pa.array(values, pa.string()),
        ],
        schema=RECORD_SCHEMA,
    )


def test_the_arrow_parse_has_a_form_whose_function_survives_pickling() -> None:
    form = arrow_form_of(parse_events_arrow, INPUT)
    assert isinstance(form, ArrowForm)
    assert form.schema.names == [*INPUT.names, *EVENT_SCHEMA.names, QUARANTINE_REASON]
    function = pickle.loads(pickle.dumps(form.function))  # what the workers get
    good = '{"event_id": 1, "user_id": 2, "action": "buy", "amount": 1.5, "country": "FR"}'
    (out,) = list(function(iter([records([good, "{oops", None])])))
    assert out.schema.names == form.schema.names
    assert out.column("event_id").to_pylist() == [1, None, None]
    assert out.column(QUARANTINE_REASON).to_pylist() == [
        None,
        "value is not valid JSON",
        "value is null",
    ]


def test_a_transform_without_a_form_has_none_and_a_bad_form_is_refused() -> None:
    assert arrow_form_of(parse_events, INPUT) is None

    def not_a_form(df):
        return df

    not_a_form.arrow_form = lambda schema: (lambda b: b, schema)  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"transform='m:f': its arrow_form gave a tuple"):
        arrow_form_of(not_a_form, INPUT, spec="m:f")

    def drops_the_reason(df):
        return df

    drops_the_reason.arrow_form = lambda schema: ArrowForm(  # type: ignore[attr-defined]
        lambda b: b, StructType([*schema.fields, StructField("extra", StringType())])
    )
    with pytest.raises(ConfigError, match=r"lacks columns _quarantine_reason"):
        arrow_form_of(drops_the_reason, INPUT, spec="m:g")


def test_batch_reader_arrow_refuses_a_transform_without_a_form_before_anything_is_written(
    tmp_path: Path,
) -> None:
    settings = PipelineSettings.from_mapping(
        {
            "source": str(tmp_path / "log"),
            "warehouse": str(tmp_path / "warehouse"),
            "batch_reader": "arrow",
            "transform": "modeswitch.transforms:parse_events",
        }
    )
    with pytest.raises(ConfigError, match=r"batch_reader: 'arrow' .*parse_events' has none"):
        run_batch_epoch(None, settings, 1)
    assert not (tmp_path / "warehouse").exists()  # no control table, no sink: nothing written
    arrow = PipelineSettings.from_mapping({"batch_reader": "arrow", "transform": ARROW_TRANSFORM})
    form = wave_arrow_form(arrow, parse_events_arrow)
    assert form is not None and form.schema.names[-1] == QUARANTINE_REASON
    assert wave_arrow_form(PipelineSettings(batch_reader="native"), parse_events_arrow) is None
