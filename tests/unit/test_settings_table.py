"""The settings table: each setting declared once, at its field (type, default, parser, rule,
doc), and everything else made from those fields: parsing and checking, the Airflow Variable
names, ``modeswitch settings`` and the table in docs/AIRFLOW.md."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from modeswitch.cli import main
from modeswitch.control.settings import BatchReader, Engine, PipelineSettings
from modeswitch.control.settings_layers import variable_name
from modeswitch.control.settings_table import (
    TABLE_END,
    TABLE_START,
    settings_table,
    with_settings_table,
)
from modeswitch.control.values import declared_settings
from modeswitch.errors import ConfigError

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[2] / "docs" / "AIRFLOW.md"
REGENERATE = ".venv/bin/modeswitch settings --update docs/AIRFLOW.md"


def _table_in(markdown: str) -> str:
    start = markdown.index(TABLE_START) + len(TABLE_START) + 1
    return markdown[start : markdown.index(TABLE_END)]


def test_the_docs_settings_table_is_the_one_the_settings_make() -> None:
    documented = _table_in(DOCS.read_text())
    assert documented == settings_table(), (
        f"docs/AIRFLOW.md's settings table differs from the settings' fields "
        f"(modeswitch.control.settings); regenerate it: {REGENERATE}"
    )


def test_the_table_has_one_row_per_setting_with_its_variable_type_and_default() -> None:
    rows = [line.split(" | ") for line in settings_table().splitlines()[2:]]
    assert [row[0].strip("| `") for row in rows] == list(PipelineSettings.names())
    by_name = {row[0].strip("| `"): row[1:] for row in rows}
    assert by_name["enter_threshold"][:3] == [
        "`modeswitch_enter_threshold`",
        "duration or `none`",
        "`5m`",
    ]
    assert by_name["batch_reader"][1:3] == ["`auto`, `arrow`, `bucketlog`, `native`", "`auto`"]
    assert by_name["sink"][2] == "`<warehouse>/<pipeline>`"  # derived, so shown as such
    assert by_name["value_schema"][2] == "(none)"
    assert by_name["stream_standby"][1:3] == ["`true` or `false`", "`true`"]


def test_a_variable_is_read_for_every_setting_under_its_table_name() -> None:
    from modeswitch.airflow.settings import read_variables

    asked: list[str] = []
    read_variables(lambda key: asked.append(key))
    assert asked == [variable_name(name) for name in PipelineSettings.names()]


@pytest.mark.parametrize(
    ("name", "choices"),
    [("batch_reader", get_args(BatchReader)), ("engine", get_args(Engine))],
)
def test_a_choice_takes_the_words_of_its_literal_type_and_refuses_others(name, choices) -> None:
    for choice in choices:
        assert getattr(PipelineSettings.from_mapping({name: f" {choice.upper()} "}), name) == (
            choice
        )
    with pytest.raises(ConfigError) as refused:
        PipelineSettings.from_mapping({name: "other"})
    assert str(refused.value) == f"{name}: 'other' is not one of {', '.join(choices)}"
    assert refused.value.setting == name


def test_every_setting_says_what_it_does() -> None:
    from modeswitch.control.settings import SETTINGS_CLASSES

    undocumented = [
        declared.name
        for group in SETTINGS_CLASSES
        for declared in declared_settings(group)
        if len(declared.setting.doc) < 10
    ]
    assert undocumented == []


def test_modeswitch_settings_prints_the_table_and_updates_a_file(tmp_path, capsys) -> None:
    assert main(["settings"]) == 0
    assert capsys.readouterr().out == settings_table()
    page = tmp_path / "page.md"
    page.write_text(f"# Settings\n\n{TABLE_START}\n| old |\n{TABLE_END}\n\nAfter.\n")
    assert main(["settings", "--update", str(page)]) == 0
    assert (
        page.read_text()
        == f"# Settings\n\n{TABLE_START}\n{settings_table()}{TABLE_END}\n\nAfter.\n"
    )


def test_a_file_without_the_markers_is_refused_naming_them() -> None:
    with pytest.raises(ConfigError, match="settings-table:start"):
        with_settings_table("# no table here\n")
