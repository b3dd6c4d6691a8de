"""Writes to every table of the app -- a job's rows, arms, pauses, heartbeats, recovery rounds -- appear only in
``dispatch_app/store/``, and the operators' views (``dispatch_app/views/``) write nothing at all.

Read from the source: every string of a module outside the store (f-strings included, their placeholders
resolved against the module's own constants) is searched for INSERT INTO / UPDATE / DELETE FROM / TRUNCATE on
those tables, and every call for an ORM write on their models (``Model.objects.create(...)``,
``....filter(...).update(...)``, ``.save()``, ``.delete()``, ...). Migrations are left out: they are the schema's
history, not a writer. The scanner is tested on planted writes, so a rule that stops matching fails here too.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
from django.apps import apps

PACKAGE = "dispatch_app"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
MODELS = {m.__name__: m._meta.db_table for m in apps.get_app_config(PACKAGE).get_models()}
OWNED = frozenset(MODELS.values())
ORM_WRITES = frozenset(
    {"create", "bulk_create", "update", "bulk_update", "delete", "get_or_create", "update_or_create", "raw"}
)
# What an SQL write names as its target: a table, or an f-string placeholder ({JOB}, {Job._meta.db_table}).
WRITE = re.compile(r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?)\s+(\{[^}]+\}|\"?\w+\"?)", re.I)


def _text(node: ast.AST) -> str | None:
    """A string constant's text, or an f-string's with each placeholder as ``{expression}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append("{" + ast.unparse(value.value) + "}")
        return "".join(parts)
    return None


def _resolve(target: str, module) -> str:
    """A write's target as a table name: a placeholder is looked up in the module (``{ARM}``, ``{Job._meta...}``)."""
    target = target.strip('"')
    if not (target.startswith("{") and target.endswith("}")):
        return target.lower()
    expression = target[1:-1]
    try:
        value = eval(expression, {**vars(module)})  # noqa: S307 - the project's own constant expressions, read-only
    except Exception:
        return target  # a local variable: unknown here, reported as such
    return value if isinstance(value, str) else target


def sql_writes(source: str, module) -> list[tuple[int, str, str]]:
    """(line, verb, table) of every SQL write in the module's strings (adjacent literals are one string already)."""
    found = []
    tree = ast.parse(source)
    # An f-string's literal parts are its own nodes too: read once, as the whole f-string.
    parts = {id(value) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for value in node.values}
    for node in ast.walk(tree):
        text = None if id(node) in parts else _text(node)
        if text is None:
            continue
        for match in WRITE.finditer(text):
            verb = " ".join(match.group(1).upper().split())
            found.append((node.lineno, verb, _resolve(match.group(2), module)))
    return found


def _root_model(node: ast.AST) -> str | None:
    """``Job`` for ``Job.objects...`` however long the chain (``.filter(...).exclude(...)``)."""
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            if node.attr == "objects" and isinstance(node.value, ast.Name):
                return node.value.id
            node = node.value
        else:
            return None


def orm_writes(source: str) -> list[tuple[int, str]]:
    """(line, call) of every ORM write on an owned model, and every ``.save()``/``.delete()`` whatever it is on."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method = node.func.attr
        if method in ("save", "delete") and not node.args and _root_model(node.func.value) is None:
            found.append((node.lineno, f".{method}()"))
        elif method in ORM_WRITES and _root_model(node.func.value) in MODELS:
            found.append((node.lineno, f"{_root_model(node.func.value)}.objects...{method}()"))
    return found


def _outside_store() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in ("store", "migrations"):
            continue
        name = ".".join((PACKAGE, *relative.with_suffix("").parts)).removesuffix(".__init__")
        found.append((name, path))
    return found


def test_no_module_outside_the_store_writes_a_jobs_rows_in_sql():
    offenders = []
    for name, path in _outside_store():
        module = importlib.import_module(name)
        for line, verb, table in sql_writes(path.read_text(), module):
            if table in OWNED or table.startswith("{"):
                offenders.append(f"{path.relative_to(ROOT.parent)}:{line}: {verb} {table}")
    assert not offenders, "SQL writes to a job's rows outside dispatch_app/store/ (move them into the store):\n" + (
        "\n".join(offenders)
    )


def test_no_module_outside_the_store_writes_a_jobs_rows_through_the_orm():
    offenders = [
        f"{path.relative_to(ROOT.parent)}:{line}: {call}"
        for _, path in _outside_store()
        for line, call in orm_writes(path.read_text())
    ]
    assert not offenders, "ORM writes outside dispatch_app/store/ (call the store instead):\n" + "\n".join(offenders)


def test_the_store_does_write_every_table_it_owns():
    """The scan sees the store's own writes: a scanner that matched nothing would pass the tests above."""
    written = set()
    for path in sorted((ROOT / "store").rglob("*.py")):
        relative = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join((PACKAGE, *relative)).removesuffix(".__init__")
        module = importlib.import_module(name)
        written |= {table for _, _, table in sql_writes(path.read_text(), module)}
        written |= {MODELS[call.split(".")[0]] for _, call in orm_writes(path.read_text()) if "." in call[1:]}
    assert OWNED <= written, f"the scan found no write to {sorted(OWNED - written)} in the store"


def test_the_views_write_nothing():
    """The read-only views: no SQL write to any table (ours or not) and no ORM write, whatever it is on."""
    offenders = []
    for name, path in _outside_store():
        if not name.startswith(f"{PACKAGE}.views"):
            continue
        module = importlib.import_module(name)
        source = path.read_text()
        offenders += [f"{path.name}:{line}: {verb} {table}" for line, verb, table in sql_writes(source, module)]
        offenders += [f"{path.name}:{line}: {call}" for line, call in orm_writes(source)]
        offenders += [
            f"{path.name}:{node.lineno}: .{node.func.attr}()"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ORM_WRITES
            and _root_model(node.func.value) is not None
        ]
    assert not offenders, "writes in dispatch_app/views/ (a view reads; an action goes through the store):\n" + (
        "\n".join(offenders)
    )


class _Constants:
    JOB = "dispatch_app_job"
    ARM = "dispatch_app_notifyarm"
    Job = apps.get_model(PACKAGE, "Job")


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('X = "UPDATE dispatch_app_job SET status = %s"', [(1, "UPDATE", "dispatch_app_job")]),
        ('X = f"UPDATE {JOB} SET updated_at = now()"', [(1, "UPDATE", "dispatch_app_job")]),
        ('X = f"INSERT INTO {Job._meta.db_table} (a) VALUES (1)"', [(1, "INSERT INTO", "dispatch_app_job")]),
        ('X = ("DELETE   FROM " "dispatch_app_jobevent WHERE id = 1")', [(1, "DELETE FROM", "dispatch_app_jobevent")]),
        ('X = f"UPDATE {ARM} SET armed_until = now()"', [(1, "UPDATE", "dispatch_app_notifyarm")]),
        ('def f(t):\n    return f"DELETE FROM {t} WHERE true"', [(2, "DELETE FROM", "{t}")]),
        ('X = "SELECT id FROM dispatch_app_job FOR UPDATE"', []),
        (
            'X = f"UPDATE {JOB} SET a = 1; DELETE FROM dispatch_app_jobevent"',
            [(1, "UPDATE", "dispatch_app_job"), (1, "DELETE FROM", "dispatch_app_jobevent")],
        ),
    ],
)
def test_the_sql_scan_finds_planted_writes(source, expected):
    assert sql_writes(source, _Constants) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("JobEvent.objects.create(job_id=1)", [(1, "JobEvent.objects...create()")]),
        ("Job.objects.filter(id=1).exclude(status='x').update(status='y')", [(1, "Job.objects...update()")]),
        ("job.save()", [(1, ".save()")]),
        ("queryset.delete()", [(1, ".delete()")]),
        ("LogEntry.objects.create(action_flag=1)", []),  # Django's admin log: not a table of ours
        ("Job.objects.filter(id=1).first()", []),
        ("connection.delete(key)", []),
    ],
)
def test_the_orm_scan_finds_planted_writes(source, expected):
    assert orm_writes(source) == expected
