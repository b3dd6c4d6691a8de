"""What RQ runs for a job: ``dispatch_app.run.<domain key>(job_id, attempt)``, the path naming this module.

The default ``Domain.task_path``. One attribute per declared domain, made on
first use, so an RQ job keeps its (job_id, attempt) arguments, the domain's key
is visible in RQ's own pages, and a domain module never imports the worker
(rq.utils.import_attribute resolves the path to this module's ``__getattr__``).
"""

from __future__ import annotations

from dispatch_app.execution import execute


def __getattr__(key: str):
    if key.startswith("__"):
        raise AttributeError(key)

    def entry(job_id: int, attempt: int) -> dict:
        return execute(key, job_id, attempt)

    entry.__name__ = entry.__qualname__ = key
    entry.__module__ = "dispatch_app.run"  # the path a job hash names (RQ's pages show it)
    # A module attribute from now on: later lookups (one per job) are plain ones, no __getattr__.
    globals()[key] = entry
    return entry
