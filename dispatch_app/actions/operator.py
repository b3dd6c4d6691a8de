"""Operator actions. Each changes state only through the outbox tables; nothing here talks to Redis.

Every action is a compare-and-set in one short transaction, records a JobEvent
naming the operator and an entry in Django's admin log (LogEntry, the admin's
"Recent actions" and object history), and returns whether it applied: a row that
moved on since the operator looked (a dispatcher claimed it, a worker finished
it) is left as is. The envelope triggers NOTIFY the dispatcher on commit when
work becomes due.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import connection, transaction

import dispatch_app.store.api as store
from dispatch_app.config.settings import NOTIFY_CHANNEL
from dispatch_app.domains import domain_keys
from dispatch_app.models import DispatchEnvelope, DomainPause, Job
from dispatch_app.store.tables import ENVELOPE, JOB


@dataclass(frozen=True)
class Outcome:
    applied: bool
    message: str


def _actor(user) -> str:
    return getattr(user, "get_username", lambda: "system")() or "system"


def _admin_log(user, model, object_id, object_repr: str, message: str) -> None:
    """One row in Django's admin log, in the action's own transaction (no user: a script, nothing to log)."""
    if getattr(user, "pk", None) is None:
        return
    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.contenttypes.models import ContentType

    LogEntry.objects.create(
        user_id=user.pk,
        content_type=ContentType.objects.get_for_model(model),
        object_id=str(object_id),
        object_repr=object_repr[:200],
        action_flag=CHANGE,
        change_message=message,
    )


def retry_envelope_now(envelope_id: int, *, user=None) -> Outcome:
    """A pending envelope waiting on a backoff (or a delay) becomes due now; one in flight (leased) is left."""
    with transaction.atomic(), connection.cursor() as cursor:
        row = store.make_due_now(cursor, envelope_id)
        if row is None:
            return Outcome(False, f"envelope {envelope_id} is not a pending envelope waiting for later")
        store.record_event(
            row[0],
            row[1],
            "operator_retry_now",
            actor=_actor(user),
            reason=f"by {_actor(user)}",
            data={"envelope_id": envelope_id},
        )
        _admin_log(user, DispatchEnvelope, envelope_id, f"envelope {envelope_id} (job {row[0]})", "Made due now")
    return Outcome(True, f"envelope {envelope_id} is due now")


RETRYABLE_FINISHED = ("failed", "outcome_unknown")


def retry_job_now(job_id: int, *, user=None) -> Outcome:
    """In the outbox: make its pending envelope due now. Stuck in RQ or on a worker, or finished as failed or
    outcome_unknown: redispatch the next attempt through the outbox. Succeeded and cancelled jobs are refused."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT attempt, status FROM {JOB} WHERE id = %s FOR UPDATE", [job_id])
        row = cursor.fetchone()
        if row is None:
            return Outcome(False, f"job {job_id} does not exist")
        attempt, status = row
        # Refused before anything is written: a cancelled job may still have a pending envelope (the worker's
        # start refuses it), and making that envelope due would report a retry that never runs.
        if status not in ("submitted", "queued", "running", *RETRYABLE_FINISHED):
            return Outcome(False, f"job {job_id} is {status}; only unfinished, failed or outcome_unknown jobs retry")
        cursor.execute(
            f"SELECT id FROM {ENVELOPE} WHERE job_id = %s AND attempt = %s AND status = 'pending'",
            [job_id, attempt],
        )
        pending = cursor.fetchone()
        if pending is not None and status not in RETRYABLE_FINISHED:
            outcome = retry_envelope_now(pending[0], user=user)
            if outcome.applied:
                return outcome
            return Outcome(False, f"job {job_id} is already due or being sent")
        if pending is not None:
            # A failed job whose envelope is still pending cannot be (the dead-letter path closes both);
            # refuse rather than put two envelopes of one job in flight.
            return Outcome(False, f"job {job_id} is {status} with envelope {pending[0]} still pending; not retried")
        new_attempt = store.redispatch(
            job_id,
            attempt,
            kind="operator_redispatch",
            reason=f"retry now by {_actor(user)} (was {status})",
            allowed_statuses=("submitted", "queued", "running", *RETRYABLE_FINISHED),
            actor=_actor(user),
        )
        abandoned = 0
        if new_attempt is not None and status in RETRYABLE_FINISHED:
            store.reopen(cursor, job_id)
        if new_attempt is not None:
            # The operator confirmed a retry knowing the vendor calls in doubt (the confirmation page names them):
            # they count as not taken effect, or the new attempt would stop at the same call in doubt again.
            abandoned = store.abandon_in_doubt(job_id, f"operator retry by {_actor(user)}")
            note = f" ({abandoned} vendor call(s) in doubt will be made again)" if abandoned else ""
            _admin_log(
                user,
                Job,
                job_id,
                f"job {job_id}",
                f"Retried through the outbox: attempt {new_attempt} (was {status}){note}",
            )
    if new_attempt is None:
        return Outcome(False, f"job {job_id} moved on; nothing done")
    note = f"; {abandoned} vendor call(s) in doubt will be made again" if abandoned else ""
    return Outcome(True, f"job {job_id} re-dispatched as attempt {new_attempt} (was {status}){note}")


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
        job_id, attempt, last_error = store.rearm(cursor, envelope_id)
        store.record_event(
            job_id,
            attempt,
            "operator_rearm",
            actor=_actor(user),
            reason=f"by {_actor(user)}",
            data={"envelope_id": envelope_id, "previous_error": last_error},
        )
        _admin_log(
            user, DispatchEnvelope, envelope_id, f"envelope {envelope_id} (job {job_id})", "Re-armed (back to pending)"
        )
    return Outcome(True, f"envelope {envelope_id} re-armed; job {job_id} attempt {attempt} is back in the outbox")


def cancel_job(job_id: int, *, user=None, reason: str = "") -> Outcome:
    """An unfinished job becomes cancelled. A pending envelope may still be sent: the worker's start
    compare-and-set (submitted/queued -> running) refuses a cancelled job, so nothing runs."""
    with transaction.atomic(), connection.cursor() as cursor:
        row = store.cancel(cursor, job_id)
        if row is None:
            return Outcome(False, f"job {job_id} is already finished; not cancelled")
        attempt, previous = row
        store.record_event(
            job_id,
            attempt,
            "operator_cancel",
            actor=_actor(user),
            reason=f"by {_actor(user)}" + (f": {reason}" if reason else ""),
            data={"previous_status": previous},
        )
        note = f"Cancelled (was {previous})" + (f": {reason}" if reason else "")
        _admin_log(user, Job, job_id, f"job {job_id}", note)
    return Outcome(True, f"job {job_id} cancelled (was {previous})")


# --- Per-domain pause: the claim passes a paused domain's envelopes over (store.claim.CLAIM_SQL).


def _check_domain(domain: str) -> None:
    if domain not in domain_keys():
        raise ValueError(f"unknown domain {domain!r}; valid domains: {', '.join(domain_keys())}")


def pause_domain(domain: str, *, user=None, reason: str = "") -> Outcome:
    """Stop dispatching a domain: its envelopes stay pending (submits go on), nothing already in RQ is touched."""
    _check_domain(domain)
    with transaction.atomic(), connection.cursor() as cursor:
        pause_id = store.pause(cursor, domain, _actor(user), reason)
        if pause_id is None:
            return Outcome(False, f"{domain} is already paused")
        note = "Paused dispatch" + (f": {reason}" if reason else "")
        _admin_log(user, DomainPause, pause_id, f"{domain} dispatch", note)
    return Outcome(True, f"dispatch of {domain} paused; its envelopes stay pending")


def resume_domain(domain: str, *, user=None, reason: str = "") -> Outcome:
    """Dispatch the domain again, and wake the dispatchers: its due envelopes were announced while paused."""
    _check_domain(domain)
    with transaction.atomic(), connection.cursor() as cursor:
        pause_id = store.resume(cursor, domain, _actor(user), reason)
        if pause_id is None:
            return Outcome(False, f"{domain} is not paused")
        cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, domain])  # its due envelopes: worth a scan
        _admin_log(
            user, DomainPause, pause_id, f"{domain} dispatch", "Resumed dispatch" + (f": {reason}" if reason else "")
        )
    return Outcome(True, f"dispatch of {domain} resumed")


def paused_domains(cursor) -> dict[str, dict]:
    """{domain: {paused_by, reason, age}} with the age on the database clock."""
    cursor.execute(
        "SELECT domain, paused_by, reason, extract(epoch FROM clock_timestamp() - paused_at)::float8 "
        "FROM dispatch_app_domainpause ORDER BY domain"
    )
    return {d: {"paused_by": by, "reason": reason, "age": age} for d, by, reason, age in cursor.fetchall()}


# --- What a retry would do, per domain, before the operator confirms it.


@dataclass
class DomainRetryPlan:
    domain: str
    retry_safe: bool
    job_ids: list[int] = field(default_factory=list)
    by_status: dict[str, int] = field(default_factory=dict)
    # (job id, request id, what it was for, status): vendor calls whose effect nobody knows yet.
    vendor_in_doubt: list[tuple] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)  # (job id, status) that cannot be retried

    @property
    def warning(self) -> str:
        if self.retry_safe:
            return ""
        text = f"{self.domain} is not retry-safe: re-running repeats side effects an interrupted attempt may have had."
        if self.vendor_in_doubt:
            jobs = sorted({v[0] for v in self.vendor_in_doubt})
            text += (
                f" {len(jobs)} job(s) have a vendor request whose outcome is not known"
                f" (jobs {', '.join(map(str, jobs[:20]))}{' …' if len(jobs) > 20 else ''}):"
                " a retry may make (and bill) that request again."
            )
        return text


def retry_plan(job_ids) -> list[DomainRetryPlan]:
    from dispatch_app.config.settings import dispatch_settings
    from dispatch_app.domains.policy import resolve

    conf = dispatch_settings()
    ids = [int(i) for i in job_ids]
    plans: dict[str, DomainRetryPlan] = {}
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, domain, status, vendor_request_id FROM {JOB} WHERE id = ANY(%s) ORDER BY id", [ids])
        jobs = cursor.fetchall()
        cursor.execute(
            "SELECT job_id, request_id, purpose, status FROM dispatch_app_vendorcall "
            "WHERE job_id = ANY(%s) AND status IN ('pending', 'unknown') ORDER BY job_id, seq",
            [ids],
        )
        calls = cursor.fetchall()
    calls_by_job: dict[int, list] = {}
    for call in calls:
        calls_by_job.setdefault(call[0], []).append(call)
    for job_id, domain, status, request_id in jobs:
        if domain not in plans:
            safe = resolve(domain, conf.RECOVERY).retry_safe if domain in domain_keys() else False
            plans[domain] = DomainRetryPlan(domain, safe)
        plan = plans[domain]
        if status not in ("submitted", "queued", "running", *RETRYABLE_FINISHED):
            plan.refused.append((job_id, status))
            continue
        plan.job_ids.append(job_id)
        plan.by_status[status] = plan.by_status.get(status, 0) + 1
        in_doubt = calls_by_job.get(job_id, [])
        if not in_doubt and request_id and status in ("running", "outcome_unknown"):
            in_doubt = [(job_id, request_id, "vendor request", "unknown")]
        plan.vendor_in_doubt.extend(in_doubt)
    return sorted(plans.values(), key=lambda p: p.domain)
