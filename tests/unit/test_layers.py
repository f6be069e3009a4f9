"""The package's layers: pure decisions at the bottom, I/O above, Airflow and the CLI on top.

Every ``from modeswitch.<part> import`` in the package (at module level or inside a function)
must point to the same part or to one listed before it in :data:`LAYERS`; no production
module imports ``modeswitch.devtools``. A new import that runs back up fails here, naming
the module, the line and what it imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import modeswitch

pytestmark = pytest.mark.unit

PACKAGE = Path(modeswitch.__file__).parent
LAYERS = [
    # the bottom: no I/O of their own beyond storage's helpers
    ("errors", "offsets", "environment", "faults", "spark_conf", "storage", "worker_gc"),
    ("control",),  # settings, the policy, the planner: pure
    ("sources",),  # the log: BucketedLog, segments, Kafka, the bucketlog data source
    ("transforms",),  # one transform for both modes
    ("sinks",),  # the exactly-once Delta sink
    ("state",),  # the control tables
    ("modes",),  # batch waves, the stream, resume, backfills
    ("runners",),  # the epoch lifecycle, sessions, processes, the local runner, the engine
    ("ops",),  # status, verify, maintenance
    ("devtools",),  # synthetic events, demos, loopback clusters
    ("cli_log", "cli", "airflow"),  # the entry points
]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}
ENTRY_POINTS = {"cli", "cli_log", "airflow", "devtools"}
KNOWN_UPWARD = {
    # The bucketlog data source runs the transform's Arrow form inside its reader.
    ("modeswitch.sources.spark", "modeswitch.transforms"),
}


def _part(module: str) -> str:
    return module.split(".")[1]


def _imports() -> list[tuple[str, str, int]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(relative.parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("modeswitch."):
                found.append((name, node.module, node.lineno))
            elif isinstance(node, ast.Import):
                found.extend(
                    (name, alias.name, node.lineno)
                    for alias in node.names
                    if alias.name.startswith("modeswitch.")
                )
    return found


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {_part(name) for name, _, _ in _imports()} | {_part(m) for _, m, _ in _imports()}
    assert parts <= set(RANK), f"parts without a layer: {sorted(parts - set(RANK))}"


def test_no_import_runs_back_up_a_layer() -> None:
    upward = [
        f"{name}:{line} imports {module}"
        for name, module, line in _imports()
        if RANK[_part(module)] > RANK[_part(name)]
        and (name, module) not in KNOWN_UPWARD
        and _part(module) != _part(name)
    ]
    assert upward == []


def test_no_production_module_imports_a_dev_tool() -> None:
    leaks = [
        f"{name}:{line} imports {module}"
        for name, module, line in _imports()
        if _part(module) == "devtools" and _part(name) not in ENTRY_POINTS
    ]
    assert leaks == []


def test_the_known_upward_imports_still_exist() -> None:
    """An entry of KNOWN_UPWARD that no longer happens is removed from it."""
    found = {(name, module) for name, module, _ in _imports()}
    assert found >= KNOWN_UPWARD
