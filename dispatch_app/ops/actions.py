"""Operator actions. Each changes state only through the outbox tables; nothing here talks to Redis.

Every action is a compare-and-set in one short transaction, records a JobEvent
naming the operator, and returns whether it applied: a row that moved on since
the operator looked (a dispatcher claimed it, a worker finished it) is left as is.
The envelope triggers NOTIFY the dispatcher on commit when work becomes due.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection, transaction

from dispatch_app import outbox
from dispatch_app.models import JobEvent

ENVELOPE = "dispatch_app_dispatchenvelope"
JOB = "dispatch_app_job"


@dataclass(frozen=True)
class Outcome:
    applied: bool
    message: str


def _actor(user) -> str:
    return getattr(user, "get_username", lambda: "system")() or "system"


def retry_envelope_now(envelope_id: int, *, user=None) -> Outcome:
    """A pending envelope waiting on a backoff (or a delay) becomes due now; one in flight (leased) is left."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {ENVELOPE} SET available_at = clock_timestamp() "
            "WHERE id = %s AND status = 'pending' AND lease_token IS NULL AND available_at > clock_timestamp() "
            "RETURNING job_id, attempt",
            [envelope_id],
        )
        row = cursor.fetchone()
        if row is None:
            return Outcome(False, f"envelope {envelope_id} is not a pending envelope waiting for later")
        JobEvent.objects.create(
            job_id=row[0],
            attempt=row[1],
            kind="operator_retry_now",
            reason=f"by {_actor(user)}",
            data={"envelope_id": envelope_id},
        )
    return Outcome(True, f"envelope {envelope_id} is due now")


def retry_job_now(job_id: int, *, user=None) -> Outcome:
    """In the outbox: make its pending envelope due now. Stuck in RQ or on a worker: redispatch the next attempt."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT attempt, status FROM {JOB} WHERE id = %s FOR UPDATE", [job_id])
        row = cursor.fetchone()
        if row is None:
            return Outcome(False, f"job {job_id} does not exist")
        attempt, status = row
        cursor.execute(
            f"SELECT id FROM {ENVELOPE} WHERE job_id = %s AND attempt = %s AND status = 'pending'",
            [job_id, attempt],
        )
        pending = cursor.fetchone()
        if pending is not None:
            outcome = retry_envelope_now(pending[0], user=user)
            if outcome.applied:
                return outcome
            return Outcome(False, f"job {job_id} is already due or being sent")
        if status not in ("submitted", "queued", "running"):
            return Outcome(False, f"job {job_id} is {status}; only unfinished jobs can be retried")
        new_attempt = outbox.redispatch(
            job_id, attempt, kind="operator_redispatch", reason=f"retry now by {_actor(user)} (was {status})"
        )
    if new_attempt is None:
        return Outcome(False, f"job {job_id} moved on; nothing done")
    return Outcome(True, f"job {job_id} re-dispatched as attempt {new_attempt}")


REARM_SQL = f"""
WITH env AS (
    UPDATE {ENVELOPE} SET status = 'pending', send_attempts = 0, available_at = clock_timestamp(), lease_token = NULL
    WHERE id = %(id)s AND status = 'dead'
    RETURNING id, job_id, attempt, last_error
), job AS (
    UPDATE {JOB} j SET status = 'submitted', finished_at = NULL, error = ''
    FROM env WHERE j.id = env.job_id AND j.attempt = env.attempt AND j.status IN ('failed', 'submitted')
    RETURNING j.id
)
SELECT env.job_id, env.attempt, env.last_error, (SELECT count(*) FROM job) FROM env
"""


def rearm_envelope(envelope_id: int, *, user=None) -> Outcome:
    """A dead envelope goes back to pending with a fresh send budget; its job (failed by that death) is
    submitted again for the same attempt. Refused when the job has moved on (cancelled, a later attempt)."""
    with transaction.atomic(), connection.cursor() as cursor:
        # Lock the job first, in the order every other writer uses (job, then envelope is fine: claims
        # never lock jobs), so the check below and the update see one state.
        cursor.execute(
            f"SELECT j.status, j.attempt = e.attempt FROM {ENVELOPE} e JOIN {JOB} j ON j.id = e.job_id "
            "WHERE e.id = %s AND e.status = 'dead' FOR UPDATE OF j",
            [envelope_id],
        )
        row = cursor.fetchone()
        if row is None:
            return Outcome(False, f"envelope {envelope_id} is not dead")
        status, current = row
        if not current or status not in ("failed", "submitted"):
            return Outcome(False, f"envelope {envelope_id}: its job has moved on ({status}); not re-armed")
        cursor.execute(REARM_SQL, {"id": envelope_id})
        job_id, attempt, last_error, _ = cursor.fetchone()
        JobEvent.objects.create(
            job_id=job_id,
            attempt=attempt,
            kind="operator_rearm",
            reason=f"by {_actor(user)}",
            data={"envelope_id": envelope_id, "previous_error": last_error},
        )
    return Outcome(True, f"envelope {envelope_id} re-armed; job {job_id} attempt {attempt} is back in the outbox")


def cancel_job(job_id: int, *, user=None, reason: str = "") -> Outcome:
    """An unfinished job becomes cancelled. A pending envelope may still be sent: the worker's start
    compare-and-set (submitted/queued -> running) refuses a cancelled job, so nothing runs."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {JOB} SET status = 'cancelled', finished_at = clock_timestamp() "
            "WHERE id = %s AND status IN ('submitted', 'queued', 'running') RETURNING attempt, "
            "(SELECT status FROM dispatch_app_job WHERE id = %s)",
            [job_id, job_id],
        )
        row = cursor.fetchone()
        if row is None:
            return Outcome(False, f"job {job_id} is already finished; not cancelled")
        attempt, previous = row
        JobEvent.objects.create(
            job_id=job_id,
            attempt=attempt,
            kind="operator_cancel",
            reason=f"by {_actor(user)}" + (f": {reason}" if reason else ""),
            data={"previous_status": previous},
        )
    return Outcome(True, f"job {job_id} cancelled (was {previous})")
