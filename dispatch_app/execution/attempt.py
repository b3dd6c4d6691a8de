"""What an RQ worker runs: one entry point per domain, all through ``execute`` (start, run, settle).

The start is a compare-and-set on (job, attempt): a second delivery of the same
attempt finds the job no longer startable and does nothing. The start accepts
``submitted`` as well as ``queued`` because the worker can pick the job up before
the dispatcher's mark commits.
"""

from __future__ import annotations

import json
import logging
import traceback
from dataclasses import dataclass
from typing import Any

from django.db import InterfaceError, OperationalError, connection, transaction

import dispatch_app.execution.start_protocol as start_protocol
import dispatch_app.rq.current as current
import dispatch_app.store.api as store
import dispatch_app.timeline.tracing as tracing
from dispatch_app.config.settings import dispatch_settings
from dispatch_app.db.check import ConnectionCheck as _ConnectionCheck  # noqa: F401 - tests build their own
from dispatch_app.db.check import worker_check
from dispatch_app.db.retry import on_fresh_connections
from dispatch_app.domains import PayloadError, get_domain
from dispatch_app.domains.providers import ProviderError, get_provider
from dispatch_app.execution.context import WorkContext
from dispatch_app.store.api import DUPLICATE, finish, redispatch, start_refusal

log = logging.getLogger("dispatch_app.execution")
_check = worker_check  # shared with start_protocol.begin (db.check.worker_check); a test sets its own

# Job.error: "<module.ExceptionClass>: <message>", a blank line, the traceback; at most this long.
ERROR_MAX_CHARS = 8000


def _finish(job_id: int, attempt: int, status: str, result: Any = None, error: str = "", settled=None) -> bool:
    """Record the outcome; retried on fresh connections if the old one died during the work (db.retry).

    The work is done by now: losing its outcome would leave the job 'running'
    until recovery, which for a non-idempotent domain can only say outcome_unknown.
    """
    from psycopg.types.json import Jsonb

    value = Jsonb(result) if result is not None else None

    def run(cursor, retry: bool) -> bool:
        return finish(cursor, job_id, attempt, status, value, error[:ERROR_MAX_CHARS], settled=settled)

    return on_fresh_connections(
        run,
        log,
        "job %s attempt %s: connection lost before the outcome was saved; retrying on a fresh connection",
        job_id,
        attempt,
        action="finish_retry",
    )


def format_error(exc: BaseException) -> str:
    """The shape Job.error keeps: the exception's dotted class and message, a blank line, the traceback.

    Bounded: the first line is kept whole (up to the bound) and the traceback's
    end, where the failing frame is, wins over its beginning.
    """
    kind = type(exc)
    head = f"{kind.__module__}.{kind.__qualname__}: {exc}"[:ERROR_MAX_CHARS]
    trace = "".join(traceback.format_exception(exc)).rstrip()
    room = ERROR_MAX_CHARS - len(head) - 2
    if room <= 0:
        return head
    if len(trace) > room:
        trace = "...\n" + trace[-(room - 4) :]
    return f"{head}\n\n{trace}"


def execute(domain_key: str, job_id: int, attempt: int) -> dict:
    """Run one attempt of a job: start it, run the domain's ``work``, settle what came of it; returns the outcome."""
    _check.before()
    try:
        domain = get_domain(domain_key)
        started = _start(domain, job_id, attempt)
        if not isinstance(started, WorkContext):
            return started  # not started, or its payload refused: nothing ran
        return _settle(domain, started, _run(domain, started))
    finally:
        tracing.job_ended()  # ends the run span job_started opened (dispatch_app.timeline.tracing); else a no-op
        _check.after()


def _start(domain, job_id: int, attempt: int) -> WorkContext | dict:
    """The start (start_protocol: perhaps made already, while Redis handed the job over) and the payload checked:
    the context the work runs with, or the outcome when there is nothing to run."""
    row = start_protocol.start(job_id, attempt, [domain.key], worker=current.worker_name())
    if row is None:
        return _not_started(domain.key, job_id, attempt)
    tracing.job_started(domain.key, job_id, attempt, row[1], row[2])  # the run span, if the submit was traced
    # Django leaves jsonb undecoded on raw cursors.
    payload = json.loads(row[0]) if isinstance(row[0], str) else row[0]
    try:
        domain.validate(payload)
    except PayloadError as exc:
        # A poison payload fails the same way every time: no retry.
        _finish(job_id, attempt, "failed", error=f"payload rejected: {exc}")
        return {"failed": str(exc)}
    return WorkContext(
        job_id=job_id, attempt=attempt, payload=payload, provider=get_provider(), started_at=row[2], domain=domain.key
    )


@dataclass(frozen=True)
class Ran:
    """What the work returned, or the exception it raised (a BaseException that is not an Exception propagates)."""

    result: Any = None
    error: Exception | None = None
    # (call id, result) of the last vendor call, which succeeded: its outcome is written by the finish.
    settled: tuple[int, Any] | None = None


def _run(domain, ctx: WorkContext) -> Ran:
    try:
        result = domain.work(ctx)
    except BaseException as exc:
        ctx.write_outcome(quiet=True)  # the failure's own write (a retry, a failed finish) does not carry it
        if not isinstance(exc, Exception):
            raise
        return Ran(error=exc)  # every failure of the work is settled (_settle), none escapes RQ
    return Ran(result=result, settled=ctx.outcome_riding())


def _settle(domain, ctx: WorkContext, ran: Ran) -> dict:
    """The attempt's outcome saved: succeeded, a retry through the outbox, left in doubt, or failed."""
    job_id, attempt, exc = ctx.job_id, ctx.attempt, ran.error
    if isinstance(exc, ProviderError):
        return _provider_failed(domain, job_id, attempt, exc)
    if isinstance(exc, (OperationalError, InterfaceError)):
        return _connection_lost(domain, job_id, attempt, exc)
    if exc is not None:
        log.error(
            "job %s attempt %s crashed",
            job_id,
            attempt,
            exc_info=exc,
            extra={"action": "task_error", "domain": domain.key},
        )
        _finish(job_id, attempt, "failed", error=format_error(exc))
        return {"failed": str(exc)}
    if not _finish(job_id, attempt, "succeeded", result=ran.result, settled=ran.settled):
        store.record_event(
            job_id,
            attempt,
            "late_result",
            reason="finished after the job was moved on (recovered or cancelled)",
            data=ran.result,
        )
    return {"succeeded": True}


def _connection_lost(domain, job_id: int, attempt: int, exc: Exception) -> dict:
    """The session died mid-work (a terminated backend, a failover): no verdict on the work itself. What it did
    is in the vendor-call ledger, so the next attempt resumes after the calls that took effect."""
    log.warning(
        "job %s attempt %s: database connection lost during the work; retrying through the outbox",
        job_id,
        attempt,
        extra={"action": "work_connection_lost", "domain": domain.key},
    )
    connection.close()
    # The next attempt goes through the outbox, so the server must answer first: wait for it as the saves do
    # (past WORKER_DB_OUTAGE_WAIT this raises, and recovery takes the job over).
    on_fresh_connections(
        lambda cursor, retry: cursor.execute("SELECT 1"),
        log,
        "job %s attempt %s: waiting for the database to retry through the outbox",
        job_id,
        attempt,
        action="work_connection_wait",
    )
    return _provider_failed(domain, job_id, attempt, exc, reason=f"database connection lost during the work: {exc}")


def _not_started(domain_key: str, job_id: int, attempt: int) -> dict:
    """The start refused: a duplicate delivery (the usual case), or the start's gate (transitions.START_SQL)."""
    with connection.cursor() as cursor:
        refusal = start_refusal(cursor, job_id, attempt, [domain_key])
    if refusal is None:  # no such job: an RQ job for an id PostgreSQL never gave out
        log.warning(
            "job %s attempt %s: no such job; nothing started",
            job_id,
            attempt,
            extra={"action": "start_no_such_job", "domain": domain_key},
        )
        return {"refused": "no such job"}
    kind, reason = refusal
    store.record_event(job_id, attempt, kind, reason=reason)
    if kind == DUPLICATE:
        log.info(
            "job %s attempt %s: duplicate delivery ignored",
            job_id,
            attempt,
            extra={"action": "duplicate_delivery", "domain": domain_key},
        )
        return {"duplicate": True}
    log.warning(
        "job %s attempt %s: start refused: %s",
        job_id,
        attempt,
        reason,
        extra={"action": "start_refused", "domain": domain_key},
    )
    return {"duplicate": True, "refused": reason}


def _provider_failed(domain, job_id: int, attempt: int, exc: Exception, reason: str | None = None) -> dict:
    """A known vendor failure: retry through the outbox while attempts remain.

    The retry resumes from the failing call (the vendor-call ledger). A call in
    doubt is what the domain's policy says (``RecoveryPolicy.in_doubt``): in a
    retry-safe domain a failure like any other (the retry makes it again); with a
    vendor that can be asked, the job is left to recovery (which asks, within
    VENDOR_EVIDENCE_TRUST_SECONDS); otherwise it is outcome_unknown at once.
    """
    from dispatch_app.domains.base import CONCLUDE, RERUN
    from dispatch_app.domains.policy import resolve
    from dispatch_app.store.api import VendorCallInDoubt

    conf = dispatch_settings()
    # The same policy recovery uses, settings overrides included.
    policy = resolve(domain.key, conf.RECOVERY)
    in_doubt = isinstance(exc, VendorCallInDoubt)
    action = policy.in_doubt(askable=bool(exc.call.request_id)) if in_doubt else RERUN
    if action != RERUN:
        if action == CONCLUDE:
            reason = f"{exc}; it may have taken effect and this vendor cannot be asked"
            _finish(job_id, attempt, "outcome_unknown", error=reason)
            return {"outcome_unknown": reason}
        store.record_event(
            job_id,
            attempt,
            "vendor_call_in_doubt",
            reason=f"{exc}; left running for recovery to ask the vendor",
            data={"call": exc.call.as_dict()},
        )
        return {"in_doubt": str(exc)}

    reason = reason or (f"{exc}; re-running is safe" if in_doubt else f"provider failed: {exc}")
    if attempt < policy.max_attempts:
        delay = min(conf.SEND_BACKOFF_BASE * (2 ** (attempt - 1)), conf.SEND_BACKOFF_MAX)
        with transaction.atomic():
            if redispatch(
                job_id,
                attempt,
                kind="retry_after_failure",
                reason=reason,
                delay_seconds=delay,
                allowed_statuses=("running",),
            ):
                return {"retrying": True}
    _finish(job_id, attempt, "failed", error=reason)
    return {"failed": reason}
