"""The stream seam (modeswitch.modes.stream_path.choose_stream_path): one scenario per row of its
table, on the log classes' own capabilities; and a job resolved once
(modeswitch.modes.job.resolve_job): the path each job kind gets, the payload read once, a
setting that cannot work refused before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.control.value_schema import describe_payload
from modeswitch.errors import ConfigError
from modeswitch.modes.job import resolve_job
from modeswitch.modes.stream_path import StreamPath, choose_stream_path
from modeswitch.sources import log_type
from modeswitch.transforms import SPARK_SQL_TRANSFORM
from modeswitch.transforms.arrow import ARROW_TRANSFORM

pytestmark = pytest.mark.unit

SEGMENTS = log_type("/data/log")  # read by bucketlog
KAFKA = log_type("kafka://events")  # read by Spark's Kafka source


def shape(found: StreamPath) -> tuple[str, str, str]:
    return (found.reader, found.transform, found.writer)


@pytest.mark.parametrize("arrow_form", [True, False])
@pytest.mark.parametrize("writer", ["python", "delta_spark"])
def test_a_topic_is_read_by_sparks_kafka_source_with_the_spark_form(
    arrow_form: bool, writer: str
) -> None:
    found = choose_stream_path(KAFKA, arrow_form=arrow_form, stream_writer=writer)
    assert shape(found) == ("kafka", "spark", writer)
    assert "Kafka" in found.reason and repr(writer) in found.reason


@pytest.mark.parametrize("writer", ["python", "delta_spark"])
def test_bucketlog_runs_an_arrow_form_in_its_reader(writer: str) -> None:
    found = choose_stream_path(SEGMENTS, arrow_form=True, stream_writer=writer)
    assert shape(found) == ("bucketlog", "arrow", writer)


def test_bucketlog_with_a_spark_only_transform_runs_it_on_the_frame() -> None:
    found = choose_stream_path(SEGMENTS, arrow_form=False, stream_writer="python")
    assert shape(found) == ("bucketlog", "spark", "python")
    assert "Spark form only" in found.reason


@pytest.mark.parametrize("log", [SEGMENTS, KAFKA])
@pytest.mark.parametrize("writer", ["auto", "arrow"])
def test_an_arrow_form_is_run_in_each_micro_batch_s_wave_on_either_log(log, writer: str) -> None:
    found = choose_stream_path(log, arrow_form=True, stream_writer=writer)
    assert shape(found) == (log.spark_source, "wave", "arrow")
    assert "Arrow wave" in found.reason and repr(writer) in found.reason


@pytest.mark.parametrize("log", [SEGMENTS, KAFKA])
def test_auto_without_an_arrow_form_is_the_python_writer(log) -> None:
    found = choose_stream_path(log, arrow_form=False, stream_writer="auto")
    assert shape(found) == (log.spark_source, "spark", "python")


def test_the_arrow_writer_without_an_arrow_form_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"^stream_writer: 'arrow' needs a transform") as err:
        choose_stream_path(KAFKA, arrow_form=False, stream_writer="arrow")
    assert err.value.setting == "stream_writer"


def test_an_unknown_stream_writer_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"^stream_writer: 'foreach' is not one of") as err:
        choose_stream_path(SEGMENTS, arrow_form=True, stream_writer="foreach")
    assert err.value.setting == "stream_writer"


def _settings(tmp_path: Path, **extra: str) -> PipelineSettings:
    return PipelineSettings.from_mapping(
        {"source": str(tmp_path / "log"), "warehouse": str(tmp_path / "warehouse"), **extra}
    )


def test_each_job_kind_gets_its_own_seam_and_the_payload_read_once(tmp_path: Path) -> None:
    schema = "id BIGINT NOT NULL, at TIMESTAMP"
    settings = _settings(tmp_path, value_schema=schema, event_time_field="at")
    stream = resolve_job(settings, "stream")
    assert stream.waves is None and stream.stream is not None
    assert shape(stream.stream) == ("bucketlog", "wave", "arrow")
    assert stream.payload == describe_payload("value_schema", schema, "at")
    assert stream.payload.event_time is not None and stream.payload.event_time.name == "at"
    batch = resolve_job(settings, "batch")
    assert batch.stream is None and batch.waves is not None and batch.waves.reader == "arrow"
    backfill = resolve_job(settings, "backfill")
    assert backfill.waves is not None and backfill.waves.writer == "replace_where"
    # The Arrow form is built once per job, and handed to the reader as built.
    assert stream.arrow is stream.arrow
    assert set(stream.reader_arrow_options) == {"arrowForm", "arrowSchema"}
    assert [f.name for f in stream.arrow.schema.fields][-3:] == ["id", "at", "_quarantine_reason"]


def test_a_job_that_cannot_run_is_refused_when_resolved(tmp_path: Path) -> None:
    spark_only = _settings(tmp_path, transform=SPARK_SQL_TRANSFORM, batch_reader="arrow")
    with pytest.raises(ConfigError, match=r"^batch_reader: 'arrow'"):
        resolve_job(spark_only, "batch")
    # The stream job of the same settings has no waves to refuse.
    assert shape(resolve_job(spark_only, "stream").stream) == ("bucketlog", "spark", "python")
    assert resolve_job(_settings(tmp_path, transform=ARROW_TRANSFORM), "batch").waves.reader == (
        "arrow"
    )
