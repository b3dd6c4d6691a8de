"""Recovery's SQL: discover candidates, then re-read one under its row lock.

Both are short transactions. Discovery only nominates: by the time a candidate
is re-read, a worker may have finished it or a user cancelled it, and the
re-read says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction

from dispatch_app.recovery.decide import JobState

JOB = "dispatch_app_job"
ENVELOPE = "dispatch_app_dispatchenvelope"

# Served by job_recovery_candidates (domain, updated_at, id) WHERE status IN active:
# the least threshold is an index range, the per-status one a filter on the few rows
# it leaves. A submitted job whose envelope is still pending is in the outbox, not
# lost: the dispatcher's business, so it never takes a slot of the batch.
DISCOVERY_SQL = f"""
SELECT j.id, j.status, j.attempt, j.updated_at,
       EXTRACT(EPOCH FROM clock_timestamp() - j.updated_at)::float8 AS age
FROM {JOB} j
WHERE j.domain = %(domain)s
  AND j.status IN ('submitted', 'queued', 'running')
  AND j.updated_at < clock_timestamp() - make_interval(secs => %(least)s)
  AND j.updated_at < clock_timestamp() - make_interval(
        secs => CASE WHEN j.status = 'running' THEN %(running)s ELSE %(queued)s END)
  AND NOT (j.status = 'submitted' AND EXISTS (
        SELECT 1 FROM {ENVELOPE} e
        WHERE e.job_id = j.id AND e.attempt = j.attempt AND e.status = 'pending'))
ORDER BY j.updated_at, j.id
LIMIT %(limit)s
FOR UPDATE OF j SKIP LOCKED
"""

REREAD_SQL = f"""
SELECT j.status, j.attempt, j.updated_at, j.vendor_request_id,
       (SELECT e.status FROM {ENVELOPE} e WHERE e.job_id = j.id AND e.attempt = j.attempt),
       clock_timestamp()
FROM {JOB} j
WHERE j.id = %s
FOR UPDATE OF j SKIP LOCKED
"""


@dataclass(frozen=True)
class Candidate:
    job_id: int
    status: str
    attempt: int
    updated_at: datetime
    age_seconds: float


@dataclass(frozen=True)
class Discovery:
    candidates: list[Candidate]
    has_more: bool

    @property
    def oldest_age(self) -> float | None:
        return self.candidates[0].age_seconds if self.candidates else None


def discover(policy) -> Discovery:
    """One short transaction: up to B candidates, oldest first; the (B+1)th only says "has more"."""
    params = {
        "domain": policy.domain,
        "queued": policy.queued_stale_seconds,
        "running": policy.running_stale_seconds,
        "least": min(policy.queued_stale_seconds, policy.running_stale_seconds),
        "limit": policy.batch_size + 1,
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(DISCOVERY_SQL, params)
        rows = cursor.fetchall()
    candidates = [Candidate(*row) for row in rows]
    return Discovery(candidates[: policy.batch_size], has_more=len(candidates) > policy.batch_size)


def reread(job_id: int) -> tuple[JobState, datetime] | None:
    """The job and the database clock, under its row lock; None if another transaction holds it.

    Must run inside the caller's transaction, which then owns the lock.
    """
    assert connection.in_atomic_block, "reread must run inside the candidate's transaction"
    with connection.cursor() as cursor:
        cursor.execute(REREAD_SQL, [job_id])
        row = cursor.fetchone()
    if row is None:
        return None
    status, attempt, updated_at, vendor_request_id, envelope_status, now = row
    state = JobState(job_id, status, attempt, updated_at, envelope_status, vendor_request_id or "")
    return state, now


def moved(candidate: Candidate, state: JobState) -> bool:
    """Anything written to the job since discovery (the trigger moves updated_at on every update)."""
    return (candidate.status, candidate.attempt, candidate.updated_at) != (
        state.status,
        state.attempt,
        state.updated_at,
    )
