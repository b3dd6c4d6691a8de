"""A domain's pause (``DomainPause``) and its audit rows (``DomainPauseEvent``): the operator's pause and resume."""

from __future__ import annotations

from dispatch_app.models import DomainPauseEvent

PAUSE_SQL = (
    "INSERT INTO dispatch_app_domainpause (domain, paused_at, paused_by, reason) "
    "VALUES (%s, clock_timestamp(), %s, %s) ON CONFLICT (domain) DO NOTHING RETURNING id"
)
RESUME_SQL = "DELETE FROM dispatch_app_domainpause WHERE domain = %s RETURNING id"
REASON_MAX = 2000


def pause(cursor, domain: str, actor: str, reason: str) -> int | None:
    """The pause row's id, with its event; None when the domain was paused already (nothing written)."""
    cursor.execute(PAUSE_SQL, [domain, actor, reason[:REASON_MAX]])
    row = cursor.fetchone()
    if row is None:
        return None
    DomainPauseEvent.objects.create(domain=domain, op="pause", actor=actor, reason=reason[:REASON_MAX])
    return row[0]


def resume(cursor, domain: str, actor: str, reason: str) -> int | None:
    """The removed pause row's id, with its event; None when the domain was not paused (nothing written)."""
    cursor.execute(RESUME_SQL, [domain])
    row = cursor.fetchone()
    if row is None:
        return None
    DomainPauseEvent.objects.create(domain=domain, op="resume", actor=actor, reason=reason[:REASON_MAX])
    return row[0]
