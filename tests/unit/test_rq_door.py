"""RQ behind one door: only ``dispatch_app/rq/`` imports ``rq`` or spells one of RQ's Redis keys, and an RQ job id
is spelled in one module, ``dispatch_app/rq/ids.py`` (docs/architecture.md, "One folder per layer").

Read from the source (``ast``): imports at any level (inside functions too), and every string of a module (f-strings
included). The checks are tried on planted sources, so a rule that stops matching fails here too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "dispatch_app"
DOOR = ROOT / "rq"
IDS = DOOR / "ids.py"
# RQ's own key prefixes (rq.internals checks the ones the project reads against the installed RQ).
RQ_KEY = re.compile(r"\brq:(queue|job|worker|workers|queues|wip|failed|finished|deferred|scheduled|canceled|"
                    r"executions|results|suspended|intermediate|cron|pubsub)\b")  # fmt: skip
# An RQ job id of ours being spelled: "pf-" followed by a placeholder or a number.
JOB_ID = re.compile(r"pf-(\{|%|\d)")


def imports_rq(source: str) -> list[int]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(name == "rq" or name.startswith("rq.") for name in names):
            found.append(node.lineno)
    return found


def strings(source: str) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            parts = [
                str(v.value) if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}" for v in node.values
            ]
            out.append((node.lineno, "".join(parts)))
    return out


def _outside(door: Path = DOOR):
    for path in sorted(ROOT.rglob("*.py")):
        if "migrations" in path.parts or path.is_relative_to(door):
            continue
        yield path


def test_only_the_door_imports_rq():
    found = [f"{p.relative_to(ROOT.parent)}:{line}" for p in _outside() for line in imports_rq(p.read_text())]
    assert not found, "modules outside dispatch_app/rq/ import rq (call rq.publish, rq.state, rq.ids):\n" + "\n".join(
        found
    )


def test_no_line_outside_the_door_reads_like_an_rq_import():
    """Issue 57's own check, as text: ``grep -rln "import rq\\|from rq" dispatch_app | grep -v "^dispatch_app/rq/"``."""
    found = [
        f"{p.relative_to(ROOT.parent)}:{n}"
        for p in _outside()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "import rq" in line or "from rq" in line
    ]
    assert not found, "lines outside dispatch_app/rq/ that read like an import of rq:\n" + "\n".join(found)


def test_only_the_door_spells_an_rq_key():
    found = [
        f"{p.relative_to(ROOT.parent)}:{line}: {text[:80]!r}"
        for p in _outside()
        for line, text in strings(p.read_text())
        if RQ_KEY.search(text)
    ]
    assert not found, "RQ keys spelled outside dispatch_app/rq/:\n" + "\n".join(found)


def test_the_job_id_is_spelled_in_one_module():
    found = [
        f"{p.relative_to(ROOT.parent)}:{line}: {text[:80]!r}"
        for p in sorted(ROOT.rglob("*.py"))
        if p != IDS and "migrations" not in p.parts
        for line, text in strings(p.read_text())
        if JOB_ID.search(text)
    ]
    assert not found, "RQ job ids spelled outside dispatch_app/rq/ids.py (call rq.ids.rq_job_id):\n" + "\n".join(found)
    assert any(JOB_ID.search(text) for _, text in strings(IDS.read_text())), "rq/ids.py no longer spells the id"


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ("import rq", [1]),
        ("def f():\n    from rq.job import Job", [2]),
        ("import rq.worker as w", [1]),
        ("import redis\nimport rqlike\nfrom . import rq", []),
    ],
)
def test_the_import_scan_finds_planted_imports(source, lines):
    assert imports_rq(source) == lines


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ('K = "rq:queue:delivery"', True),
        ('K = f"rq:job:{job_id}"', True),
        ('K = "rq:wip:" + name', True),
        ('K = "productflow:deployments"', False),
        ("def f(rq: dict): pass", False),
    ],
)
def test_the_key_scan_finds_planted_keys(source, found):
    assert any(RQ_KEY.search(text) for _, text in strings(source)) is found


@pytest.mark.parametrize(
    ("source", "found"),
    [('I = f"pf-{job}-{attempt}"', True), ('I = "pf-%s-%s" % (j, a)', True), ('I = "pf-1-1"', True)],
)
def test_the_id_scan_finds_planted_ids(source, found):
    assert any(JOB_ID.search(text) for _, text in strings(source)) is found
