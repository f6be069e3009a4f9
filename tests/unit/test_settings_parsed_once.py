"""On the Airflow path a task run reads the Variables once and hands the settings on: the
``decide`` task, and the page's command, which hands the control task the settings it
resolved. (The epoch job operator and the lag sensor import Airflow, so their tests are
in tests/airflow/test_settings_parsed_once.py.)"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from modeswitch.airflow.settings import settings_from_airflow
from modeswitch.airflow.tasks import decide_task, submit_control_command
from modeswitch.control.settings import PipelineSettings
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore

pytestmark = pytest.mark.unit


def counting(variables: dict[str, str]) -> tuple[Callable[[str], Any], Counter[str]]:
    """A Variable getter over ``variables`` that counts what it is asked."""
    asked: Counter[str] = Counter()

    def get(key: str) -> Any:
        asked[key] += 1
        return variables.get(key)

    return get, asked


def test_resolving_the_settings_reads_each_variable_once() -> None:
    get, asked = counting({"modeswitch_enter_threshold": "2m", "modeswitch_parallelism": "3"})
    settings = settings_from_airflow({"parallelism": "4"}, get_variable=get)
    assert settings.policy.enter_threshold == timedelta(minutes=2)
    assert settings.planner.parallelism == 4  # the run param over the Variable
    assert set(asked.values()) == {1}
    assert len(asked) == len(PipelineSettings.names()) + 1  # and modeswitch_config_file


def test_a_decide_task_run_reads_each_variable_once(tmp_path) -> None:
    SegmentLog.create(str(tmp_path / "log"), buckets=2)
    get, asked = counting(
        {
            "modeswitch_source": str(tmp_path / "log"),
            "modeswitch_warehouse": str(tmp_path / "warehouse"),
        }
    )
    plan = decide_task({"dry_run": True}, get_variable=get, idle_wait=0)
    assert set(asked.values()) == {1}
    # What the next tasks of the run read instead of the Variables.
    assert PipelineSettings.from_json(plan["settings"]).source == str(tmp_path / "log")


def test_a_command_given_resolved_settings_reads_no_variable(tmp_path) -> None:
    settings = PipelineSettings.from_mapping(
        {"source": str(tmp_path / "log"), "warehouse": str(tmp_path / "warehouse")}
    )
    get, asked = counting({})
    queued = submit_control_command(
        {"command": "pause", "note": "n"}, settings=settings, get_variable=get, issuer="page op"
    )
    assert asked == Counter()
    (command,) = StateStore.from_settings(settings).commands.list()
    assert (queued["command"], command.kind, command.issuer) == (command.id, "pause", "page op")
