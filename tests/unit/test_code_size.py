"""Sizes the project holds itself to (issue 27): no module of ``dispatch_app`` over 400 lines, no function over 60.

A function's length leaves out the lines of its multi-line string literals (SQL text, docstrings): a statement
written out in full is easier to read than one cut into pieces to fit. Migrations are generated and left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "dispatch_app"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _string_lines(node: ast.AST) -> set[int]:
    lines: set[int] = set()
    for n in ast.walk(node):
        text = isinstance(n, ast.JoinedStr) or (isinstance(n, ast.Constant) and isinstance(n.value, str))
        if text and n.end_lineno > n.lineno:
            lines.update(range(n.lineno, n.end_lineno + 1))
    return lines


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """(name, first line, length without multi-line string literals) of every function, methods included."""
    return [
        (node.name, node.lineno, node.end_lineno - node.lineno + 1 - len(_string_lines(node)))
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "migrations" not in p.relative_to(ROOT).parts)


def test_no_module_is_over_the_limit():
    long = [
        f"{p.relative_to(ROOT.parent)}: {n} lines"
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split by what they do):\n" + "\n".join(long)


def test_no_function_is_over_the_limit():
    long = [
        f"{p.relative_to(ROOT.parent)}:{line} {name}: {n} lines"
        for p in _modules()
        for name, line, n in function_lengths(p.read_text())
        if n > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (string literals aside):\n" + "\n".join(long)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n" + "    x = 1\n" * 61, [("f", 1, 62)]),
        ('def f():\n    """Doc\n    more\n    """\n    return 1\n', [("f", 1, 2)]),
        ('def f():\n    sql = f"""\n    SELECT {a}\n    FROM t\n    """\n    return sql\n', [("f", 1, 2)]),
        ("class C:\n    def m(self):\n        pass\n", [("m", 2, 2)]),
    ],
)
def test_the_length_leaves_out_string_literals_only(source, expected):
    assert function_lengths(source) == expected
