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

pytestmark = pytest.mark.version_dependent

PACKAGE = "dispatch_app"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE

# Lowest first. The contract names folders (a pattern matches the folder and everything in it); the most specific
# folder wins (``dispatch_app.rq.worker`` over ``dispatch_app.rq``). The four loose modules are named as they are.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "leaves: configuration, database helpers, the schema's trigger SQL",
        ("dispatch_app.config.*", "dispatch_app.db.*", "dispatch_app.store.triggers.*"),
    ),
    ("models", ("dispatch_app.models",)),
    ("domains", ("dispatch_app.domains.*",)),
    ("rq: the one door to RQ (its worker and entry points excepted)", ("dispatch_app.rq.*",)),
    (
        "core: the store (every write to a table), the outbox write, a job's timeline",
        ("dispatch_app.store.*", "dispatch_app.outbox.*", "dispatch_app.timeline.*"),
    ),
    (
        "engines: dispatcher, recovery, execution, django.tasks",
        ENGINES := tuple(f"dispatch_app.{e}.*" for e in ("dispatch", "recovery", "execution", "tasks")),
    ),
    (
        "operators: actions, views, housekeeping",
        ("dispatch_app.actions.*", "dispatch_app.views.*", "dispatch_app.housekeeping.*"),
    ),
    (
        "processes and entry points: the RQ worker, commands, admin, app",
        (
            "dispatch_app.runtime.*",
            "dispatch_app.rq.worker.*",
            "dispatch_app.rqworker.*",
            "dispatch_app.management.*",
            "dispatch_app.admin.*",
            "dispatch_app.templatetags.*",
            "dispatch_app",
            "dispatch_app.apps",
            "dispatch_app.run",
        ),
    ),
]
LOOSE_MAX = 6  # modules directly in dispatch_app/, the package's own __init__ included

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


def _folder(pattern: str) -> str:
    return pattern.removesuffix(".*")


def layer_of(module: str, layers=LAYERS) -> int | None:
    """The layer of the most specific folder (or loose module) that holds ``module``; None if none does."""
    best, found = -1, None
    for index, (_, patterns) in enumerate(layers):
        for pattern in patterns:
            folder = _folder(pattern)
            if module == folder or (pattern.endswith(".*") and fnmatchcase(module, pattern)):
                if len(folder) > best:
                    best, found = len(folder), index
    return found


def engine_of(module: str) -> str | None:
    return next((_folder(p) for p in ENGINES if module == _folder(p) or fnmatchcase(module, p)), None)


def engine_imports(graph: Graph) -> list[str]:
    """Every import of one engine's module by another engine's: engines talk through lower layers only."""
    return [
        f"{module} imports {dep} (line {line})"
        for module, deps in sorted(graph.items())
        if (mine := engine_of(module))
        for dep, line in sorted(deps.items())
        if (theirs := engine_of(dep)) and theirs != mine
    ]


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


def test_the_engines_import_none_of_each_other():
    found = engine_imports(import_graph())
    assert not found, "engines import each other (move what they share down):\n  " + "\n  ".join(found)


def test_the_layers_name_folders_and_few_modules_are_loose():
    loose = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(loose) <= LOOSE_MAX, f"{len(loose)} loose modules in dispatch_app/ (give them a folder): {loose}"
    named = [p for _, patterns in LAYERS for p in patterns if not p.endswith(".*")]
    not_loose = [p for p in named if p != PACKAGE and not (ROOT / f"{p.split('.', 1)[1]}.py").exists()]
    assert not not_loose, f"the layers name modules that are not loose ones (name their folder): {not_loose}"


# The store's front door, and what a reader or the schema may still import of it.
STORE_DOORS = ("dispatch_app.store.api", "dispatch_app.store.tables", "dispatch_app.store.triggers")


def behind_the_store_door(graph: Graph) -> list[str]:
    """Imports of the store's own modules from outside it (``store.api`` re-exports their operations)."""
    return [
        f"{module} imports {dep} (line {line})"
        for module, deps in sorted(graph.items())
        if not module.startswith("dispatch_app.store.")
        for dep, line in sorted(deps.items())
        if dep.startswith("dispatch_app.store.") and not dep.startswith(STORE_DOORS)
    ]


def test_the_others_use_the_stores_front_door():
    found = behind_the_store_door(import_graph())
    assert not found, "import dispatch_app.store.api instead:\n  " + "\n  ".join(found)


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


def test_the_store_door_rule_finds_a_planted_import():
    graph = {"dispatch_app.views.x": {"dispatch_app.store.transitions": 4, "dispatch_app.store.api": 5}}
    assert behind_the_store_door(graph) == ["dispatch_app.views.x imports dispatch_app.store.transitions (line 4)"]
    assert behind_the_store_door({"dispatch_app.store.claim": {"dispatch_app.store.tables": 1}}) == []


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
