"""The job's start: one protocol, whether it is made ahead of the take or when the job runs.

``start`` is the one function that starts a job (store.START_SQL on (job, attempt), by this worker, in the
entry point's domains), with one contract: the start's row (payload, trace context, started_at, domain), or None
when the attempt is not startable (a duplicate delivery, a refused one: the caller records why). Made ahead
(``ahead=True``), it is one try and an error is None (the job's run meets it again); made when the job runs, a
start this worker already made ahead for this job is taken as it is, and a lost connection is retried on fresh
ones until PostgreSQL is back (``WORKER_DB_OUTAGE_WAIT``), a start lost with its answer found again.

An idle worker woken by a job knows the job's (id, attempt) from its RQ id
(``pf-<id>-<attempt>``) before it has the job's hash. The start compare-and-set
(store.START_SQL) then runs while the take's script call is on its way
(``fetch.PendingTake``): the job's start is durable in PostgreSQL and in Redis one
round trip sooner than one after the other. Nothing the job does happens before
both are in: the worker hands the start over with the job it performs (an attribute of the job,
``rq.current.START_ATTRIBUTE``) and ``dispatch_app.execution.execute`` takes it (``claim``) instead of running its
own (``start``).

When the take does not hand this worker the job after all (its hash vanished,
its reply was lost and the job went back to its queue, it cannot be read, the
worker stops first), the start is withdrawn (store.withdraw_start): the job
is ``queued`` again, as if this worker had never seen it, and an event says why.
A worker killed in between leaves a ``running`` job whose RQ job never started;
recovery knows that nothing ran then (recovery.decide).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import Error

import dispatch_app.db.prepared as prepared
import dispatch_app.rq.current as current
import dispatch_app.store.api as store
from dispatch_app.config.settings import dispatch_settings
from dispatch_app.db.check import worker_check as _check
from dispatch_app.db.retry import on_fresh_connections

log = logging.getLogger("dispatch_app.rqworker")
run_log = logging.getLogger("dispatch_app.execution")


@dataclass(frozen=True)
class Held:
    """A start this worker made ahead of its job: START_SQL's row (payload, trace context, started_at, domain)."""

    rq_id: str
    job_id: int
    attempt: int
    row: tuple
    queue: str

    @property
    def domain(self) -> str:
        return self.row[3]


def start(job_id: int, attempt: int, domains: list[str] | None, *, worker: str, ahead: bool = False) -> tuple | None:
    """The job's start (the module's contract): START_SQL's row, or None when the attempt is not startable.

    ``domains``: the keys the job may be in (the entry point's); None: any (tools and tests only).
    """
    if ahead:
        with prepared.cursor() as cursor:
            return store.start(cursor, worker, job_id, attempt, domains)
    row = claim(job_id, attempt)
    if row is not None:
        return row

    def run(cursor, retry: bool):
        row = store.start(cursor, worker, job_id, attempt, domains)
        if row is None and retry:
            # A start older than the retries can be is not this call's.
            within = dispatch_settings().WORKER_DB_OUTAGE_WAIT + 60
            row = store.start_made_by(cursor, worker, job_id, attempt, within)
        return row

    return on_fresh_connections(
        run,
        run_log,
        "job %s attempt %s: connection lost before the start; retrying on a fresh connection",
        job_id,
        attempt,
        action="start_retry",
    )


def begin(worker_name: str, rq_id: str, queue: str) -> Held | None:
    """The job's start, made ahead of its take; None for a job that is not the dispatcher's, not startable, or on
    an error (``execute`` then runs the start itself, as without this, and reports what it finds)."""
    from dispatch_app.domains.registry import lane_domains
    from dispatch_app.rq.ids import parse_rq_job_id, rq_job_id

    ours = parse_rq_job_id(rq_id)
    # Only the id is known yet (the hash is on its way): a job of a domain this queue serves, by the id the
    # dispatcher gives it, or nothing. The worker checks the hash before it runs this start's job (admission).
    domains = lane_domains(queue)
    if ours is None or rq_job_id(*ours) != rq_id or not domains:
        return None
    job_id, attempt = ours
    try:
        _check.before()
        row = start(job_id, attempt, domains, worker=worker_name, ahead=True)
    except Exception as exc:  # noqa: BLE001 - the take's reply is still to be read; execute meets the error again
        log.warning(
            "job %s attempt %s: start ahead of the take failed (%s); the job starts when it runs",
            job_id,
            attempt,
            exc,
            extra={"action": "worker_prestart_failed", "domain": queue},
        )
        _check.after()
        return None
    return None if row is None else Held(rq_id, job_id, attempt, row, queue)


def claim(job_id: int, attempt: int) -> tuple | None:
    """The start made for this job, handed over by its worker with the job (``rq.current.take_start``) and taken by
    ``execute``; None when there is none (it starts the job itself)."""
    held = current.take_start(job_id, attempt)
    return None if held is None else held.row


def withdraw(held: Held, why: str) -> None:
    """Undo a start whose job this worker will not run (store.withdraw_start); logged, never raised."""
    started_at: Any = held.row[2]
    try:
        done = store.withdraw_start(held.job_id, held.attempt, started_at, f"start withdrawn by its worker: {why}")
    except Error as exc:
        log.error(
            "job %s attempt %s: its start could not be withdrawn (%s): it stays running until recovery, which "
            "sees its RQ job never started",
            held.job_id,
            held.attempt,
            exc,
            extra={"action": "worker_start_withdraw_failed", "domain": held.queue},
        )
        return
    log.warning(
        "job %s attempt %s: start withdrawn (%s)%s",
        held.job_id,
        held.attempt,
        why,
        "" if done else "; the job had moved on already",
        extra={"action": "worker_start_withdrawn", "domain": held.queue},
    )
