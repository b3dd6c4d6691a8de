"""Is a dead dispatcher's work done by a live one? The answer decides whether its STALE banner stays.

A dispatcher killed (-9, OOM, host lost) leaves its ``DispatcherProcess`` row until retention forgets it
(``RETENTION_HEARTBEATS``, a day by default). Its banner is worth a look only while something it did is
done by nobody: once live dispatchers run each of its duty loops again (``dispatch``, and each
``recovery-<domain>`` it ran), the incident is over and the banner goes by itself. The row stays in the
processes table (marked replaced), so the history is still there to read.

A duty loop counts as covered only when it ticks fresh on a process that is not stale itself. Loops that
exist per process (heartbeat, retention, listener, the recovery child's supervisor) are not duties: every
dispatcher has its own. A dead process that never recorded a loop is covered by any live dispatcher.
"""

from __future__ import annotations

DISPATCH = "dispatch"
RECOVERY_PREFIX = "recovery-"
RECOVERY_PROCESS = "recovery-process"  # runtime.recovery_process.NAME: a supervisor, its loops are listed apart


def duties(process: dict) -> set[str]:
    """The loops of ``process`` whose work another dispatcher must take over (dispatch, per-domain recovery)."""
    names = {loop["loop"] for loop in process["loops"]}
    return {n for n in names if n == DISPATCH or (n.startswith(RECOVERY_PREFIX) and n != RECOVERY_PROCESS)}


def running(processes: list[dict]) -> set[str]:
    """Loops ticking fresh on live processes."""
    return {loop["loop"] for p in processes if not p["stale"] for loop in p["loops"] if not loop["stale"]}


def uncovered(process: dict, processes: list[dict]) -> list[str]:
    """The duty loops of (dead) ``process`` no live dispatcher runs now; [] = fully replaced."""
    if not any(not p["stale"] for p in processes):
        return sorted(duties(process)) or ["its loops"]
    return sorted(duties(process) - running(processes))


def mark(processes: list[dict]) -> None:
    """Annotate each stale process with ``uncovered`` and ``replaced`` (the template and the banners read them)."""
    for p in processes:
        if p["stale"]:
            p["uncovered"] = uncovered(p, processes)
            p["replaced"] = not p["uncovered"]
