"""Test-only failpoints, switched on by PRODUCTFLOW_FAILPOINTS=name[,name...].

Read once at import; an unset variable costs one set lookup per call site.
"""

from __future__ import annotations

import os
import signal

ACTIVE = frozenset(filter(None, os.environ.get("PRODUCTFLOW_FAILPOINTS", "").split(",")))


def hit(name: str) -> None:
    if name not in ACTIVE:
        return
    if name.startswith("kill_"):
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"failpoint {name}")
