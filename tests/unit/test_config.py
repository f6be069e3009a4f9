"""Planner and policy settings: defaults, parsing of raw strings, refusals that name the
setting and the bad value."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from modeswitch.control.setting_groups import PlannerSettings, PolicySettings
from modeswitch.control.settings import (
    parse_positive_int,
    parse_threshold_count,
    parse_threshold_duration,
)
from modeswitch.errors import ConfigError

pytestmark = pytest.mark.unit


def test_policy_defaults_are_valid_and_hysteretic():
    settings = PolicySettings()
    assert settings.exit_threshold is not None
    assert settings.enter_threshold is not None
    assert settings.exit_threshold <= settings.enter_threshold
    assert settings.watermark_lag_threshold == timedelta(minutes=5)
    assert settings.offset_lag_threshold is None


def test_policy_from_mapping_reads_airflow_variable_strings():
    settings = PolicySettings.from_mapping(
        {
            "watermark_lag_threshold": "PT10M",
            "offset_lag_threshold": "1_000_000",
            "offset_lag_measure": "max_bucket",
            "idle_timeout": "30s",
            "allowed_lateness": "250ms",
            "enter_threshold": "10m",
            "exit_threshold": "1m",
            "enter_dwell": "2m",
            "min_time_in_stream": "15m",
            "min_time_in_batch": "0s",
        }
    )
    assert settings.watermark_lag_threshold == timedelta(minutes=10)
    assert settings.offset_lag_threshold == 1_000_000
    assert settings.offset_lag_measure == "max_bucket"
    assert settings.idle_timeout == timedelta(seconds=30)
    assert settings.allowed_lateness == timedelta(milliseconds=250)
    assert settings.enter_dwell == timedelta(minutes=2)
    assert settings.min_time_in_stream == timedelta(minutes=15)
    assert settings.min_time_in_batch == timedelta(0)


@pytest.mark.parametrize("off", [None, "none", "None", "null", "off", ""])
def test_threshold_none_turns_the_strategy_off(off):
    settings = PolicySettings.from_mapping(
        {"watermark_lag_threshold": off, "offset_lag_threshold": off}
    )
    assert settings.watermark_lag_threshold is None
    assert settings.offset_lag_threshold is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("watermark_lag_threshold", "0s"),
        ("watermark_lag_threshold", "0"),
        ("watermark_lag_threshold", "PT0S"),
        ("enter_threshold", "-5m"),
        ("exit_threshold", -3),
        ("idle_timeout", "0ms"),
        ("offset_lag_threshold", "0"),
        ("offset_lag_threshold", "-10"),
        ("offset_lag_threshold", "lots"),
        ("enter_dwell", "soon"),
        ("min_time_in_stream", "2026-01-01"),
    ],
)
def test_bad_policy_value_is_refused_naming_setting_and_value(name, value):
    with pytest.raises(ConfigError) as info:
        PolicySettings.from_mapping({name: value})
    assert name in str(info.value)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("watermark_lag_threshold", timedelta(0)),
        ("watermark_lag_threshold", timedelta(seconds=-1)),
        ("offset_lag_threshold", 0),
        ("offset_lag_threshold", -1),
        ("enter_dwell", timedelta(seconds=-1)),
        ("enter_dwell", "30s"),  # strings only through from_mapping
    ],
)
def test_constructor_validates_typed_values(name, value):
    with pytest.raises(ConfigError, match=name):
        PolicySettings(**{name: value})


def test_exit_threshold_above_enter_threshold_is_refused():
    with pytest.raises(ConfigError, match=r"exit_threshold.*enter_threshold"):
        PolicySettings.from_mapping({"enter_threshold": "1m", "exit_threshold": "2m"})
    # equal is allowed, and either side None drops the check
    PolicySettings.from_mapping({"enter_threshold": "1m", "exit_threshold": "60s"})
    PolicySettings.from_mapping({"enter_threshold": "none", "exit_threshold": "2h"})


def test_unknown_offset_lag_measure_is_refused():
    with pytest.raises(ConfigError, match=r"offset_lag_measure.*'median'"):
        PolicySettings.from_mapping({"offset_lag_measure": "median"})


def test_unknown_setting_names_are_refused_naming_them():
    with pytest.raises(ConfigError, match="'enter_treshold'") as info:
        PolicySettings.from_mapping({"enter_treshold": "5m", "exit_threshold": "1m"})
    assert "enter_threshold" in str(info.value)  # the known names are listed
    with pytest.raises(ConfigError, match="'waves'"):
        PlannerSettings.from_mapping({"waves": "3"})


def test_planner_from_mapping_and_defaults():
    settings = PlannerSettings.from_mapping(
        {"max_split_records": "500000", "wave_records": "5_000_000", "parallelism": 8}
    )
    assert (settings.max_split_records, settings.wave_records, settings.parallelism) == (
        500_000,
        5_000_000,
        8,
    )
    assert PlannerSettings().parallelism > 0


@pytest.mark.parametrize("name", ["max_split_records", "wave_records", "parallelism"])
@pytest.mark.parametrize("value", [0, -1, "0", "1.5", "many", True])
def test_planner_sizes_must_be_positive_whole_numbers(name, value):
    with pytest.raises(ConfigError) as info:
        PlannerSettings.from_mapping({name: value})
    assert name in str(info.value)
    assert repr(value) in str(info.value)


def test_value_parsers():
    assert parse_positive_int(" 42 ", setting="x") == 42
    assert parse_threshold_duration("PT5M", setting="x") == timedelta(minutes=5)
    assert parse_threshold_duration(timedelta(seconds=1), setting="x") == timedelta(seconds=1)
    assert parse_threshold_count(7, setting="x") == 7
    with pytest.raises(ConfigError, match="use 'none' to turn it off"):
        parse_threshold_count(0, setting="x")


def test_pipeline_settings_round_trip_and_stream_trigger() -> None:
    from modeswitch.control.settings import PipelineSettings

    settings = PipelineSettings.from_mapping(
        {"max_records_per_trigger": "none", "stream_trigger": "available_now", "pipeline": "p"}
    )
    assert settings.max_records_per_trigger is None
    assert PipelineSettings.from_json(settings.to_json()) == settings
    assert settings.sink.endswith("/p")
    assert settings.checkpoint(3).endswith("/_modeswitch/p/checkpoints/epoch-3")
    with pytest.raises(ConfigError, match="stream_trigger: 'sometimes'"):
        PipelineSettings.from_mapping({"stream_trigger": "sometimes"})
    with pytest.raises(ConfigError, match="unknown pipeline setting"):
        PipelineSettings.from_mapping({"wave_size": "10"})


def test_stream_ends_by_is_a_time_with_its_offset_and_ends_a_stream_before_its_runtime() -> None:
    from modeswitch.control.settings import PipelineSettings
    from modeswitch.modes.stream import stream_deadline

    start = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    settings = PipelineSettings.from_mapping(
        {"max_stream_runtime": "10m", "stream_ends_by": "2026-11-29T13:05:00+01:00"}
    )
    assert settings.stream_ends_by == start + timedelta(minutes=5)  # read in UTC
    assert PipelineSettings.from_json(settings.to_json()) == settings
    assert stream_deadline(settings, start) == (
        start + timedelta(minutes=5),
        "stream_ends_by 2026-11-29T12:05:00+00:00 reached",
    )
    # The runtime when it ends first; no end by default.
    assert stream_deadline(settings, start - timedelta(minutes=8))[1] == (
        "max_stream_runtime 0:10:00 reached"
    )
    assert PipelineSettings().stream_ends_by is None
    with pytest.raises(ConfigError, match="stream_ends_by: '2026-11-29T12:05:00' is not a time"):
        PipelineSettings.from_mapping({"stream_ends_by": "2026-11-29T12:05:00"})  # no offset
    with pytest.raises(ConfigError, match="stream_ends_by: 'noon' is not a time with its offset"):
        PipelineSettings.from_mapping({"stream_ends_by": "noon"})


def test_batch_writer_defaults_to_native_and_refuses_an_unknown_writer() -> None:
    from modeswitch.airflow.settings import settings_from_airflow
    from modeswitch.control.settings import PipelineSettings

    assert PipelineSettings().batch_writer == "native"
    settings = PipelineSettings.from_mapping({"batch_writer": " Python "})
    assert settings.batch_writer == "python"
    assert PipelineSettings.from_json(settings.to_json()) == settings
    variables = {"modeswitch_batch_writer": "python"}
    assert settings_from_airflow(get_variable=variables.get).batch_writer == "python"
    with pytest.raises(ConfigError, match=r"modeswitch_batch_writer.*'jvm' is not one of"):
        settings_from_airflow(get_variable={"modeswitch_batch_writer": "jvm"}.get)


def test_layered_settings_name_the_layer_of_a_bad_value() -> None:
    from modeswitch.control.settings_layers import layer_settings

    settings = layer_settings(
        ("config file", {"wave_records": "500"}), ("run params", {"wave_records": "700"})
    )
    assert settings.planner.wave_records == 700
    with pytest.raises(ConfigError, match=r"^Airflow Variable enter_threshold: '0s'"):
        layer_settings(("Airflow Variable", {"enter_threshold": "0s"}))


def test_batch_reader_defaults_to_auto_and_refuses_an_unknown_reader() -> None:
    from modeswitch.control.settings import PipelineSettings

    assert PipelineSettings().batch_reader == "auto"
    assert PipelineSettings().transform == "value_schema"  # built from value_schema
    assert PipelineSettings.from_mapping({"batch_reader": " BucketLog "}).batch_reader == (
        "bucketlog"
    )
    with pytest.raises(
        ConfigError, match=r"batch_reader: 'kafka' is not one of auto, arrow, bucketlog"
    ):
        PipelineSettings.from_mapping({"batch_reader": "kafka"})


def test_a_batch_on_arrow_waves_gets_the_quick_jit_and_every_other_path_the_defaults() -> None:
    """The driver JVM of a batch on Arrow waves runs no record: C1 only. Where Spark's own
    reader or writer runs the records (or the path is not known), the JVM's defaults."""
    from modeswitch.control.settings import PipelineSettings
    from modeswitch.modes.job import resolve_job
    from modeswitch.runners.jobs import QUICK_JIT, job_spark_conf

    settings = PipelineSettings()
    arrow = resolve_job(settings, "batch").waves
    assert arrow is not None and arrow.reader == "arrow"
    assert job_spark_conf("batch", settings, arrow) == {
        "spark.driver.memory": "1g",
        "spark.driver.extraJavaOptions": f"-Xms1g {QUICK_JIT}",
    }
    unsized = PipelineSettings.from_mapping({"batch_driver_memory": "none"})
    assert job_spark_conf("batch", unsized, arrow) == {"spark.driver.extraJavaOptions": QUICK_JIT}
    native = resolve_job(PipelineSettings.from_mapping({"batch_reader": "native"}), "batch")
    assert native.waves is not None and native.waves.reader != "arrow"
    assert job_spark_conf("batch", settings, native.waves) == job_spark_conf("batch", settings)
    assert job_spark_conf("batch", settings) == {
        "spark.driver.memory": "1g",
        "spark.driver.extraJavaOptions": "-Xms1g",
    }
    assert job_spark_conf("stream", settings) == {}


def test_batch_driver_memory_is_a_jvm_size_of_at_least_512m_or_none() -> None:
    from modeswitch.control.settings import PipelineSettings
    from modeswitch.runners.jobs import job_spark_conf

    assert PipelineSettings().batch_driver_memory == "1g"
    settings = PipelineSettings.from_mapping({"batch_driver_memory": " 1536M "})
    assert settings.batch_driver_memory == "1536m"
    assert job_spark_conf("batch", settings) == {
        "spark.driver.memory": "1536m",
        "spark.driver.extraJavaOptions": "-Xms1536m",
    }
    assert job_spark_conf("stream", settings) == {}
    assert PipelineSettings.from_mapping(settings.to_mapping()) == settings
    off = PipelineSettings.from_mapping({"batch_driver_memory": "none"})
    assert off.batch_driver_memory == "" and job_spark_conf("batch", off) == {}
    assert PipelineSettings.from_mapping(off.to_mapping()) == off
    with pytest.raises(ConfigError, match=r"batch_driver_memory: '256m' is less than 512m"):
        PipelineSettings.from_mapping({"batch_driver_memory": "256m"})
    with pytest.raises(ConfigError, match=r"batch_driver_memory: 'lots' is not a memory size"):
        PipelineSettings.from_mapping({"batch_driver_memory": "lots"})
    with pytest.raises(ConfigError, match=r"batch_driver_memory: '1 GB'"):
        PipelineSettings(batch_driver_memory="1 GB")


def test_stream_standby_is_a_switch_on_by_default() -> None:
    from modeswitch.control.settings import PipelineSettings

    assert PipelineSettings().stream_standby is True
    for raw, expected in [
        ("false", False),
        (" Off ", False),
        ("no", False),
        ("0", False),
        ("TRUE", True),
        ("on", True),
        (True, True),
        (False, False),
    ]:
        settings = PipelineSettings.from_mapping({"stream_standby": raw})
        assert settings.stream_standby is expected, raw
        assert PipelineSettings.from_mapping(settings.to_mapping()) == settings
    with pytest.raises(ConfigError, match=r"stream_standby: 'sometimes' is not on or off"):
        PipelineSettings.from_mapping({"stream_standby": "sometimes"})
    with pytest.raises(ConfigError, match=r"stream_standby: 1 is not true or false"):
        PipelineSettings(stream_standby=1)


def test_the_engine_is_auto_by_default_warm_or_submit_on_request_and_nothing_else() -> None:
    from modeswitch.control.settings import PipelineSettings

    assert PipelineSettings().engine == "auto"
    for given, engine in ((" Warm ", "warm"), ("SUBMIT", "submit")):
        settings = PipelineSettings.from_mapping({"engine": given})
        assert settings.engine == engine
        assert PipelineSettings.from_json(settings.to_json()) == settings
    with pytest.raises(ConfigError, match=r"engine: 'hot' is not one of auto, submit, warm"):
        PipelineSettings.from_mapping({"engine": "hot"})


def test_a_job_refuses_bad_settings_before_it_starts_a_jvm(monkeypatch, caplog) -> None:
    from modeswitch.runners import jobs as jobrunner
    from modeswitch.runners import session

    def no_session(*args, **kwargs):
        raise AssertionError("a Spark session was started for settings that are refused")

    monkeypatch.setattr(session, "create_spark_session", no_session)  # imported by the job
    argv = ["--pipeline", "x", "--epoch", "1", "--config", '{"batch_driver_memory": "100m"}']
    assert jobrunner.main("batch", "test", argv) == 1
    assert "batch_driver_memory: '100m' is less than 512m" in caplog.text


# One bad value for each kind of check a layered value goes through: each parser of
# control/values.py, each settings class's own validation, the Kafka source's parse.
BAD_LAYER_VALUES = [
    ("enter_threshold", "0s"),  # parse_threshold_duration
    ("allowed_lateness", "soon"),  # parse_duration
    ("offset_lag_threshold", "-3"),  # parse_threshold_count
    ("max_split_records", "many"),  # parse_positive_int
    ("stream_standby", "maybe"),  # parse_bool
    ("batch_driver_memory", "100m"),  # parse_jvm_memory
    ("offset_lag_measure", "median"),  # PolicySettings
    ("exit_threshold", "1h"),  # PolicySettings: above enter_threshold
    ("log_retention", "1m"),  # MaintenanceSettings
    ("vacuum_retention", "30m"),  # MaintenanceSettings
    ("pipeline", "a pipeline"),  # PipelineSettings
    ("stream_trigger", "sometimes"),  # PipelineSettings
    ("transform", "parse_events"),  # PipelineSettings
    ("source", "kafka://"),  # KafkaLocation.parse
]


@pytest.mark.parametrize(("name", "value"), BAD_LAYER_VALUES)
def test_a_bad_value_in_a_layer_is_reported_with_that_layer_s_name(name, value) -> None:
    from modeswitch.airflow.settings import settings_from_airflow
    from modeswitch.control.settings import PipelineSettings

    with pytest.raises(ConfigError) as bare:
        PipelineSettings.from_mapping({name: value})
    assert bare.value.setting == name
    assert str(bare.value).startswith(f"{name}: ")  # the message as it always was
    variables = {f"modeswitch_{name}": value, "modeswitch_trigger_interval": "2s"}
    with pytest.raises(ConfigError) as layered:
        settings_from_airflow(get_variable=variables.get)
    assert str(layered.value) == f"Airflow Variable 'modeswitch_{name}': {bare.value}"


def test_a_bad_value_is_reported_with_the_last_layer_that_set_it() -> None:
    from modeswitch.control.settings_layers import layer_settings

    with pytest.raises(ConfigError) as raised:
        layer_settings(
            ("config file p.toml:", {"enter_threshold": "10m", "parallelism": "0"}),
            ("run param settings:", {"enter_threshold": "0s"}),
        )
    assert str(raised.value) == (
        "run param settings: enter_threshold: '0s' must be greater than 0 (use 'none' to turn "
        "it off)"
    )
    with pytest.raises(ConfigError, match=r"^config file p.toml: parallelism: '0' must be"):
        layer_settings(("config file p.toml:", {"parallelism": "0"}), ("run param settings:", {}))


def test_a_settings_constructor_names_the_setting_it_refuses() -> None:
    from modeswitch.control.setting_groups import MaintenanceSettings

    for build, name in [
        (lambda: PlannerSettings(parallelism=0), "parallelism"),
        (lambda: PolicySettings(min_time_in_batch=timedelta(seconds=-1)), "min_time_in_batch"),
        (lambda: MaintenanceSettings(compact_target_mb=0), "compact_target_mb"),
    ]:
        with pytest.raises(ConfigError, match=f"^{name}: ") as raised:
            build()
        assert raised.value.setting == name
