"""The wave seam (modeswitch.modes.wave_path.choose_wave_path): one scenario per rule of its
tables, on the log classes' own capabilities (modeswitch.sources.log_type)."""

from __future__ import annotations

import dataclasses

import pytest

from modeswitch.errors import ConfigError
from modeswitch.modes.wave_path import WavePath, choose_wave_path
from modeswitch.sources import log_type
from modeswitch.sources.kafka import KafkaLog
from modeswitch.sources.segments import SegmentLog
from modeswitch.transforms import SPARK_SQL_TRANSFORM, load_transform
from modeswitch.transforms.arrow import parse_events_arrow

pytestmark = pytest.mark.unit

SEGMENTS = log_type("/data/log")  # the embedded log: contiguous, Parquet files
KAFKA = log_type("kafka://events")  # gaps, no files
ARROW = parse_events_arrow  # has an Arrow form
SPARK_ONLY = load_transform(SPARK_SQL_TRANSFORM)  # from_json: no Arrow form


def path(capabilities, reader: str, writer: str = "native", transform=ARROW, **kw) -> WavePath:
    return choose_wave_path(
        capabilities, batch_reader=reader, batch_writer=writer, transform=transform, **kw
    )


def shape(found: WavePath) -> tuple[str, str, str, bool]:
    return (found.reader, found.writer, found.transform, found.count_checked)


def test_the_log_classes_say_what_they_can_do_without_being_opened() -> None:
    assert SEGMENTS is SegmentLog and (SEGMENTS.contiguous, SEGMENTS.parquet_files) == (True, True)
    assert KAFKA is KafkaLog and (KAFKA.contiguous, KAFKA.parquet_files) == (False, False)
    assert (SEGMENTS.spark_source, KAFKA.spark_source) == ("bucketlog", "kafka")
    config = {"bootstrap.servers": "broker:9092"}  # not contacted
    assert KafkaLog("kafka://events", config).event_time_indexed
    assert not KafkaLog("kafka://events?event_time=ts", config).event_time_indexed


@pytest.mark.parametrize("writer", ["native", "python"])
def test_arrow_waves_on_the_segment_log_check_the_count_whatever_the_writer(writer: str) -> None:
    assert shape(path(SEGMENTS, "arrow", writer)) == ("arrow", "arrow", "arrow", True)


def test_arrow_waves_on_kafka_expect_no_count() -> None:
    assert shape(path(KAFKA, "arrow")) == ("arrow", "arrow", "arrow", False)


def test_arrow_waves_refuse_a_transform_without_an_arrow_form_naming_the_settings() -> None:
    with pytest.raises(ConfigError) as err:
        path(SEGMENTS, "arrow", transform=SPARK_ONLY)
    assert "batch_reader: 'arrow'" in str(err.value)
    assert f"transform={SPARK_SQL_TRANSFORM!r} has none" in str(err.value)


@pytest.mark.parametrize("transform", [ARROW, SPARK_ONLY])
def test_native_read_and_write_on_the_segment_log_check_the_count(transform) -> None:
    found = path(SEGMENTS, "native", "native", transform)
    assert shape(found) == ("native", "native", "spark", True)


def test_native_read_with_the_python_writer_reads_through_bucketlog() -> None:
    found = path(SEGMENTS, "native", "python")
    assert shape(found) == ("bucketlog", "python", "spark", False)
    assert "batch_writer='python'" in found.reason


@pytest.mark.parametrize("writer", ["native", "python"])
def test_native_read_on_kafka_is_sparks_kafka_source_with_the_writer_asked(writer: str) -> None:
    found = path(KAFKA, "native", writer, source="kafka://events")
    assert shape(found) == ("kafka", writer, "spark", False)
    assert "Spark's Kafka source" in found.reason and "source='kafka://events'" in found.reason


SPARK_FASTER = dataclasses.replace(ARROW, faster="spark")  # as an Avro payload's is


@pytest.mark.parametrize(
    ("log", "transform", "expected"),
    [
        (SEGMENTS, ARROW, ("arrow", "arrow", "arrow", True)),
        (KAFKA, ARROW, ("arrow", "arrow", "arrow", False)),
        (SEGMENTS, SPARK_FASTER, ("native", "native", "spark", True)),
        (KAFKA, SPARK_FASTER, ("kafka", "native", "spark", False)),
        (SEGMENTS, SPARK_ONLY, ("native", "native", "spark", True)),
        (KAFKA, SPARK_ONLY, ("kafka", "native", "spark", False)),
    ],
)
def test_auto_runs_the_transforms_faster_form(log, transform, expected) -> None:
    found = path(log, "auto", transform=transform)
    assert shape(found) == expected
    assert found.reason.startswith(
        f"batch_reader='auto' chose {expected[0].replace('kafka', 'native')!r}"
    )


def test_auto_without_a_native_reader_falls_back_to_the_arrow_form_or_bucketlog() -> None:
    assert shape(path(_NoSparkSource, "auto", transform=SPARK_FASTER))[0] == "arrow"
    assert shape(path(_NoSparkSource, "auto", transform=SPARK_ONLY))[0] == "bucketlog"
    backfill = path(SEGMENTS, "auto", transform=ARROW, job="backfill")
    assert shape(backfill) == ("bucketlog", "replace_where", "arrow", False)


class _NoSparkSource:
    contiguous, parquet_files, spark_source = False, False, "bucketlog"


def test_native_read_on_a_log_with_neither_files_nor_a_spark_source_reads_bucketlog() -> None:
    found = path(_NoSparkSource, "native", "python", source="other://x")
    assert shape(found) == ("bucketlog", "python", "spark", False)
    assert "without Parquet files (source='other://x')" in found.reason


@pytest.mark.parametrize("capabilities", [SEGMENTS, KAFKA])
@pytest.mark.parametrize("writer", ["native", "python"])
def test_bucketlog_reads_run_the_spark_form_and_expect_no_count(capabilities, writer) -> None:
    found = path(capabilities, "bucketlog", writer)  # the Arrow parse's Spark form: mapInArrow
    assert shape(found) == ("bucketlog", writer, "spark", False)


@pytest.mark.parametrize(
    ("reader", "writer", "message"),
    [
        ("jvm", "native", "batch_reader: 'jvm' is not one of auto, arrow, bucketlog, native"),
        ("arrow", "spark", "batch_writer: 'spark' is not one of native, python"),
    ],
)
def test_an_unknown_reader_or_writer_is_refused_naming_the_setting(reader, writer, message) -> None:
    with pytest.raises(ConfigError, match=message):
        path(SEGMENTS, reader, writer)


@pytest.mark.parametrize("writer", ["native", "python"])
def test_a_backfill_reads_the_segment_log_natively_whatever_the_writer(writer: str) -> None:
    found = path(SEGMENTS, "native", writer, job="backfill")
    assert shape(found) == ("native", "replace_where", "spark", False)


@pytest.mark.parametrize(
    ("capabilities", "reader"),
    [(SEGMENTS, "arrow"), (SEGMENTS, "bucketlog"), (KAFKA, "arrow"), (KAFKA, "bucketlog")],
)
def test_a_backfill_otherwise_runs_the_arrow_form_inside_bucketlog(capabilities, reader) -> None:
    found = path(capabilities, reader, job="backfill")
    assert shape(found) == ("bucketlog", "replace_where", "arrow", False)


@pytest.mark.parametrize("reader", ["arrow", "bucketlog"])
def test_a_backfill_runs_a_spark_only_transform_on_what_bucketlog_read(reader: str) -> None:
    found = path(KAFKA, reader, transform=SPARK_ONLY, job="backfill")  # no Arrow waves: no refusal
    assert shape(found) == ("bucketlog", "replace_where", "spark", False)


@pytest.mark.parametrize("transform", [ARROW, SPARK_ONLY])
def test_a_backfill_of_a_topic_with_batch_reader_native_reads_through_sparks_kafka_source(
    transform,
) -> None:
    found = path(KAFKA, "native", transform=transform, job="backfill")
    assert shape(found) == ("kafka", "replace_where", "spark", False)
    assert "Spark's Kafka source" in found.reason
