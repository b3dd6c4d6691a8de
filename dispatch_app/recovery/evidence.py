"""What the outside world says about a candidate: RQ's job, its worker, the vendor.

Redis is only a delivery channel and may have lost everything: a missing RQ job
is evidence too. Reads only, outside any transaction (no row lock is held while
they run); the connection is the domain's own (its queue's ``RQ_QUEUES`` entry,
``redis_servers.domain_connection``); every Redis call is bounded by the socket timeouts in its URL,
every vendor call by the provider's timeout (``call_with_timeout``).
"""

from __future__ import annotations

from datetime import datetime

import redis
from rq.exceptions import NoSuchJobError
from rq.job import Job as RQJob
from rq.serializers import JSONSerializer
from rq.worker import Worker

from dispatch_app.dispatch.publisher import rq_job_id
from dispatch_app.providers import call_with_timeout
from dispatch_app.recovery.decide import Evidence, JobState


def rq_job_status(job_id: int, attempt: int, connection: redis.Redis) -> tuple[str, str | None]:
    """(status, worker name) of the attempt's RQ job; ("missing", None) when Redis has no such job."""
    status, worker, _started = rq_job(job_id, attempt, connection)
    return status, worker


def rq_job(job_id: int, attempt: int, connection: redis.Redis) -> tuple[str, str | None, datetime | None]:
    """(status, worker name, RQ's started_at) of the attempt's RQ job; ("missing", None, None) without one."""
    rq_id = rq_job_id(job_id, attempt)
    if not RQJob.exists(rq_id, connection):
        return "missing", None, None
    try:
        job = RQJob.fetch(rq_id, connection=connection, serializer=JSONSerializer)
    except NoSuchJobError:  # expired between the two calls
        return "missing", None, None
    status = job.get_status(refresh=False)
    return (getattr(status, "value", status) or "missing"), (job.worker_name or None), job.started_at


def worker_alive(name: str | None, connection: redis.Redis) -> bool | None:
    """A worker's hash lives while it heartbeats (it expires after the worker's TTL) and says when it died."""
    return worker_seen(name, connection)[0]


def worker_seen(name: str | None, connection: redis.Redis) -> tuple[bool | None, datetime | None]:
    """(alive, its last heartbeat by its own clock) of a worker; (None, None) without a name."""
    if not name:
        return None, None
    worker = Worker.find_by_key(Worker.redis_worker_namespace_prefix + name, connection=connection)
    if worker is None:
        return False, None
    return worker.death_date is None, worker.last_heartbeat


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
    rq_status, worker, rq_started = rq_job(state.job_id, state.attempt, connection)
    alive, heartbeat, started_for = None, None, None
    if rq_status == "started":
        alive, heartbeat = worker_seen(worker, connection)
        if alive and heartbeat is not None and rq_started is not None:
            started_for = (heartbeat - rq_started).total_seconds()
    vendor, error, answers = None, "", []
    if (
        state.status == "running"
        and not (rq_status == "started" and alive)
        and not policy.retry_safe
        and policy.uses_vendor_request_id
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
        vendor_status=vendor,
        vendor_error=error,
        vendor_answers=tuple(answers),
    )
