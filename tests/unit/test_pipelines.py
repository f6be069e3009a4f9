"""Pipelines declared by files and the Variables that tune them (modeswitch.control.pipelines),
and how a task layers a pipeline's settings (modeswitch.airflow.settings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeswitch.airflow.settings import settings_from_airflow, variable_keys
from modeswitch.control.pipelines import (
    LEGACY,
    Pipeline,
    classify_variable,
    list_fleet,
    name_problem,
    state_variable,
    variable_report,
)
from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError

SETTINGS = PipelineSettings.names()


def write(folder: Path, name: str, text: str = "") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_each_file_declares_the_pipeline_named_after_it_beside_modeswitch(tmp_path: Path) -> None:
    write(tmp_path, "orders.toml", 'source = "/logs/orders"\n')
    write(tmp_path, "refunds.json", "{}")
    write(tmp_path, ".hidden.toml")
    write(tmp_path, "notes.txt")
    fleet = list_fleet(tmp_path)
    assert fleet.names() == [LEGACY, "orders", "refunds"]
    assert fleet.refused == {}
    orders = fleet.get("orders")
    assert orders.declared and orders.file == str(tmp_path / "orders.toml")
    assert [orders.dag_id(r) for r in ("pipeline", "lag_alerts")] == [
        "orders_pipeline",
        "orders_lag_alerts",
    ]
    assert not fleet.get(LEGACY).declared
    assert fleet.get(LEGACY).dag_id("control") == "modeswitch_control"  # as it always was
    with pytest.raises(ConfigError, match="'nope' is not declared"):
        fleet.get("nope")


def test_no_folder_is_the_single_pipeline_of_before(tmp_path: Path) -> None:
    assert list_fleet(tmp_path / "absent").pipelines == (Pipeline(LEGACY),)
    assert list_fleet(None).names() == [LEGACY]


def test_a_modeswitch_file_gives_the_deployments_own_pipeline_its_file(tmp_path: Path) -> None:
    write(tmp_path, "modeswitch.toml", "enter_threshold = '20s'\n")
    fleet = list_fleet(tmp_path)
    assert fleet.names() == [LEGACY]
    assert fleet.get(LEGACY).file == str(tmp_path / "modeswitch.toml")


def test_files_that_declare_no_pipeline_are_refused_with_why(tmp_path: Path) -> None:
    write(tmp_path, "orders.toml")
    write(tmp_path, "orders.json")  # the same name twice: the second is refused
    write(tmp_path, "bad name.toml")
    fleet = list_fleet(tmp_path)
    assert fleet.names() == [LEGACY, "orders"]
    assert set(fleet.refused) == {str(tmp_path / "orders.toml"), str(tmp_path / "bad name.toml")}
    assert "as " in fleet.refused[str(tmp_path / "orders.toml")]
    assert "not a valid name" in fleet.refused[str(tmp_path / "bad name.toml")]


def test_a_name_whose_variables_read_as_another_setting_is_refused() -> None:
    settings = ["threshold", "enter_threshold", "records"]
    assert "modeswitch_enter_threshold" in str(name_problem("enter", settings))
    assert name_problem("orders", settings) is None


def test_a_name_whose_variables_read_as_another_pipelines_is_refused(tmp_path: Path) -> None:
    # a's Variable modeswitch_a_b_<setting>, with settings b_x and x, is also a_b's x.
    write(tmp_path, "a.toml")
    write(tmp_path, "a_b.toml")
    fleet = list_fleet(tmp_path, names=["x", "b_x"])
    assert fleet.names() == [LEGACY, "a"]
    assert "beside 'a'" in fleet.refused[str(tmp_path / "a_b.toml")]


def test_a_file_that_names_another_pipeline_is_refused(tmp_path: Path) -> None:
    p = Pipeline("orders", str(write(tmp_path, "orders.toml", 'pipeline = "refunds"\n')))
    with pytest.raises(ConfigError, match=r"orders.toml: pipeline: 'refunds' is not the file"):
        p.file_layer()
    same = Pipeline("orders", str(write(tmp_path, "o2.toml", 'pipeline = "orders"\n')))
    assert same.file_layer() == {"pipeline": "orders"}


@pytest.mark.parametrize(
    ("key", "setting", "pipeline"),
    [
        ("modeswitch_enter_threshold", "enter_threshold", None),
        ("modeswitch_config_file", "config_file", None),
        ("modeswitch_orders_enter_threshold", "enter_threshold", "orders"),
        ("modeswitch_orders_eu_enter_threshold", "enter_threshold", "orders_eu"),
        ("modeswitch_modeswitch_exit_threshold", "exit_threshold", LEGACY),
    ],
)
def test_variables_name_a_setting_of_every_pipeline_or_of_one(key, setting, pipeline) -> None:
    target = classify_variable(key, [LEGACY, "orders", "orders_eu"], SETTINGS)
    assert (target.setting, target.pipeline, target.problem) == (setting, pipeline, "")


def test_variables_that_tune_nothing_are_reported_with_the_nearest_name() -> None:
    keys = [
        "modeswitch_enter_treshold",  # misspelled
        "modeswitch_refunds_enter_threshold",  # no such pipeline
        "modeswitch_orders_pipeline",  # would rename a declared pipeline
        "modeswitch_enter_threshold",
        "modeswitch_orders_exit_threshold",
        state_variable("orders"),  # the lag alerts' own state
    ]
    report = {t.key: t.problem for t in variable_report(keys, [LEGACY, "orders"])}
    assert set(report) == {
        "modeswitch_enter_treshold",
        "modeswitch_refunds_enter_threshold",
        "modeswitch_orders_pipeline",
    }
    assert "did you mean modeswitch_enter_threshold?" in report["modeswitch_enter_treshold"]
    assert "names no setting" in report["modeswitch_refunds_enter_threshold"]
    assert "rename pipeline 'orders'" in report["modeswitch_orders_pipeline"]


def test_a_variable_two_pipelines_could_own_is_applied_to_neither() -> None:
    target = classify_variable("modeswitch_a_b_x", ["a", "a_b"], ["x", "b_x"])
    assert target.setting is None and "applied to neither" in target.problem


def test_environment_variables_are_listed_as_airflow_reads_them(monkeypatch) -> None:
    monkeypatch.setattr(
        "modeswitch.airflow.settings._stored_variable_keys", lambda: ["modeswitch_b"]
    )
    environ = {"AIRFLOW_VAR_MODESWITCH_ENTER_TRESHOLD": "1s", "AIRFLOW_VAR_OTHER": "x"}
    assert variable_keys(environ) == ["modeswitch_b", "modeswitch_enter_treshold"]


# --- a task's layers ---------------------------------------------------------------------------


@pytest.fixture
def orders(tmp_path: Path) -> Pipeline:
    text = f'source = "{tmp_path}/orders-log"\nenter_threshold = "40s"\nexit_threshold = "5s"\n'
    return Pipeline("orders", str(write(tmp_path, "orders.toml", text)))


def test_a_pipelines_layers_deployment_then_file_then_its_own_then_the_run(orders, tmp_path):
    variables = {
        "modeswitch_enter_threshold": "90s",  # the deployment's: below the file
        "modeswitch_max_stream_runtime": "10m",  # the deployment's, the file silent: applies
        "modeswitch_source": "/elsewhere",  # another pipeline's data: not a declared one's
        "modeswitch_sink": "/elsewhere/sink",
        "modeswitch_orders_exit_threshold": "7s",  # its own: over the file
        "modeswitch_refunds_exit_threshold": "1s",  # another pipeline's
    }
    settings = settings_from_airflow(
        {"trigger_interval": "1s"}, get_variable=variables.get, pipeline=orders
    )
    assert settings.pipeline == "orders"
    assert settings.source == f"{tmp_path}/orders-log"
    assert settings.sink.endswith("/orders")
    assert settings.policy.enter_threshold.total_seconds() == 40
    assert settings.policy.exit_threshold.total_seconds() == 7
    assert settings.max_stream_runtime.total_seconds() == 600
    assert settings.trigger_interval.total_seconds() == 1
    # The deployment's own pipeline reads the deployment's Variables as it always did.
    legacy = settings_from_airflow(get_variable=variables.get)
    assert (legacy.pipeline, legacy.source) == (LEGACY, "/elsewhere")
    assert legacy.policy.enter_threshold.total_seconds() == 90


def test_a_bad_value_names_the_variable_or_the_file(orders, tmp_path) -> None:
    with pytest.raises(ConfigError, match="Airflow Variable 'modeswitch_orders_exit_threshold'"):
        settings_from_airflow(
            get_variable={"modeswitch_orders_exit_threshold": "soon"}.get, pipeline=orders
        )
    broken = Pipeline("refunds", str(write(tmp_path, "refunds.toml", 'exit_threshold = "x"\n')))
    with pytest.raises(ConfigError, match=r"pipeline file .*refunds.toml: exit_threshold"):
        settings_from_airflow(get_variable={}.get, pipeline=broken)


def test_a_run_of_a_declared_pipelines_dag_cannot_name_another(orders) -> None:
    with pytest.raises(ConfigError, match="these DAGs run pipeline 'orders'"):
        settings_from_airflow({"pipeline": "refunds"}, get_variable={}.get, pipeline=orders)
    same = settings_from_airflow({"pipeline": "orders"}, get_variable={}.get, pipeline=orders)
    assert same.pipeline == "orders"
