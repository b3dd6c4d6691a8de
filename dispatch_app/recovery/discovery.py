"""Recovery's SQL: discover candidates, re-read them (no lock), then lock them only to act.

All short transactions. Discovery only nominates: by the time a candidate is
re-read, a worker may have finished it or a user cancelled it, and the re-read
says so. The re-read takes no lock, because the evidence gathered after it
(Redis, the vendor) may take seconds and a worker finishing the job must not
wait for that; the action then locks the row and checks that nothing changed
since the re-read (a compare-and-set on status, attempt, updated_at and the
vendor-call ledger). A round re-reads its candidates in one snapshot and locks
them in one statement (``reread_many``, ``lock_unchanged_many``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction

import dispatch_app.store.api as store
from dispatch_app.recovery.decide import JobState
from dispatch_app.store.tables import ENVELOPE, JOB

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
  AND j.status = ANY(%(statuses)s)
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

# Every ledger write (a call recorded or settled) changes it.
LEDGER_MARK = (
    f"(SELECT count(*) || '/' || count(*) FILTER (WHERE v.status IN ('pending', 'unknown')) || '/' "
    f"|| coalesce(max(v.id), 0) || '/' || coalesce(max(v.finished_at)::text, '') "
    f"FROM {store.TABLE} v WHERE v.job_id = j.id)"
)

REREAD_SQL = f"""
SELECT j.id, j.status, j.attempt, j.updated_at, j.vendor_request_id, j.started_at,
       (SELECT e.status FROM {ENVELOPE} e WHERE e.job_id = j.id AND e.attempt = j.attempt),
       clock_timestamp(),
       (SELECT count(*) FROM {store.TABLE} v WHERE v.job_id = j.id),
       {LEDGER_MARK}
FROM {JOB} j
WHERE j.id = ANY(%s)
"""

LOCK_SQL = f"""
SELECT j.id, j.status, j.attempt, j.updated_at, {LEDGER_MARK}
FROM {JOB} j
WHERE j.id = ANY(%s)
ORDER BY j.id
FOR UPDATE OF j SKIP LOCKED
"""

# Any run past the running threshold: a paced-out round still looks at those (``discover_paced``).
STALE_RUN_SQL = f"""
SELECT EXISTS (
    SELECT 1 FROM {JOB} j
    WHERE j.domain = %(domain)s AND j.status = 'running'
      AND j.updated_at < clock_timestamp() - make_interval(secs => %(running)s))
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
    """One short transaction: up to B candidates, oldest first; the (B+1)th only says "has more".

    A paced round looks at fewer (``discover_paced``).
    """
    with transaction.atomic(), connection.cursor() as cursor:
        return _discover(cursor, policy, ACTIVE, policy.batch_size)


def discover_paced(policy, limit: int) -> Discovery:
    """A paced round's candidates: every stale run (up to B), then up to ``limit`` of the rest, oldest first.

    A run past the running threshold is a job a worker had started, most often one whose worker died: re-running
    it gives the workers back the load they carried, bounded by how many jobs they run at once, not a backlog's.
    Pacing holds back what never started; it does not hold a killed worker's job for the floor's period.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        runs = _discover(cursor, policy, ["running"], policy.batch_size)
        rest = _discover(cursor, policy, ["submitted", "queued"], _batch(policy, limit))
    candidates = sorted(runs.candidates + rest.candidates, key=lambda c: (c.updated_at, c.job_id))
    return Discovery(candidates, has_more=runs.has_more or rest.has_more)


def stale_runs(policy) -> bool:
    """Whether the domain has a run past its running threshold (one indexed look, no lock)."""
    with connection.cursor() as cursor:
        cursor.execute(STALE_RUN_SQL, {"domain": policy.domain, "running": policy.running_stale_seconds})
        return cursor.fetchone()[0]


ACTIVE = ["submitted", "queued", "running"]


def _batch(policy, limit: int) -> int:
    return max(0, min(limit, policy.batch_size))


def _discover(cursor, policy, statuses: list[str], batch: int) -> Discovery:
    params = {
        "domain": policy.domain,
        "statuses": statuses,
        "queued": policy.queued_stale_seconds,
        "running": policy.running_stale_seconds,
        "least": min(policy.queued_stale_seconds, policy.running_stale_seconds),
        "limit": batch + 1,
    }
    cursor.execute(DISCOVERY_SQL, params)
    candidates = [Candidate(*row) for row in cursor.fetchall()]
    return Discovery(candidates[:batch], has_more=len(candidates) > batch)


def reread(job_id: int) -> tuple[JobState, datetime] | None:
    """The job, its calls in doubt and the database clock, from one snapshot; None if the job is gone."""
    return reread_many([job_id]).get(job_id)


def reread_many(job_ids: list[int]) -> dict[int, tuple[JobState, datetime]]:
    """Each job with its calls in doubt and the database clock, all from one snapshot (a round's candidates).

    A short read-only transaction (repeatable read, so each ledger and its job agree); no row lock.
    A job that is gone is not in the result.
    """
    assert not connection.in_atomic_block, "reread takes its own snapshot; the evidence is gathered outside it"
    if not job_ids:
        return {}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        cursor.execute(REREAD_SQL, [list(job_ids)])
        rows = cursor.fetchall()
        in_doubt = {row[0]: tuple(store.unsettled(row[0])) for row in rows if row[8]}
    states = {}
    for job_id, status, attempt, updated_at, request_id, started_at, envelope_status, now, recorded, mark in rows:
        state = JobState(
            job_id,
            status,
            attempt,
            updated_at,
            envelope_status,
            request_id or "",
            started_at=started_at,
            in_doubt=in_doubt.get(job_id, ()),
            calls_recorded=recorded,
            ledger_mark=mark or "",
        )
        states[job_id] = (state, now)
    return states


def lock_unchanged(state: JobState) -> str:
    """Lock the job for the action: "ok" if it is as ``state`` saw it, else "locked" or "moved"."""
    return lock_unchanged_many([state])[state.job_id]


def lock_unchanged_many(states: list[JobState]) -> dict[int, str]:
    """Lock the jobs for their actions, in one statement: per job "ok", "locked" or "moved" (as in lock_unchanged).

    Must run inside the actions' transaction, which then owns the locks (for a few statements only).
    A row another transaction holds is skipped, never waited for; rows are locked in id order.
    """
    assert connection.in_atomic_block, "lock_unchanged must run inside the action's transaction"
    with connection.cursor() as cursor:
        cursor.execute(LOCK_SQL, [[state.job_id for state in states]])
        rows = {row[0]: tuple(row[1:]) for row in cursor.fetchall()}
    seen = {}
    for state in states:
        row = rows.get(state.job_id)
        if row is None:
            seen[state.job_id] = "locked"
        elif row != (state.status, state.attempt, state.updated_at, state.ledger_mark):
            seen[state.job_id] = "moved"
        else:
            seen[state.job_id] = "ok"
    return seen


def moved(candidate: Candidate, state: JobState) -> bool:
    """Anything written to the job since discovery (the trigger moves updated_at on every update)."""
    return (candidate.status, candidate.attempt, candidate.updated_at) != (
        state.status,
        state.attempt,
        state.updated_at,
    )
