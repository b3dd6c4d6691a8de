"""Bench-only start-up hook for the project's worker processes (``bench.workers.Workers(run_stamps=...)``).

PF_BENCH_RUN_STAMPS=<file>: every call of a domain's ``work`` (the user's code, after the start
compare-and-set) appends "job_id time.time()" to the file first, one O_APPEND write per job: the
project's "job function's first line", measured as procrastinate's is in bench/peer_procrastinate.py.
"""

import os

_stamps = os.environ.get("PF_BENCH_RUN_STAMPS")
if _stamps:
    import dataclasses
    import time

    from dispatch_app.domains import registry as _registry

    def _stamping(work):
        def stamped(ctx):
            line = f"{ctx.job_id} {time.time():.6f}\n".encode()
            fd = os.open(_stamps, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            return work(ctx)

        stamped.stamping = True
        return stamped

    _load = _registry._load

    def _load_stamping():
        # Wrapped as the registry loads (settings are not configured yet when this file runs).
        loaded = _load()
        for key, domain in list(loaded.items()):
            if callable(domain.work) and not getattr(domain.work, "stamping", False):
                loaded[key] = dataclasses.replace(domain, work=_stamping(domain.work))
        return loaded

    _registry._load = _load_stamping
