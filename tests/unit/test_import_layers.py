"""The import layers of ``dispatch_app`` (README, "Architecture: the import layers"), and no import cycle.

The graph is static (``ast``): every ``import`` and ``from ... import`` of a module, at its top, inside a
function or under ``TYPE_CHECKING`` -- a function-level import still runs and still ties the two modules.
Migrations are left out. A module imports only modules of its own layer or of lower ones, and no chain of
imports leads back to where it started.
"""

from __future__ import annotations

import ast
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

PACKAGE = "dispatch_app"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE

# Lowest first. A module's layer: the layer naming it exactly, else the one whose pattern matches it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "leaves: values, settings and process primitives",
        (
            "dispatch_app.values",
            "dispatch_app.tuning",
            "dispatch_app.conf",
            "dispatch_app.settings_rules",
            "dispatch_app.dbtime",
            "dispatch_app.failpoints",
            "dispatch_app.lanes",
            "dispatch_app.payloads",
            "dispatch_app.store.history_triggers",
            "dispatch_app.store.trigger_sql",
            "dispatch_app.store.notify_triggers",
            "dispatch_app.liveness",
            "dispatch_app.redis_servers",
            "dispatch_app.rq_internals",
            "dispatch_app.deployment",
            "dispatch_app.rq_ids",
            "dispatch_app.runtime.wake",
            "dispatch_app.runtime.gcfreeze",
        ),
    ),
    ("models", ("dispatch_app.models",)),
    ("domains", ("dispatch_app.domains", "dispatch_app.domains.*")),
    (
        "core: the store (every write to a job's rows) and the job's stages",
        (
            "dispatch_app.store",
            "dispatch_app.store.*",
            "dispatch_app.stages",
            "dispatch_app.stage_sql",
            "dispatch_app.latency",
            "dispatch_app.tracing",
            "dispatch_app.outbox",
            "dispatch_app.prepared",
            "dispatch_app.dbcheck",
            "dispatch_app.dbretry",
            "dispatch_app.providers",
        ),
    ),
    (
        "engines: dispatcher, recovery, worker, django.tasks",
        (
            "dispatch_app.dispatch",
            "dispatch_app.dispatch.*",
            "dispatch_app.recovery",
            "dispatch_app.recovery.*",
            "dispatch_app.worker",
            "dispatch_app.worker.*",
            "dispatch_app.rqworker",
            "dispatch_app.run",
            "dispatch_app.tasks",
            "dispatch_app.tasks.*",
        ),
    ),
    ("ops: what operators read", ("dispatch_app.ops", "dispatch_app.ops.*")),
    (
        "entry points: processes, commands, admin, app",
        (
            "dispatch_app",
            "dispatch_app.apps",
            "dispatch_app.mounting_checks",
            "dispatch_app.demo_payloads",
            "dispatch_app.runtime",
            "dispatch_app.runtime.*",
            "dispatch_app.management",
            "dispatch_app.management.*",
            "dispatch_app.admin",
            "dispatch_app.admin.*",
            "dispatch_app.templatetags",
            "dispatch_app.templatetags.*",
        ),
    ),
]

Graph = dict[str, dict[str, int]]  # module -> {module it imports: line of the first such import}


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if "migrations" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((package, *parts))] = path
    return found


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> Graph:
    """Every module's imports of the package's modules (a name that is no module: its nearest module)."""
    mods = modules(root, package)

    def nearest(name: str) -> str | None:
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in mods else None

    graph: Graph = {}
    for module, path in mods.items():
        here = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        deps: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                # ``from pkg import mod`` runs pkg's ``__init__`` and imports pkg.mod: an edge to both, so a package
                # that re-exports its modules and a module that imports a sibling through the package are a cycle.
                # ``import pkg.mod as mod`` names only pkg.mod.
                names = [base, *(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods)]
            else:
                continue
            for name in names:
                if name != package and not name.startswith(package + "."):
                    continue
                dep = nearest(name)
                if dep is not None and dep != module:
                    deps.setdefault(dep, node.lineno)
        graph[module] = deps
    return graph


def find_cycle(graph: Graph) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def layer_of(module: str, layers=LAYERS) -> int | None:
    for index, (_, patterns) in enumerate(layers):
        if module in patterns:
            return index
    matches = {i for i, (_, patterns) in enumerate(layers) for p in patterns if "*" in p and fnmatchcase(module, p)}
    return matches.pop() if len(matches) == 1 else None


def upward_imports(graph: Graph, layers=LAYERS) -> list[str]:
    """Every import of a module in a higher layer, named with its line."""
    found = []
    for module, deps in sorted(graph.items()):
        mine = layer_of(module, layers)
        for dep, line in sorted(deps.items()):
            theirs = layer_of(dep, layers)
            if mine is not None and theirs is not None and theirs > mine:
                found.append(
                    f"{module} (layer {mine}, {layers[mine][0]}) imports {dep} (layer {theirs}, "
                    f"{layers[theirs][0]}) at line {line}"
                )
    return found


def _cycle_text(graph: Graph, cycle: list[str]) -> str:
    steps = [f"{a} imports {b} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False)]
    return "import cycle:\n  " + "\n  ".join(steps)


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, _cycle_text(graph, cycle)


def test_every_module_has_one_layer():
    unplaced = [m for m in import_graph() if layer_of(m) is None]
    assert not unplaced, f"add these modules to one layer of LAYERS (README, Architecture): {unplaced}"


def test_no_module_imports_a_higher_layer():
    upward = upward_imports(import_graph())
    assert not upward, "imports against the layers:\n  " + "\n  ".join(upward)


def test_templatetags_import_nothing_from_the_admin():
    graph = import_graph()
    found = [
        f"{module} imports {dep} (line {line})"
        for module, deps in graph.items()
        if module.startswith("dispatch_app.templatetags")
        for dep, line in deps.items()
        if dep == "dispatch_app.admin" or dep.startswith("dispatch_app.admin.")
    ]
    assert not found, found


# The checks themselves can fail: synthetic graphs and a synthetic package.
SYNTHETIC_LAYERS = [("low", ("p.low",)), ("high", ("p.high", "p.top.*"))]


@pytest.mark.parametrize(
    ("graph", "cycle"),
    [
        ({"p.a": {"p.b": 1}, "p.b": {"p.a": 2}}, ["p.a", "p.b", "p.a"]),
        ({"p.a": {"p.b": 1}, "p.b": {"p.c": 1}, "p.c": {"p.b": 3}}, ["p.b", "p.c", "p.b"]),
        ({"p.a": {"p.b": 1}, "p.b": {}}, None),
    ],
)
def test_find_cycle_finds_one(graph, cycle):
    assert find_cycle(graph) == cycle


@pytest.mark.parametrize(
    ("graph", "upward"),
    [
        ({"p.low": {"p.high": 7}, "p.high": {}}, ["p.low (layer 0, low) imports p.high (layer 1, high) at line 7"]),
        ({"p.low": {"p.top.x": 3}, "p.top.x": {}}, ["p.low (layer 0, low) imports p.top.x (layer 1, high) at line 3"]),
        ({"p.high": {"p.low": 1}, "p.low": {}}, []),
    ],
)
def test_upward_imports_are_named(graph, upward):
    assert upward_imports(graph, SYNTHETIC_LAYERS) == upward


def test_function_level_and_relative_imports_are_edges(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from p.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from ..a import f\nimport p.c\n")
    (pkg / "c.py").write_text("import os\n")
    graph = import_graph(pkg, "p")
    assert graph["p.a"] == {"p.sub": 2, "p.sub.b": 2}
    assert graph["p.sub.b"] == {"p.a": 1, "p.c": 2}
    assert find_cycle(graph) == ["p.a", "p.sub.b", "p.a"]


def test_a_package_that_re_exports_a_module_importing_it_is_a_cycle(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from p.sub.b import run\n")
    (pkg / "sub" / "b.py").write_text("from p.sub import c\n\ndef run():\n    pass\n")
    (pkg / "sub" / "c.py").write_text("")
    graph = import_graph(pkg, "p")
    assert graph["p.sub.b"] == {"p.sub": 1, "p.sub.c": 1}
    assert find_cycle(graph) == ["p.sub", "p.sub.b", "p.sub"]
    (pkg / "sub" / "b.py").write_text("import p.sub.c as c\n\ndef run():\n    pass\n")
    graph = import_graph(pkg, "p")
    assert graph["p.sub.b"] == {"p.sub.c": 1}
    assert find_cycle(graph) is None
