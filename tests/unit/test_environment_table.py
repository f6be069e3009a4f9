"""The environment table: every ``MODESWITCH_*`` variable the package reads declared once, in
:data:`modeswitch.environment.ENVIRONMENT` (name, default, parser, doc), read only through
:func:`~modeswitch.environment.env_value`, and rendered into docs/AIRFLOW.md beside the
settings table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import modeswitch
from modeswitch.environment import (
    BACKFILL_MAX_ACTIVE_RUNS,
    CACHE,
    CDS,
    ENVIRONMENT,
    FAULTS,
    PREFIX,
    SPARK_MASTER,
    STORAGE_OPTIONS,
    TABLE_END,
    TABLE_START,
    env_text,
    env_value,
    environment_table,
    with_environment_table,
)
from modeswitch.errors import ConfigError

pytestmark = pytest.mark.unit

PACKAGE = Path(modeswitch.__file__).parent
TABLE_MODULE = PACKAGE / "environment.py"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "AIRFLOW.md"
REGENERATE = (
    ".venv/bin/python -c 'import pathlib, modeswitch.environment as e; "
    'p = pathlib.Path("docs/AIRFLOW.md"); p.write_text(e.with_environment_table(p.read_text()))\''
)
NAME = re.compile(rf"^{PREFIX}[A-Z0-9_]*$")


def _table_in(markdown: str) -> str:
    start = markdown.index(TABLE_START) + len(TABLE_START) + 1
    return markdown[start : markdown.index(TABLE_END)]


def test_the_docs_environment_table_is_the_one_the_declarations_make() -> None:
    assert _table_in(DOCS.read_text()) == environment_table(), (
        "docs/AIRFLOW.md's environment table differs from modeswitch.environment.ENVIRONMENT; "
        f"regenerate it: {REGENERATE}"
    )


def test_every_variable_is_declared_once_with_its_prefix_and_a_doc() -> None:
    names = [variable.name for variable in ENVIRONMENT]
    assert len(names) == len(set(names))
    assert all(NAME.match(name) for name in names)
    assert [v.name for v in ENVIRONMENT if len(v.doc) < 10] == []
    rows = [line.split(" | ")[0].strip("| `") for line in environment_table().splitlines()[2:]]
    assert rows == names


def test_the_table_shows_each_default_as_a_user_would_write_it() -> None:
    by_name = {
        row[0].strip("| `"): row[1]
        for row in (line.split(" | ") for line in environment_table().splitlines()[2:])
    }
    assert by_name["MODESWITCH_BACKFILL_SCHEDULE"] == "`@daily`"
    assert by_name["MODESWITCH_BACKFILL_MAX_ACTIVE_RUNS"] == "`2`"
    assert by_name["MODESWITCH_CDS"] == "`on`"
    assert by_name["MODESWITCH_CACHE"] == "`~/.cache/modeswitch`"
    assert by_name["MODESWITCH_STORAGE_OPTIONS"] == "(none)"


def test_an_unset_or_blank_variable_reads_as_its_default(monkeypatch, tmp_path) -> None:
    assert env_value(BACKFILL_MAX_ACTIVE_RUNS, {}) == 2
    assert env_value(BACKFILL_MAX_ACTIVE_RUNS, {"MODESWITCH_BACKFILL_MAX_ACTIVE_RUNS": " "}) == 2
    assert env_value(SPARK_MASTER, {"MODESWITCH_SPARK_MASTER": ""}) is None
    assert env_value(CDS, {}) is True
    assert env_value(STORAGE_OPTIONS, {}) == {}
    assert env_value(FAULTS, {}) == {}
    monkeypatch.setenv("HOME", str(tmp_path))  # a machine's default: made when read
    monkeypatch.delenv(CACHE.name, raising=False)
    assert env_value(CACHE) == tmp_path / ".cache" / "modeswitch"


def test_a_set_variable_is_parsed_from_this_process_environment_or_a_mapping(
    monkeypatch,
) -> None:
    monkeypatch.setenv(CACHE.name, "/data/cache")
    assert env_value(CACHE) == Path("/data/cache")
    assert env_value(CACHE, {CACHE.name: "/elsewhere"}) == Path("/elsewhere")
    assert env_value(SPARK_MASTER, {SPARK_MASTER.name: " spark://h:7077 "}) == "spark://h:7077"
    assert env_value(CDS, {CDS.name: "OFF"}) is False
    assert env_value(CDS, {CDS.name: "yes"}) is True
    assert env_value(FAULTS, {FAULTS.name: "a=1.5, b=2@3"}) == {"a": (1.5, None), "b": (2.0, 3)}
    assert env_value(STORAGE_OPTIONS, {STORAGE_OPTIONS.name: '{"k": 1}'}) == {"k": "1"}


@pytest.mark.parametrize(
    ("variable", "raw", "message"),
    [
        (BACKFILL_MAX_ACTIVE_RUNS, "two", "MODESWITCH_BACKFILL_MAX_ACTIVE_RUNS: 'two' is not a"),
        (BACKFILL_MAX_ACTIVE_RUNS, "0", "MODESWITCH_BACKFILL_MAX_ACTIVE_RUNS: '0' must be great"),
        (FAULTS, "a=soon", "MODESWITCH_FAULTS: 'a=soon' is not name=seconds[@hit]"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_and_the_value(variable, raw, message) -> None:
    with pytest.raises(ConfigError) as refused:
        env_value(variable, {variable.name: raw})
    assert str(refused.value).startswith(message)
    assert refused.value.setting == variable.name


def test_a_secret_bad_value_is_refused_without_repeating_it() -> None:
    with pytest.raises(ConfigError, match="MODESWITCH_STORAGE_OPTIONS: not valid JSON") as bad:
        env_value(STORAGE_OPTIONS, {STORAGE_OPTIONS.name: '{"AWS_SECRET_ACCESS_KEY": "s3cr3t'})
    assert "s3cr3t" not in str(bad.value)
    with pytest.raises(ConfigError, match="expected a JSON object of option names to values"):
        env_value(STORAGE_OPTIONS, {STORAGE_OPTIONS.name: '["s3cr3t"]'})


def test_env_text_is_the_value_exactly_as_set() -> None:
    assert env_text(STORAGE_OPTIONS, {STORAGE_OPTIONS.name: ' {"k": 1} '}) == ' {"k": 1} '
    assert env_text(STORAGE_OPTIONS, {}) is None


def test_the_table_replaces_what_is_between_the_markers_and_refuses_a_file_without() -> None:
    page = f"# Page\n\n{TABLE_START}\n| old |\n{TABLE_END}\n\nAfter.\n"
    assert with_environment_table(page) == (
        f"# Page\n\n{TABLE_START}\n{environment_table()}{TABLE_END}\n\nAfter.\n"
    )
    with pytest.raises(ConfigError, match="environment-table:start"):
        with_environment_table("# no table here\n")


# --- no module but the table's reads a variable itself -----------------------------------------


def _is_os_environ(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "environ"
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module-level names bound to a string literal."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return found


def _read_key(node: ast.AST) -> ast.AST | None:
    """The key of a read of the process environment (``os.environ.get(k)``,
    ``os.environ.setdefault(k, ...)``, ``os.environ[k]``, ``k in os.environ``, ``os.getenv(k)``);
    None for anything else (writes and removals included)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        func = node.func
        if _is_os_environ(func.value) and func.attr in ("get", "setdefault"):
            return node.args[0]
        if func.attr == "getenv" and isinstance(func.value, ast.Name) and func.value.id == "os":
            return node.args[0]
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        return node.slice if _is_os_environ(node.value) else None
    if (
        isinstance(node, ast.Compare)
        and isinstance(node.ops[0], (ast.In, ast.NotIn))
        and _is_os_environ(node.comparators[0])
    ):
        return node.left
    return None


def _variable_read(key: ast.AST, constants: dict[str, str]) -> str | None:
    """What a read's key names when it is a variable of ours: a name with the prefix, or a
    table variable's ``.name``; None when it names something else or cannot be told."""
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        text = key.value
    elif isinstance(key, ast.Name):
        text = constants.get(key.id, "")
    elif isinstance(key, ast.JoinedStr) and key.values:
        first = key.values[0]
        text = first.value if isinstance(first, ast.Constant) else ""
    elif isinstance(key, ast.Attribute) and key.attr == "name":
        return f"{ast.unparse(key)} (read it with env_value)"
    else:
        return None
    return text if text.startswith(PREFIX) else None


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != TABLE_MODULE
    ]


def _reads() -> dict[str, set[tuple[int, str]]]:
    found: dict[str, set[tuple[int, str]]] = {}
    for module, tree in _modules():
        constants = _constants(tree)
        for node in ast.walk(tree):
            key = _read_key(node)
            named = _variable_read(key, constants) if key is not None else None
            if named:
                found.setdefault(module, set()).add((node.lineno, named))
    return found


def test_no_module_reads_a_variable_of_ours_but_through_the_table() -> None:
    reads = _reads()
    outside = [
        f"{module}:{line} reads {named}"
        for module, found in reads.items()
        for line, named in sorted(found)
    ]
    assert outside == [], "declare it in modeswitch.environment and read it with env_value"


COMPOSE_OWN = set(
    re.findall(
        r"\$\{(" + PREFIX + r"[A-Z0-9_]+)", (DOCS.parents[1] / "docker-compose.yaml").read_text()
    )
) - {variable.name for variable in ENVIRONMENT}
"""docker-compose.yaml's own variables (``${MODESWITCH_SOURCE:-/data/log}``), which the
package does not read: the compose driver (``modeswitch.devtools.compose``) may set them."""


def test_no_module_but_the_table_spells_a_variable_name() -> None:
    """A module names a variable by its table entry (``CACHE.name``), never by a literal: a
    name spelled elsewhere is a variable declared twice, or one the table lacks."""
    spelled = [
        f"{module}:{node.lineno} {node.value!r}"
        for module, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and NAME.match(node.value)
        and node.value not in COMPOSE_OWN
    ]
    assert spelled == []
