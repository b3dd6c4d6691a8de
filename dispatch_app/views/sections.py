"""The dashboard's reads, one section at a time, each bounded: a slow or locked table costs one section, not the page.

The page exists for incidents, and PostgreSQL under strain is one: a table held by a long ``ALTER`` or ``VACUUM
FULL``, a bloated index, a saturated disk. Read as one unit, the first slow statement would hold the page until the
session's ``statement_timeout`` (30 s) or ``lock_timeout`` and then fail it whole (a 500). So each section (jobs by
status, recovery rounds, latency, …) runs in its own transaction (a savepoint when the caller is already in one)
with ``SET LOCAL statement_timeout`` = ``DASHBOARD_STATEMENT_TIMEOUT``: a section that fails or runs out of time is
rolled back alone, recorded in ``unreadable`` with PostgreSQL's reason, and replaced by its ``fallback`` (which the
templates show as unknown, "–", never as zero); every other section still reads.

``set_config(..., true)`` is ``SET LOCAL``: it ends with the transaction, or with the savepoint if that is rolled
back. A savepoint that is released keeps it, so inside a caller's transaction the previous value is put back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, connection, transaction

log = logging.getLogger("dispatch_app.views.sections")

LIMIT_SQL = "SELECT current_setting('statement_timeout'), set_config('statement_timeout', %s, true)"
RESTORE_SQL = "SELECT set_config('statement_timeout', %s, true)"

# Each section's name in the "cannot be read" banner.
LABELS = {
    "clock": "the database clock",
    "jobs": "jobs by status",
    "envelopes": "envelopes by status",
    "recovery": "recovery rounds",
    "latency": "the dispatch latency percentiles",
    "throughput": "the all-domains chart",
    "dispatchers": "dispatcher processes",
    "notify_queue": "the NOTIFY queue usage",
    "rq": "the RQ side's PostgreSQL part (head ages, worker sessions)",
    "failures": "the failure counts",
    "activity": "jobs started / finished per minute",
    "charts": "the per-domain charts",
    "paused": "which domains are paused",
    "failure_alarms": "the failure alarm",
    "worker_outcomes": "the workers' outcomes in PostgreSQL",
    "running_workers": "the workers holding running jobs",
    "waits": "what pending envelopes wait behind",
    "outbox_due": "the outbox-age alarm",
    "prefetched": "jobs prefetched by dead workers",
}


def direct(name: str, read: Callable[[Any], Any], fallback: Any = None) -> Any:
    """No bounds: ``read(cursor)`` on the caller's connection as it is (what a reader without a page uses)."""
    with connection.cursor() as cursor:
        return read(cursor)


class Sections:
    """``sections.read(name, fn, fallback)``: ``fn(cursor)`` bounded, or ``fallback`` with the reason noted."""

    def __init__(self, timeout: float):
        self.timeout_ms = max(1, round(timeout * 1000))
        self.unreadable: dict[str, str] = {}

    def read(self, name: str, read: Callable[[Any], Any], fallback: Any = None) -> Any:
        nested = connection.in_atomic_block
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(LIMIT_SQL, [f"{self.timeout_ms}ms"])
                previous = cursor.fetchone()[0]
                value = read(cursor)
                if nested:
                    cursor.execute(RESTORE_SQL, [previous])
            return value
        except DatabaseError as exc:
            reason = f"{type(getattr(exc, '__cause__', None) or exc).__name__}: {' '.join(str(exc).split())}"
            self.unreadable[name] = reason
            log.warning(
                "dashboard section %s unreadable: %s",
                name,
                reason,
                extra={"action": "dashboard_section_unreadable", "domain": "ops"},
            )
            return fallback


def banners(unreadable: dict[str, str], timeout: float) -> list[dict]:
    """One red banner per section PostgreSQL did not answer in time (or refused): what is missing, and why."""
    return [
        {
            "level": "error",
            "key": "db-unreadable",
            "section": name,
            "text": f"PostgreSQL: {LABELS.get(name, name)} cannot be read ({reason}; each section has "
            f"{timeout:g} s, DASHBOARD_STATEMENT_TIMEOUT); shown as unknown (–), the rest of the page is current.",
        }
        for name, reason in unreadable.items()
    ]
