"""Test-only failpoints, switched on by PRODUCTFLOW_FAILPOINTS=name[,name...].

``kill_*`` SIGKILLs the process; ``hold_*`` stands still (a send stuck in a slow
network) until the file PRODUCTFLOW_FAILPOINT_RELEASE exists, if one is named,
for at most PRODUCTFLOW_FAILPOINT_HOLD_SECONDS (default 5); ``note_*`` appends
its name and the pid to the file PRODUCTFLOW_FAILPOINT_NOTES (a test waits for
a step to have begun, not for a guess at how long it takes); any other name raises.

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


def _note(name: str) -> None:
    path = os.environ.get("PRODUCTFLOW_FAILPOINT_NOTES")
    if not path:
        raise RuntimeError(f"failpoint {name}: PRODUCTFLOW_FAILPOINT_NOTES names no file")
    # One O_APPEND write per line: lines from several threads or processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{name} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def hit(name: str) -> None:
    if name not in ACTIVE:
        return
    if name.startswith("kill_"):
        os.kill(os.getpid(), signal.SIGKILL)
    if name.startswith("hold_"):
        _hold()
        return
    if name.startswith("note_"):
        _note(name)
        return
    raise RuntimeError(f"failpoint {name}")
