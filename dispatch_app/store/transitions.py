"""The job's state machine: every statement that moves a job from one status to another.

::

    (submit) -> submitted --mark_queued--> queued --start--> running --finish--> succeeded | failed | outcome_unknown
                              submitted | queued <--withdraw_start-- running  (its worker never ran it)
                submitted --dead_letter--> failed            (its envelope could never be sent)
    submitted | queued | running --conclude--> outcome_unknown | failed   (recovery's verdict)
    submitted | queued | running --cancel--> cancelled       (operator)
    <allowed> --redispatch--> submitted, attempt + 1         (worker retry, recovery, operator)
    failed | submitted --rearm--> submitted, same attempt    (operator re-arms a dead envelope)

Every move is a compare-and-set in its WHERE clause on (job, attempt, status):
a move whose precondition no longer holds changes nothing and says so (no
row), so two processes racing over one job never both win. Under READ
COMMITTED a blocked UPDATE re-checks its WHERE on the row's newest version,
which is what makes the guard hold across concurrent transactions.

The statements run on the caller's cursor, inside the caller's transaction
(or as the caller's one autocommit statement): moving them here changed no SQL
and no round trip (tests/integration/execution/test_worker_cost.py pins the worker's two).
The ``*_CTE`` pieces are parts of the dispatcher's envelope statements, named
here so the job's side of those statements is owned here too; they read the
CTE named in their comment.

The job's creation (``submitted``, attempt 1) is the outbox write (``store.jobs``, called by ``outbox.submit``).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import connection, transaction

import dispatch_app.domains.lanes as lanes
import dispatch_app.store.events as events
import dispatch_app.store.vendor_calls as vendor_calls
from dispatch_app.domains import get_domain
from dispatch_app.store.envelope_builder import fresh_insert, fresh_params
from dispatch_app.store.tables import ATTEMPT, ENVELOPE, JOB
from dispatch_app.store.writer_lease import WRITER_TOKEN

UNFINISHED = ("submitted", "queued", "running")
FINISHED_BY_WORKER = ("succeeded", "failed", "outcome_unknown")
CONCLUDED_BY_RECOVERY = ("outcome_unknown", "failed")
TERMINAL = ("succeeded", "failed", "outcome_unknown", "cancelled")


class IllegalTransition(ValueError):
    """A move asked for a target status it can never produce (a bug in the caller, not a race)."""


# submitted -> queued, when the dispatcher marks its envelopes dispatched. Reads ``marked(job_id, attempt)``.
# Never backwards: a worker may already have started (or finished) the job.
MARK_QUEUED_CTE = f"""UPDATE {JOB} j
    SET status = CASE WHEN j.status = 'submitted' THEN 'queued' ELSE j.status END,
        dispatched_at = COALESCE(j.dispatched_at, m.dispatched_at), updated_at = clock_timestamp()
    FROM marked m
    WHERE j.id = m.job_id AND j.attempt = m.attempt
      AND (j.status = 'submitted' OR j.dispatched_at IS NULL)
    RETURNING j.id"""

# submitted -> failed, when the envelope of the job's current attempt is dead-lettered.
# Reads ``failed(job_id, attempt, status)`` and the parameter %(error)s.
DEAD_LETTER_CTE = f"""UPDATE {JOB} j
    SET status = 'failed', finished_at = clock_timestamp(),
        error = 'dispatch failed: ' || left(%(error)s, 2000)
    FROM failed f
    WHERE f.status = 'dead' AND j.id = f.job_id AND j.attempt = f.attempt AND j.status = 'submitted'
    RETURNING j.id"""

# submitted | queued -> running. ``submitted`` too: a worker can pick the job up before the dispatcher's
# mark commits. The worker names itself for the attempt history's trigger (history_triggers.WORKER_SETTING)
# in the same statement: set_config(..., true) lasts for this statement's implicit transaction only.
#
# The last gate (issue 26): whatever Redis handed the worker, the attempt starts only if it is the domain's
# whose entry point runs it (%s: the keys; NULL for any, tools and tests only), its domain is not paused,
# and the dispatcher sent it or may be sending it right now: the envelope of this attempt is
#   - dispatched (sent and marked), or
#   - pending and leased (a dispatcher claimed it while it was due, and is sending it), or
#   - pending and claimed before (send_attempts > 0: a send whose reply was lost may have reached RQ), or
#   - pending and due now (available_at <= the database clock): sent ahead of its claim. A writer's NOTIFY
#     names an envelope only when it is due and its domain not paused (store.triggers.notify.NOTIFY_INSERTED),
#     and an idle dispatcher sends it before claiming it (dispatch.loop._send_announced), so it is still
#     pending, never leased, when its job starts (docs/architecture.md, "A sent-ahead envelope is still pending").
#     Accepting it admits nothing the dispatcher would not send at its next claim anyway.
# So a job scheduled for later, one whose envelope is dead or missing, or one of a paused domain does not
# start, whoever names it. A refused start changes nothing (no row); the worker asks why (START_REFUSAL_SQL).
#
# An envelope its writer sent (store.writer_lease) has no dispatcher to mark it: the start marks it dispatched, at
# the start (the database does not know when the writer's send reached RQ; never later than the start).
START_SQL = f"""
WITH started AS (
    UPDATE {JOB} j
    SET status = 'running', started_at = w.now, dispatched_at = COALESCE(j.dispatched_at, w.now), updated_at = w.now
    -- One reading of the clock: two could put an unmarked job's dispatch a microsecond after its start.
    FROM (SELECT set_config('productflow.worker', %s, true), clock_timestamp() AS now) AS w
    WHERE j.id = %s AND j.attempt = %s AND j.status IN ('submitted', 'queued')
      AND j.domain = ANY(COALESCE(%s::text[], ARRAY[j.domain]))
      AND j.domain NOT IN (SELECT domain FROM dispatch_app_domainpause)
      AND EXISTS (
          SELECT 1 FROM {ENVELOPE} e
          WHERE e.job_id = j.id AND e.attempt = j.attempt
            AND (e.status = 'dispatched'
                 OR (e.status = 'pending'
                     AND (e.lease_token IS NOT NULL OR e.send_attempts > 0
                          OR e.available_at <= clock_timestamp()))))
    RETURNING j.id, j.attempt, j.payload, j.trace_context, j.started_at, j.domain
), writers AS (
    UPDATE {ENVELOPE} e SET lease_token = NULL, status = 'dispatched', dispatched_at = s.started_at
    FROM started s
    WHERE e.job_id = s.id AND e.attempt = s.attempt AND e.status = 'pending' AND e.lease_token = '{WRITER_TOKEN}'
)
SELECT payload, trace_context, started_at, domain FROM started
"""

# Why START_SQL started nothing, read after the fact for the refusal's event (never on a start's path).
START_REFUSAL_SQL = f"""
SELECT j.status, j.attempt, j.domain, p.domain IS NOT NULL, e.status, e.lease_token IS NOT NULL,
       e.send_attempts, e.available_at, e.available_at <= clock_timestamp()
FROM {JOB} j
LEFT JOIN {ENVELOPE} e ON e.job_id = j.id AND e.attempt = %s
LEFT JOIN dispatch_app_domainpause p ON p.domain = j.domain
WHERE j.id = %s
"""

# A start this worker made moments ago, found on a retry: the first try's commit may have been lost with its
# answer (the connection died after the COMMIT went out). Bounded in time so it can only be that try's start.
START_MADE_BY_SQL = f"""
SELECT j.payload, j.trace_context, j.started_at
FROM {JOB} j JOIN {ATTEMPT} a ON a.job_id = j.id AND a.attempt = j.attempt
WHERE j.id = %s AND j.attempt = %s AND j.status = 'running' AND a.worker = %s
  AND j.started_at > clock_timestamp() - make_interval(secs => %s)
"""

# running -> queued | submitted, same attempt: a worker that started the job in PostgreSQL ahead of its take from
# Redis (dispatch_app.execution.start_protocol) did not get the job to run. Only that start (its started_at) moves
# back, to where it was: a job whose envelope the dispatcher has not marked dispatched is `submitted` again, and a
# dispatch time the start wrote (START_SQL: the same clock reading as started_at) goes with it. An id pushed to
# Redis with no hash behind it (anyone can) once left such a job `queued`, dispatched at a time no dispatcher sent
# it, and recovery later spent an attempt on it. The attempt's history forgets the start too, so a later start of
# the same attempt is recorded afresh.
WITHDRAW_START_SQL = f"""
WITH back AS (
    UPDATE {JOB} j SET started_at = NULL,
        status = CASE WHEN e.status = 'dispatched' THEN 'queued' ELSE 'submitted' END,
        dispatched_at = CASE WHEN j.dispatched_at = j.started_at THEN e.dispatched_at ELSE j.dispatched_at END
    FROM (SELECT %(id)s::bigint AS job_id, %(attempt)s::int AS attempt) AS w
    LEFT JOIN {ENVELOPE} e ON e.job_id = w.job_id AND e.attempt = w.attempt
    WHERE j.id = w.job_id AND j.attempt = w.attempt AND j.status = 'running' AND j.started_at = %(started_at)s
    RETURNING j.id, j.attempt),
history AS (
    UPDATE {ATTEMPT} a SET started_at = NULL, worker = ''
    FROM back WHERE a.job_id = back.id AND a.attempt = back.attempt)
SELECT id FROM back
"""

# running -> succeeded | failed | outcome_unknown: the worker's outcome for its own attempt.
FINISH_SQL = f"""
UPDATE {JOB}
SET status = %s, finished_at = clock_timestamp(), result = %s, error = %s, updated_at = clock_timestamp()
WHERE id = %s AND attempt = %s AND status = 'running'
"""

# The same finish carrying the outcome of the attempt's last vendor call, which succeeded (store.vendor_calls
# .SETTLED_CTE): one statement and one commit where a settle and a finish took two. The call's outcome is written
# whether or not the finish applies (a job recovered meanwhile): the call took effect either way.
FINISH_SETTLING_SQL = f"""
WITH {vendor_calls.SETTLED_CTE}
UPDATE {JOB}
SET status = %(status)s, finished_at = clock_timestamp(), result = %(result)s, error = %(error)s,
    updated_at = clock_timestamp()
WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
"""

# <status recovery saw> -> outcome_unknown | failed: recovery's verdict on an interrupted attempt.
CONCLUDE_SQL = f"""
UPDATE {JOB} SET status = %s, finished_at = clock_timestamp(), error = %s
WHERE id = %s AND attempt = %s AND status = %s
"""

# <allowed> -> submitted with the next attempt; its envelope follows (redispatch_envelope_sql).
REDISPATCH_SQL = (
    f"UPDATE {JOB} SET attempt = attempt + 1, status = 'submitted', error = '', "
    "vendor_request_id = '', started_at = NULL "
    "WHERE id = %s AND attempt = %s AND status = ANY(%s) RETURNING attempt, domain"
)


@cache
def redispatch_envelope_sql() -> str:
    """The next attempt's envelope (the one builder's columns, store.envelope_builder), due after %(delay)s."""
    columns, values = fresh_insert()
    return (
        f"INSERT INTO {ENVELOPE} (job_id, attempt, domain, queue, available_at{columns}) "
        "VALUES (%(job_id)s, %(attempt)s, %(domain)s, %(queue)s, "
        f"clock_timestamp() + make_interval(secs => %(delay)s){values})"
    )


# A finished job an operator re-dispatched is unfinished again: its old outcome goes.
REOPEN_SQL = f"UPDATE {JOB} SET finished_at = NULL, result = NULL WHERE id = %s"

# submitted | queued | running -> cancelled; returns the attempt and the status it had.
CANCEL_SQL = (
    f"UPDATE {JOB} SET status = 'cancelled', finished_at = clock_timestamp() "
    "WHERE id = %s AND status IN ('submitted', 'queued', 'running') RETURNING attempt, "
    f"(SELECT status FROM {JOB} WHERE id = %s)"
)

# failed | submitted -> submitted, same attempt: its dead envelope is re-armed. Reads ``env(job_id, attempt)``.
REARM_CTE = f"""UPDATE {JOB} j SET status = 'submitted', finished_at = NULL, error = ''
    FROM env WHERE j.id = env.job_id AND j.attempt = env.attempt AND j.status IN ('failed', 'submitted')
    RETURNING j.id"""


def start(cursor, worker: str, job_id: int, attempt: int, domains=None) -> tuple | None:
    """submitted/queued -> running: (payload, trace_context, started_at, domain), or None if not startable.

    ``domains``: the keys the job may be in (the entry point's; a worker always says); None: any.
    jsonb comes back as the driver returns it on a raw cursor (maybe undecoded text).
    """
    cursor.execute(START_SQL, [worker, job_id, attempt, None if domains is None else list(domains)])
    return cursor.fetchone()


# A refused start's JobEvent kind: not startable by its status (the usual duplicate), or stopped by the gate.
DUPLICATE, REFUSED = "duplicate_delivery", "start_refused"


def start_refusal(cursor, job_id: int, attempt: int, domains=None) -> tuple[str, str] | None:
    """(event kind, reason) for a start START_SQL refused; None if there is no such job (nothing to record)."""
    cursor.execute(START_REFUSAL_SQL, [attempt, job_id])
    row = cursor.fetchone()
    if row is None:
        return None
    status, current, domain, paused, envelope, leased, sends, available_at, due = row
    if status not in ("submitted", "queued") or current != attempt:
        return DUPLICATE, "attempt not startable (already started, finished or superseded)"
    if domains is not None and domain not in domains:
        return REFUSED, f"the job is in domain {domain!r}, not {', '.join(map(repr, domains))}: wrong entry point"
    if paused:
        return REFUSED, f"domain {domain!r} is paused"
    if envelope is None:
        return REFUSED, f"attempt {attempt} has no envelope: the dispatcher never sent it"
    if envelope == "dead":
        return REFUSED, f"attempt {attempt}'s envelope is dead: the dispatcher never sent it"
    if envelope == "pending" and not (leased or sends or due):
        return REFUSED, f"not due: attempt {attempt} is scheduled for {available_at.isoformat()} (never sent)"
    # Startable now: it moved between the two statements (a claim, a resume); the next delivery starts it.
    return DUPLICATE, "attempt not startable when its start ran (it changed since)"


def start_made_by(cursor, worker: str, job_id: int, attempt: int, within: float) -> tuple | None:
    """The row ``start`` would have returned, if ``worker`` started this attempt within the last ``within`` s."""
    if not worker:
        return None  # a nameless start cannot be told from another's
    cursor.execute(START_MADE_BY_SQL, [job_id, attempt, worker, within])
    return cursor.fetchone()


def withdraw_start(job_id: int, attempt: int, started_at, reason: str) -> bool:
    """running -> queued for a start whose job was not run (WITHDRAW_START_SQL), with an event saying why.

    False when the job moved on since (finished, cancelled, re-dispatched): nothing is changed then.
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(WITHDRAW_START_SQL, {"id": job_id, "attempt": attempt, "started_at": started_at})
            if cursor.fetchone() is None:
                return False
        events.record(job_id, attempt, "start_withdrawn", reason=reason)
    return True


def finish(cursor, job_id: int, attempt: int, status: str, result: Any = None, error: str = "", settled=None) -> bool:
    """running -> ``status``; False when this attempt is no longer running (recovered, cancelled, finished).

    ``result``: an adapted value (psycopg ``Jsonb``) or None. ``settled``: (call id, result) of the attempt's last
    vendor call, which succeeded and whose outcome this statement writes (FINISH_SETTLING_SQL), or None.
    """
    if status not in FINISHED_BY_WORKER:
        raise IllegalTransition(f"a worker finishes a job as one of {', '.join(FINISHED_BY_WORKER)}, not {status!r}")
    if settled is None:
        cursor.execute(FINISH_SQL, [status, result, error, job_id, attempt])
    else:
        params = {"status": status, "result": result, "error": error, "id": job_id, "attempt": attempt}
        cursor.execute(FINISH_SETTLING_SQL, {**params, **vendor_calls.settled_params(settled)})
    return cursor.rowcount == 1


def conclude(cursor, job_id: int, attempt: int, seen_status: str, status: str, error: str) -> bool:
    """``seen_status`` -> ``status`` (recovery); False when the job moved since recovery looked."""
    if status not in CONCLUDED_BY_RECOVERY:
        allowed = ", ".join(CONCLUDED_BY_RECOVERY)
        raise IllegalTransition(f"recovery concludes a job as one of {allowed}, not {status!r}")
    if seen_status not in UNFINISHED:
        raise IllegalTransition(f"recovery concludes only an unfinished job, not a {seen_status!r} one")
    cursor.execute(CONCLUDE_SQL, [status, error, job_id, attempt, seen_status])
    return cursor.rowcount == 1


def cancel(cursor, job_id: int) -> tuple[int, str] | None:
    """An unfinished job -> cancelled: (attempt, previous status), or None when it had already finished."""
    cursor.execute(CANCEL_SQL, [job_id, job_id])
    return cursor.fetchone()


def reopen(cursor, job_id: int) -> None:
    """Clear the outcome of a finished job an operator just re-dispatched (same transaction)."""
    cursor.execute(REOPEN_SQL, [job_id])


def redispatch(
    job_id: int,
    from_attempt: int,
    *,
    kind: str,
    reason: str,
    delay_seconds: float = 0.0,
    allowed_statuses: tuple[str, ...] = UNFINISHED,
    data: dict | None = None,
    actor: str = "",
) -> int | None:
    """Start the next attempt of a job through the outbox (new envelope, NOTIFY on commit).

    ``data`` is added to the event's (e.g. the recovery round that decided it); ``actor``: the operator's name.

    Compare-and-set on (attempt, status): returns the new attempt, or None when
    the job has moved on since the caller looked. Must run inside a transaction.
    """
    assert connection.in_atomic_block, "redispatch must run inside the caller's transaction"
    if "cancelled" in allowed_statuses or "succeeded" in allowed_statuses:
        raise IllegalTransition(f"a succeeded or cancelled job is never re-dispatched (asked: {allowed_statuses})")
    with connection.cursor() as cursor:
        cursor.execute(REDISPATCH_SQL, [job_id, from_attempt, list(allowed_statuses)])
        row = cursor.fetchone()
        if row is None:
            return None
        attempt, domain_key = row
        queue = lanes.queue_name(get_domain(domain_key).queue, lanes.for_kind(kind))
        envelope = {"job_id": job_id, "attempt": attempt, "domain": domain_key, "queue": queue, "delay": delay_seconds}
        cursor.execute(redispatch_envelope_sql(), {**envelope, **fresh_params()})
    events.record(
        job_id,
        from_attempt,
        kind,
        reason=reason,
        actor=actor,
        data={**(data or {}), "next_attempt": attempt, "delay_seconds": delay_seconds},
    )
    return attempt
