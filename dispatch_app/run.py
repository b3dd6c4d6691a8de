"""The path every RQ job hash of ours names: ``dispatch_app.run.<domain key>(job_id, attempt)``.

It stays this path (``Domain.task_path``) because jobs already in Redis carry it; the entry points themselves are in
``dispatch_app.rq.worker.entry``, behind RQ's one door.
"""

from __future__ import annotations


def __getattr__(key: str):
    from dispatch_app.rq.worker import entry

    return getattr(entry, key)
