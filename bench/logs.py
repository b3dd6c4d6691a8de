"""``dispatchbench --keep-logs``: every child process's log lines kept in ``<out>/logs/``.

Off by default, children's stderr is read into a short in-memory tail (enough to report a child that did
not start). With ``--keep-logs`` the runner names a directory, children find it in ``LOG_DIR_ENV`` (set by
``BenchEnv.child_env``), and each process's lines go to a file of its own there (``open_log``); ``runner.log``
holds the runner's own lines with the wall clock, so a child's lines can be matched to its scenario,
variant and repetition (the pacer's ``recovery_round`` lines, a worker's stall, a dispatcher's error).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

LOG_DIR_ENV = "PF_BENCH_LOG_DIR"
# A child's last lines kept in memory, to report one that did not start or died.
TAIL_LINES = 200
_SEQUENCE = itertools.count(1)


def open_log(env: dict, role: str, pid: int | None = None, *, binary: bool = False):
    """A file for one child's lines in the run's log directory, or None when logs are not kept.

    Named ``<HHMMSS>-<n>-<role>[-<pid>].log``: ``n`` counts the bench's children, so two started in the same
    second never share a file.
    """
    where = env.get(LOG_DIR_ENV)
    if not where:
        return None
    path = Path(where) / f"{time.strftime('%H%M%S')}-{next(_SEQUENCE):03d}-{role}{'' if pid is None else f'-{pid}'}.log"
    # Line-buffered text: a child's last lines before a kill are on disk when the run is read.
    return open(path, "w+b") if binary else open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115


def drain(stream, tail: list[str], log) -> None:
    """Read a child's stream to its end: the last ``TAIL_LINES`` lines into ``tail``, every line into ``log`` if kept.

    The child's pipe must be read whether or not its lines are kept: a full pipe would block the child.
    """
    for line in stream:
        tail.append(line)
        del tail[:-TAIL_LINES]
        if log:
            log.write(line)
    if log:
        log.close()


def stamp(text: str) -> str:
    """The runner's line with the wall clock, for runner.log."""
    return "".join(f"{time.strftime('%H:%M:%S')} {line}\n" for line in text.splitlines() or [""])
