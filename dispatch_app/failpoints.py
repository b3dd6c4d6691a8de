"""Test-only failpoints, switched on by PRODUCTFLOW_FAILPOINTS=name[,name...].

``kill_*`` SIGKILLs the process; ``hold_*`` stands still (a send stuck in a slow
network) until the file PRODUCTFLOW_FAILPOINT_RELEASE exists, if one is named,
for at most PRODUCTFLOW_FAILPOINT_HOLD_SECONDS (default 5); any other name raises.

Read once at import; an unset variable costs one set lookup per call site.
"""

from __future__ import annotations

import os
import signal
import time

ACTIVE = frozenset(filter(None, os.environ.get("PRODUCTFLOW_FAILPOINTS", "").split(",")))


def _hold() -> None:
    deadline = time.monotonic() + float(os.environ.get("PRODUCTFLOW_FAILPOINT_HOLD_SECONDS", "5"))
    release = os.environ.get("PRODUCTFLOW_FAILPOINT_RELEASE")
    while time.monotonic() < deadline:
        if release and os.path.exists(release):
            return
        time.sleep(0.05)


def hit(name: str) -> None:
    if name not in ACTIVE:
        return
    if name.startswith("kill_"):
        os.kill(os.getpid(), signal.SIGKILL)
    if name.startswith("hold_"):
        _hold()
        return
    raise RuntimeError(f"failpoint {name}")
