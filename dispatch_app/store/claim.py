"""The outbox's SQL: claim a batch with a lease, then record what the send did.

Each function is one statement in autocommit: its own transaction, with no
BEGIN or COMMIT round trip (a drain's claim and mark were four round trips, now
two), so no lock outlives a round trip. Inside a caller's transaction (a test, an
operator's script) the statement joins it instead. Every result write is a compare-and-set on the
lease token: a dispatcher whose lease expired cannot overwrite its successor.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from django.db import connection

import dispatch_app.db.prepared as prepared
import dispatch_app.store.transitions as transitions
import dispatch_app.store.writer_lease as writer_lease
import dispatch_app.timeline.stage_sql as stage_sql
import dispatch_app.timeline.tracing as tracing
from dispatch_app.config.settings import dispatch_settings
from dispatch_app.config.tuning import AGAIN_PER_CLAIM
from dispatch_app.store.tables import ATTEMPT, ENVELOPE, JOB, PAUSE


@dataclass(frozen=True)
class Claimed:
    envelope_id: int
    job_id: int
    attempt: int
    domain: str
    queue: str
    send_attempts: int
    first_send: bool  # never claimed before: only a NOTIFY or a tick can have announced it


@dataclass(frozen=True)
class Claim:
    token: uuid.UUID
    envelopes: list[Claimed]
    # Seconds until the next pending envelope that was not yet claimable falls due; None when there is none.
    next_due_in: float | None = None
    # The claim took as many later attempts as it may: more may be due (claim again at once).
    again_full: bool = False


# Claims and marks commit without waiting for the WAL flush: one fsync less
# each, ~1 ms per batch (`dispatchbench idle-latency`, docs/benchmarks.md). Safe
# because both are recoverable: a claim lost in a server crash leaves the
# envelope pending (sent again; the create-if-absent send leaves an existing RQ job
# alone and the worker's start compare-and-set makes that a duplicate), a lost mark
# leaves it leased until the lease runs out and the re-send is then a no-op. Any later synchronous
# commit (a worker's start) flushes them anyway. Set inside the statement: no
# extra round trip.
ASYNC_COMMIT = "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"

# SKIP LOCKED: rows held by another transaction (a peer's claim, an operator's
# long transaction) are passed over instead of waited for. The lease pushes
# available_at forward, so a dispatcher that dies after claiming gives its rows
# back by itself when the lease runs out. The clock is read once, in a
# sub-select, so the bound is an index condition: a bare clock_timestamp() is
# volatile, becomes a per-row filter, and a short batch then reads every
# leased, backed-off or scheduled pending row behind the available ones.
# A paused domain (DomainPause, an operator's switch) keeps its envelopes
# pending: the paused set is read once per claim into a hash (a hashed
# SubPlan) and its rows are passed over by a filter on the same index scan.
# NOT IN, not `<> ALL (ARRAY(...))` or NOT EXISTS: with those the planner
# estimates ~0 matching rows and switches to a bitmap scan plus a Sort
# (tests/integration/store/test_claim_plan.py). Nothing is paused almost always, so the
# filter removes nothing; while a domain is paused, each claim steps over that
# domain's due rows in front of the others.
#
# New work first: a batch takes first attempts and only tops up with later
# attempts (re-dispatches by recovery, a worker's retry, an operator) when fewer
# first attempts are due, and with at most AGAIN_PER_CLAIM of them: a recovery
# round commits its re-dispatches together, and a drain sending all of them keeps
# a job committed meanwhile waiting for the whole send. Each half reads its own partial index in order
# (envelope_claim_first, envelope_claim_again), and the second does not run at
# all when the first filled the batch. A recovery storm re-dispatches in bursts,
# all due at once; in plain (available_at, id) order a job committed just after
# a burst waited for the whole burst to be claimed, sent and marked. Later
# attempts cannot starve: any batch with room takes them, and the recovery loops
# yield to an outbox backlog.
#
# The same statement says when the next pending envelope falls due (a delayed
# submit, a retry backoff, a lease that ran out unmarked): no trigger fires when
# time passes, so the loop wakes itself then instead of at its fallback tick. It
# is one more read of each index, stopping at the first row past the clock
# bound, in the statement's snapshot (so not this claim's own leases). The
# claimed rows are LEFT JOINed to that one row: an empty claim still returns it.
# Later attempts per claim: AGAIN_PER_CLAIM (dispatch_app.config.tuning).
CLAIM_SQL = f"""
WITH first AS (
    SELECT id FROM {ENVELOPE}
    WHERE status = 'pending' AND attempt = 1 AND available_at <= (SELECT clock_timestamp())
      AND domain NOT IN (SELECT domain FROM {PAUSE}) AND {writer_lease.CLAIM_SKIP}
    ORDER BY available_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), again AS (
    -- The inner LIMIT is a constant, so the planner reads the index in order, as for `first`; with only the
    -- computed one it guesses a tenth of the table and may Sort a storm's re-dispatches. Rows are locked as
    -- the outer LIMIT pulls them: none when `first` filled the batch.
    SELECT id FROM (
        SELECT id FROM {ENVELOPE}
        WHERE status = 'pending' AND attempt > 1 AND available_at <= (SELECT clock_timestamp())
          AND domain NOT IN (SELECT domain FROM {PAUSE})
        ORDER BY available_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) due
    LIMIT LEAST(%(limit)s - (SELECT count(*) FROM first), %(again_limit)s)
), claimed AS (
    UPDATE {ENVELOPE} e
    SET available_at = clock_timestamp() + make_interval(secs => %(lease)s),
        lease_token = %(token)s,
        send_attempts = e.send_attempts + 1
    FROM (SELECT id FROM first UNION ALL SELECT id FROM again) picked, {ASYNC_COMMIT}
    WHERE e.id = picked.id
    RETURNING e.id, e.job_id, e.attempt, e.domain, e.queue, e.send_attempts, e.send_attempts = 1
), next_due AS (
    SELECT extract(epoch FROM LEAST(
        (SELECT min(available_at) FROM {ENVELOPE}
         WHERE status = 'pending' AND attempt = 1 AND available_at > (SELECT clock_timestamp())),
        (SELECT min(available_at) FROM {ENVELOPE}
         WHERE status = 'pending' AND attempt > 1 AND available_at > (SELECT clock_timestamp()))
    ) - clock_timestamp())::float8 AS seconds
)
SELECT claimed.*, next_due.seconds FROM next_due LEFT JOIN claimed ON true
"""


def claim_batch(
    limit: int,
    lease_seconds: float,
    *,
    again_limit: int | None = None,
    writer_grace: float | None = None,
    locking: str = "FOR UPDATE SKIP LOCKED",
) -> Claim:
    """Up to ``limit`` due envelopes, first attempts first, then at most ``again_limit`` later attempts.

    ``again_limit`` defaults to AGAIN_PER_CLAIM; a claim that took that many may have left more due
    (``Claim.again_full``), so the loop claims again at once, taking new work first each time.
    ``writer_grace`` (SUBMIT_SEND_GRACE by default): an envelope its writer sends itself is left to it this long.
    """
    token = uuid.uuid4()
    again_limit = AGAIN_PER_CLAIM if again_limit is None else again_limit
    if writer_grace is None:
        writer_grace = dispatch_settings().SUBMIT_SEND_GRACE
    sql = CLAIM_SQL if locking == "FOR UPDATE SKIP LOCKED" else CLAIM_SQL.replace("FOR UPDATE SKIP LOCKED", locking)
    with prepared.cursor(dispatcher_session=True) as cursor:
        cursor.execute(
            sql,
            {
                "limit": limit,
                "lease": lease_seconds,
                "token": token,
                "again_limit": again_limit,
                "writer_grace": writer_grace,
            },
        )
        rows = cursor.fetchall()
    next_due_in = rows[0][-1]  # the last column of every row; an empty claim returns one row of NULLs and it
    # RETURNING order is not guaranteed; the send order follows the claim's: first attempts, then the rest.
    claimed = sorted((row[:-1] for row in rows if row[0] is not None), key=lambda r: (r[2] > 1, r[0]))
    again = sum(1 for row in claimed if row[2] > 1)
    return Claim(token, [Claimed(*row) for row in claimed], next_due_in, again_full=0 < again_limit <= again)


# dispatched_at is when the job entered RQ: its send's start, on the database clock (this statement's clock less
# the host's monotonic age of the send), never after the worker's start, which can commit first. Only a start
# this send can have caused holds it back: one before the claim (a killed dispatcher's send, run and then
# re-claimed when its lease ran out) leaves the re-send dated when it happened, not before the lease ended.
def _dispatched_at(started_since: str) -> str:
    return f"""LEAST(clock_timestamp() - make_interval(secs => s.ago),
                     (SELECT j.started_at FROM {JOB} j
                      WHERE j.id = e.job_id AND j.attempt = e.attempt AND ({started_since})))"""


# The claim set available_at to its clock plus the lease, so the claim's time is available_at less the lease.
_STARTED_SINCE_CLAIM = (
    "%(lease)s::float8 IS NULL OR j.started_at >= e.available_at - make_interval(secs => %(lease)s::float8)"
)


def _mark_sql(marked: str) -> str:
    """A mark: the ``marked`` CTE (envelope id, job_id, attempt, created_at, dispatched_at), its outbox waits
    and the jobs' submitted -> queued, in one statement."""
    return f"""
WITH marked AS ({marked}
), waits AS (
    -- The outbox wait starts when the envelope is due: a delayed submit or a retry backoff is its own stage
    -- (dispatch_app.timeline.stages defines it), kept by the attempt history only for envelopes created with a delay.
    SELECT {stage_sql.seconds_sql("outbox", "s")} AS latency
    FROM (
        SELECT m.created_at, a.due_at, m.dispatched_at, NULL::timestamptz AS started_at,
               NULL::timestamptz AS finished_at
        FROM marked m LEFT JOIN {ATTEMPT} a ON a.job_id = m.job_id AND a.attempt = m.attempt
    ) s
), jobs AS (
    -- submitted -> queued (dispatch_app.store.transitions owns the job's side)
    {transitions.MARK_QUEUED_CTE}
)
SELECT (SELECT array_agg(id) FROM marked), (SELECT array_agg(latency) FROM waits) FROM {ASYNC_COMMIT}
"""


MARK_DISPATCHED_SQL = _mark_sql(f"""
    UPDATE {ENVELOPE} e
    SET status = 'dispatched', lease_token = NULL, last_error = '',
        dispatched_at = {_dispatched_at(_STARTED_SINCE_CLAIM)}
    FROM unnest(%(ids)s::bigint[], %(ago)s::float8[]) AS s(id, ago)
    WHERE e.id = ANY(%(ids)s) AND e.id = s.id AND e.lease_token = %(token)s AND e.status = 'pending'
    RETURNING e.id, e.job_id, e.attempt, e.created_at, e.dispatched_at""")

# Announced envelopes the loop sent ahead of any claim (dispatch.announced) are marked by this one statement
# instead of a claim and a mark: a compare-and-set on "pending, unleased, this attempt, due, domain not paused",
# which is what the claim would have checked. One write transaction and one envelope row version less per job.
# A row a peer's claim holds is waited for (its claim is one autocommit statement) and then fails the lease
# condition: the peer sends it too (a duplicate send, never a second run). The rows are found by their primary
# key (`id = ANY`, sorted ids: taken in id order, so two dispatchers marking the same announcements do not
# deadlock), not by joining the array to the pending rows, which a backlog would make a scan of every pending row.
MARK_AHEAD_SQL = _mark_sql(f"""
    UPDATE {ENVELOPE} e
    SET status = 'dispatched', last_error = '', send_attempts = e.send_attempts + 1,
        dispatched_at = {_dispatched_at("TRUE")}
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(ago)s::float8[]) AS s(id, attempt, ago)
    WHERE e.id = ANY(%(ids)s) AND e.id = s.id AND e.attempt = s.attempt
      AND e.status = 'pending' AND e.lease_token IS NULL AND e.available_at <= clock_timestamp()
      AND e.domain NOT IN (SELECT domain FROM {PAUSE})
    RETURNING e.id, e.job_id, e.attempt, e.created_at, e.dispatched_at""")


def _ages(sent_at: list[float | None] | None, n: int) -> list[float]:
    now = time.monotonic()
    return [0.0 if t is None else max(0.0, now - t) for t in (sent_at or [None] * n)]


def mark_ahead(sent: dict[int, tuple[int, float]], latencies: list[float] | None = None) -> list[int]:
    """Mark envelopes sent ahead of their claim: ``sent`` is envelope id -> (attempt, ``time.monotonic()`` when
    its send started). Returns the ids marked; the others stay for the claim (a peer's lease, a pause)."""
    if not sent:
        return []
    ids = sorted(sent)
    with prepared.cursor(dispatcher_session=True) as cursor:
        params = {"ids": ids, "attempts": [sent[i][0] for i in ids]}
        params["ago"] = _ages([sent[i][1] for i in ids], len(ids))
        cursor.execute(MARK_AHEAD_SQL, params)
        marked, waits = cursor.fetchone()
    marked = marked or []
    if marked:
        tracing.envelopes_dispatched(marked)
    if latencies is not None and waits:
        latencies.extend(waits)
    return marked


def mark_dispatched(
    envelope_ids: list[int],
    token: uuid.UUID,
    latencies: list[float] | None = None,
    sent_at: list[float | None] | None = None,
    lease_seconds: float | None = None,
) -> int:
    """Returns how many envelopes this lease still held and now marked.

    ``sent_at``: per envelope, ``time.monotonic()`` when its send started (None: now), so that dispatched_at
    is when the job entered RQ, not when this mark ran. ``lease_seconds``: the claim's lease, which dates the
    claim, so that a worker's start from before it (an earlier send) does not date this send. ``latencies``,
    when given, receives each marked envelope's outbox wait (due -> dispatched_at, database clock; a backoff or
    delay is not outbox wait).
    """
    if not envelope_ids:
        return 0
    with prepared.cursor(dispatcher_session=True) as cursor:
        params = {"ids": envelope_ids, "token": token, "ago": _ages(sent_at, len(envelope_ids)), "lease": lease_seconds}
        cursor.execute(MARK_DISPATCHED_SQL, params)
        marked, waits = cursor.fetchone()
    tracing.envelopes_dispatched(envelope_ids)  # outbox-wait spans of traced jobs; no-op without a tracer provider
    if latencies is not None and waits:
        latencies.extend(waits)
    return len(marked or ())


MARK_FAILED_SQL = f"""
WITH failed AS (
    UPDATE {ENVELOPE} e
    SET lease_token = NULL,
        last_error = left(%(error)s, 2000),
        -- An unreachable Redis is nobody's fault of the envelope: it never dead-letters it.
        status = CASE WHEN %(permanent)s OR (NOT %(transient)s AND e.send_attempts >= %(max_attempts)s)
                      THEN 'dead' ELSE 'pending' END,
        available_at = clock_timestamp() + make_interval(
            secs => LEAST(%(base)s * power(2, LEAST(GREATEST(e.send_attempts - 1, 0), 30)), %(cap)s))
    WHERE e.id = ANY(%(ids)s) AND e.lease_token = %(token)s AND e.status = 'pending'
    RETURNING e.id, e.job_id, e.attempt, e.status, e.send_attempts
), dead_jobs AS (
    -- submitted -> failed (dispatch_app.store.transitions owns the job's side)
    {transitions.DEAD_LETTER_CTE}
), events AS (
    INSERT INTO dispatch_app_jobevent (job_id, attempt, kind, reason, data, at)
    SELECT f.job_id, f.attempt, CASE WHEN f.status = 'dead' THEN 'envelope_dead' ELSE 'send_failed' END,
           left(%(error)s, 2000), jsonb_build_object('envelope_id', f.id, 'send_attempts', f.send_attempts),
           clock_timestamp()
    FROM failed f
    -- During an outage every retry fails; the first few tell the story.
    WHERE NOT %(transient)s OR f.send_attempts <= 3
    RETURNING 1
)
SELECT f.id, f.status FROM failed f
"""


def mark_failed(
    envelope_ids: list[int],
    token: uuid.UUID,
    error: str,
    *,
    permanent: bool,
    transient: bool = False,
    max_attempts: int,
    backoff_base: float,
    backoff_cap: float,
) -> dict[int, str]:
    """Back off (or dead-letter) envelopes whose send failed; returns id -> new status.

    ``permanent``: dead at once (the envelope can never be sent). ``transient``:
    Redis itself failed (connection, timeout): back off, never dead.
    """
    if not envelope_ids:
        return {}
    params = {
        "ids": envelope_ids,
        "token": token,
        "error": error,
        "permanent": permanent,
        "transient": transient,
        "max_attempts": max_attempts,
        "base": backoff_base,
        "cap": backoff_cap,
    }
    with connection.cursor() as cursor:
        cursor.execute(MARK_FAILED_SQL, params)
        return dict(cursor.fetchall())


# Claimed envelopes given back, their attempt not counted (the claim's send_attempts + 1 taken back):
# unsent at shutdown (claimable at once, last error kept), or refused by a Redis outage (``error``, and a
# ``delay`` as long as the dispatcher's pause, so other dispatchers -- each with its own breaker -- do not
# hammer the same refusing server meanwhile). Nothing is dead-lettered. A compare-and-set on the lease token.
RELEASE_SQL = f"""
UPDATE {ENVELOPE}
SET lease_token = NULL,
    send_attempts = GREATEST(send_attempts - 1, 0),
    available_at = clock_timestamp() + make_interval(secs => %(delay)s),
    last_error = COALESCE(left(%(error)s, 2000), last_error)
WHERE id = ANY(%(ids)s) AND lease_token = %(token)s AND status = 'pending'
"""


def release(envelope_ids: list[int], token: uuid.UUID, *, error: str | None = None, delay: float = 0.0) -> int:
    """Give back envelopes this lease still holds (RELEASE_SQL); returns how many it held.

    Unsent at shutdown: claimable at once. A send refused for a server-wide reason: ``error`` and ``delay``.
    """
    if not envelope_ids:
        return 0
    params = {"ids": envelope_ids, "token": token, "error": error, "delay": delay}
    with connection.cursor() as cursor:  # one statement in autocommit, like the claim's
        cursor.execute(RELEASE_SQL, params)
        return cursor.rowcount
