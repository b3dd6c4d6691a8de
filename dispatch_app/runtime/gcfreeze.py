"""Long-running processes take what start-up allocated out of the garbage collector's full collections.

CPython's full (generation 2) collection walks every object it tracks. In a worker or a dispatcher that is
mostly Django, RQ and the project's modules, loaded once and alive until exit: one full collection took
38–45 ms on a 2-vCPU host, a stall that lands on whatever job is on its way (about 8 jobs at 200 jobs/s, the
whole p99 of a latency run). ``gc.freeze()`` moves them to the permanent generation, so a full collection
walks only what was allocated since: 0.2–0.6 ms on the same host (docs/benchmarks.md, "Full collections").

Garbage is collected first, so nothing already unreachable is frozen. Called once per process, after its
set-up and before its loops start; a forked child (RQ's WorkerPool) calls it again for its own set-up.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger("dispatch_app.runtime")


def freeze_startup(domain: str) -> int:
    """Collect, then freeze everything alive; returns how many objects are frozen (logged as ``gc_frozen``)."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info(
        "%d start-up objects frozen out of the garbage collector's full collections",
        frozen,
        extra={"action": "gc_frozen", "domain": domain},
    )
    return frozen
