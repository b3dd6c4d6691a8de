"""A job's history rows (``JobEvent``): what happened to an attempt beyond its timestamps.

Written in the caller's transaction (or as its own autocommit statement), so an event commits with the move it
describes or not at all. The dispatcher's own events are written inside its envelope statements
(``store.claim``), the attempt history by triggers (``store.triggers.history``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dispatch_app.models import JobEvent


def record(job_id: int, attempt: int, kind: str, *, reason: str = "", actor: str = "", data: Any = None) -> JobEvent:
    """One event of ``job_id``'s ``attempt``; ``actor``: the operator's username (empty for the system's own)."""
    return JobEvent.objects.create(job_id=job_id, attempt=attempt, kind=kind, reason=reason, actor=actor, data=data)


def record_many(events: Iterable[dict[str, Any]]) -> None:
    """Many events in one statement; each a dict of ``record``'s arguments (``job_id``, ``attempt``, ``kind``, ...)."""
    JobEvent.objects.bulk_create(JobEvent(**event) for event in events)
