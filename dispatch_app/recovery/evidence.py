"""What the outside world says about a candidate: RQ's job, its worker, the vendor.

Redis is only a delivery channel and may have lost everything: a missing RQ job
is evidence too. Reads only, outside any transaction (no row lock is held while
they run); the connection is the domain's own (its queue's ``RQ_QUEUES`` entry,
``rq.servers.domain_connection``); what RQ says is read by ``rq.state.evidence``, bounded by its URL's timeouts,
every vendor call by the provider's timeout (``call_with_timeout``).
"""

from __future__ import annotations

import redis

from dispatch_app.domains.base import ASK
from dispatch_app.domains.providers import call_with_timeout
from dispatch_app.recovery.decide import RQ_WAITING, Evidence, JobState
from dispatch_app.rq.state.attempts import RQSeen, rq_job, rq_job_status, worker_alive, worker_seen

__all__ = ["RQSeen", "gather", "rq_job", "rq_job_status", "vendor_status", "worker_alive", "worker_seen"]


def vendor_status(request_id: str, provider) -> tuple[str, str]:
    timeout = float(getattr(provider, "timeout", 30.0))
    try:
        # Guarded here too: a recovery round must not hang on a client that ignores its own timeout.
        return call_with_timeout(lambda: provider.request_status(request_id), timeout, f"status of {request_id}"), ""
    except Exception as exc:  # the vendor being down is evidence ("ask later"), not a failed round
        return "error", f"{type(exc).__name__}: {exc}"


def gather(state: JobState, policy, connection: redis.Redis, provider) -> Evidence:
    """Ask only what the decision can use for this state."""
    if state.status not in ("submitted", "queued", "running"):
        return Evidence()
    if state.status == "submitted" and state.envelope_status == "pending":
        return Evidence()  # in the outbox: the dispatcher's business
    seen = rq_job(state.job_id, state.attempt, connection)
    rq_status, worker, rq_started = seen.status, seen.worker, seen.started_at
    alive, heartbeat, started_for = None, None, None
    if rq_status == "started":
        alive, heartbeat = worker_seen(worker, connection)
        if alive and heartbeat is not None and rq_started is not None:
            started_for = (heartbeat - rq_started).total_seconds()
    # No worker ever wrote its start (RQ's start sets both; a requeue from the failed registry clears started_at
    # only): whatever PostgreSQL says, the job's function never ran (a worker runs it only after that write).
    never_started = state.status == "running" and rq_status in RQ_WAITING and rq_started is None and not worker
    vendor, error, answers = None, "", []
    if (
        state.status == "running"
        and not (rq_status == "started" and alive)
        and not never_started
        and policy.in_doubt(askable=True) == ASK
    ):
        # The ledger's calls in doubt, oldest position first; a job from before the ledger has only its request id.
        for call in sorted(state.in_doubt, key=lambda c: c.seq):
            if call.request_id:
                status, why = vendor_status(call.request_id, provider)
                answers.append((call.id, status, why))
                if status not in ("succeeded", "failed", "unknown"):
                    break  # this call decides already (wait, or outcome_unknown): no need to ask about later ones
        if not state.calls_recorded and state.vendor_request_id:
            vendor, error = vendor_status(state.vendor_request_id, provider)
    return Evidence(
        rq_status=rq_status,
        worker_name=worker,
        worker_alive=alive,
        started_for=started_for,
        rq_listed=seen.listed,
        rq_unread_depth=seen.unread_depth,
        rq_never_started=never_started or None,
        vendor_status=vendor,
        vendor_error=error,
        vendor_answers=tuple(answers),
    )
