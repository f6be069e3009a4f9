"""The package's layers: pure decisions at the bottom, I/O above, Airflow and the CLI on top.

Every ``from modeswitch.<part> import`` in the package (at module level or inside a function)
must point to the same part or to one listed before it in :data:`LAYERS`; no production
module imports ``modeswitch.devtools`` (only the CLI, whose ``demo`` and ``produce`` commands
run dev tools, and the dev tools themselves). A new import that runs back up fails here,
naming the module, the line and what it imports. No two modules import each other, directly or
round a longer circle, deferred imports counted (:data:`KNOWN_CIRCLES`: none left). At most
three modules run over 500 lines, and no module imports another's private name."""

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
    ("cli", "airflow"),  # the entry points
]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}
DEV_TOOL_USERS = {"cli", "devtools"}
"""The parts that may import ``modeswitch.devtools``: the CLI and the dev tools themselves."""
KNOWN_UPWARD: set[tuple[str, str]] = set()
KNOWN_CIRCLES: set[frozenset[str]] = set()


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


def _module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(relative.parts).removesuffix(".__init__")


def _module_imports() -> dict[str, dict[str, int]]:
    """Which of the package's modules each one imports (module level or inside a function),
    with the line of the first such import: ``from modeswitch.x import y`` counts as an
    import of ``modeswitch.x.y`` when that is a module, else of ``modeswitch.x``."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(path) for path in paths}
    graph: dict[str, dict[str, int]] = {}
    for path in paths:
        name = _module_name(path)
        edges = graph.setdefault(name, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                targets = [
                    f"{node.module}.{alias.name}"
                    if f"{node.module}.{alias.name}" in modules
                    else node.module
                    for alias in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                if target in modules and target != name:
                    edges.setdefault(target, node.lineno)
    return graph


def _circles(graph: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The import circles of ``graph``: each set of modules that reach one another through
    their imports (a strongly connected component of more than one module, Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.get(module, {}):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
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
        if _part(module) == "devtools" and _part(name) not in DEV_TOOL_USERS
    ]
    assert leaks == []


def test_the_known_upward_imports_still_exist() -> None:
    """An entry of KNOWN_UPWARD that no longer happens is removed from it."""
    found = {(name, module) for name, module, _ in _imports()}
    assert found >= KNOWN_UPWARD


def test_no_modules_import_each_other_round_a_circle() -> None:
    """Each circle is named by its modules and the imports that close it."""
    graph = _module_imports()
    circles = [
        sorted(
            f"{name}:{line} imports {imported}"
            for name in circle
            for imported, line in graph[name].items()
            if imported in circle
        )
        for circle in _circles(graph)
        if circle not in KNOWN_CIRCLES
    ]
    assert circles == []


def test_the_known_circles_still_exist() -> None:
    """An entry of KNOWN_CIRCLES that is no longer a circle is removed from it."""
    assert set(_circles(_module_imports())) >= KNOWN_CIRCLES


def test_callers_ask_the_logs_capabilities_not_whether_a_source_is_kafka() -> None:
    """What a log can do is asked of its kind (``modeswitch.sources.log_type(source)``'s
    :class:`~modeswitch.sources.base.LogCapabilities`), never of its URL: outside ``sources``
    only the settings' validation (``control``, below the sources) tells a topic by its name."""
    askers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] not in ("sources", "control")
        and "is_kafka_source" in path.read_text()
    )
    assert askers == []


LONG_MODULE_LINES = 500
MOST_LONG_MODULES = 3
"""The house's size rule: at most three modules over 500 lines, each saying why it stays whole."""


def test_at_most_three_modules_run_over_five_hundred_lines() -> None:
    long_modules = sorted(
        f"{path.relative_to(PACKAGE)}: {lines} lines"
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > LONG_MODULE_LINES
    )
    assert len(long_modules) <= MOST_LONG_MODULES, long_modules


def test_no_module_imports_another_modules_private_name() -> None:
    """A name that starts with ``_`` belongs to its module: one another module needs is public."""
    private = sorted(
        f"{path.relative_to(PACKAGE)}:{node.lineno} imports {node.module}.{alias.name}"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ImportFrom) and node.module != "__future__"
        for alias in node.names
        if alias.name.startswith("_")
    )
    assert private == []
