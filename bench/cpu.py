"""CPU seconds per component, from the kernel's per-process counters (psutil reads /proc).

A component is a set of processes: ours (producer, dispatcher, worker and
their children), the PostgreSQL backends serving one database, a private
redis-server. ``CpuMeter.snapshot()`` before and after a window; the delta per
component, divided by the jobs done, is the CPU per job. A process that ends
inside the window loses its last counters, so producers report their own
(``resource.getrusage``) and everything else is kept alive until the end.
"""

from __future__ import annotations

import resource
from collections.abc import Callable, Iterable


def process_cpu(pid: int, *, children: bool = True) -> float:
    """user + system seconds of `pid` (and its live children); 0.0 when it is gone."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *(proc.children(recursive=True) if children else [])]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def pg_backend_pids(cursor, databases: Iterable[str], exclude: Iterable[int] = ()) -> list[int]:
    """Client backends connected to `databases`, except the bench's own (`exclude`)."""
    cursor.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = ANY(%s) AND backend_type = 'client backend' "
        "AND pid <> ALL(%s)",
        [list(databases), list(exclude)],
    )
    return [row[0] for row in cursor.fetchall()]


def self_cpu() -> float:
    """user + system seconds of this process, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CpuMeter:
    """Per-component CPU between two snapshots.

    `components` maps a name to a callable returning the pids to count now; a
    pid first seen in the second snapshot started inside the window and counts
    from zero.
    """

    def __init__(self, components: dict[str, Callable[[], Iterable[int]]], *, children: bool = True):
        self.components = components
        self.children = children
        self.before: dict[str, dict[int, float]] = {}

    def _read(self) -> dict[str, dict[int, float]]:
        return {
            name: {pid: process_cpu(pid, children=self.children) for pid in pids()}
            for name, pids in self.components.items()
        }

    def snapshot(self) -> None:
        self.before = self._read()

    def delta(self) -> dict[str, float]:
        after = self._read()
        out = {}
        for name, now in after.items():
            then = self.before.get(name, {})
            out[name] = sum(max(0.0, cpu - then.get(pid, 0.0)) for pid, cpu in now.items())
        return out


def per_job_ms(cpu_seconds: dict[str, float], jobs: int) -> dict[str, float | None]:
    """{component: ms per job} plus ``total``; None when no job was done."""
    if jobs <= 0:
        return {**{k: None for k in cpu_seconds}, "total": None}
    out = {k: v * 1000.0 / jobs for k, v in cpu_seconds.items()}
    out["total"] = sum(cpu_seconds.values()) * 1000.0 / jobs
    return out
