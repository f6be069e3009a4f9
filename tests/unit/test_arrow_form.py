"""The transform object (modeswitch.transforms.Transform): how ``module:function`` settings
resolve to one, its Arrow form, and how batch waves with ``batch_reader = arrow`` refuse before
anything is written a transform that has none."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError
from modeswitch.runners.jobs import run
from modeswitch.sources.base import RECORD_SCHEMA
from modeswitch.transforms import (
    EVENT_SCHEMA,
    QUARANTINE_REASON,
    SPARK_SQL_TRANSFORM,
    ArrowForm,
    Transform,
    load_transform,
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
    form = parse_events_arrow.arrow_form(INPUT)
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
    assert parse_events_arrow.arrow_form().schema == form.schema  # default: bucketlog's records


def test_the_demo_parses_resolve_by_their_names_and_the_old_module_name_still_resolves() -> None:
    assert load_transform(ARROW_TRANSFORM) is parse_events_arrow  # a Transform is used as is
    assert load_transform("modeswitch.arrow_parse:parse_events_arrow") is parse_events_arrow
    sql = load_transform(SPARK_SQL_TRANSFORM)
    assert sql == Transform(name=SPARK_SQL_TRANSFORM, spark=parse_events, arrow=None)
    assert sql.arrow_form(INPUT) is None


def user_transform(df):
    """A user's own Spark transform, named by a ``module:function`` setting."""
    return df


def legacy_arrow_transform(df):
    return df


legacy_arrow_transform.arrow_form = lambda schema: None  # type: ignore[attr-defined]

with_arrow = Transform(
    name="tests.unit.test_arrow_form:with_arrow",
    spark=user_transform,
    arrow=parse_events_arrow.arrow,
)


def test_a_plain_function_becomes_a_transform_with_no_arrow_form_and_a_transform_is_kept() -> None:
    spec = f"{__name__}:user_transform"
    transform = load_transform(spec)
    assert transform == Transform(name=spec, spark=user_transform)
    assert transform("frame") == "frame"  # calling it runs the Spark form
    assert transform.arrow is None and transform.arrow_form(INPUT) is None
    assert load_transform(f"{__name__}:with_arrow") is with_arrow


def test_a_function_carrying_the_old_arrow_form_attribute_is_refused_naming_the_setting() -> None:
    spec = f"{__name__}:legacy_arrow_transform"
    with pytest.raises(ConfigError, match=rf"transform='{spec}': .*arrow_form attribute"):
        load_transform(spec)


def test_a_form_that_is_not_an_arrow_form_or_breaks_the_contract_is_refused() -> None:
    not_a_form = Transform("m:f", user_transform, arrow=lambda schema: (lambda b: b, schema))
    with pytest.raises(ConfigError, match=r"transform='m:f': its Arrow form gave a tuple"):
        not_a_form.arrow_form(INPUT)

    drops_the_reason = Transform(
        "m:g",
        user_transform,
        arrow=lambda schema: ArrowForm(
            lambda b: b, StructType([*schema.fields, StructField("extra", StringType())])
        ),
    )
    with pytest.raises(ConfigError, match=r"transform='m:g'.*lacks columns _quarantine_reason"):
        drops_the_reason.arrow_form(INPUT)


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
        run("batch", None, settings, epoch=1)  # the job's entry resolves it first
    assert not (tmp_path / "warehouse").exists()  # no control table, no sink: nothing written
