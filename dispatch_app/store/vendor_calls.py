"""The vendor-call ledger's rows: every vendor call of a job is recorded before it is made and settled after.

The attempt's walk through them (resume, re-make, ask, stop) is ``dispatch_app.execution.ledger``.

Each record is committed on its own (autocommit, outside any transaction), so
it survives the worker dying a moment later. A success's outcome rides with the
attempt's next write (``SETTLED_CTE``): the next call's record
(``RECORD_SETTLING_SQL``) or, for the last call of work that succeeded, the job's
finish (``store.transitions.finish``): one commit per call instead of two, and
none of its own for the last. A worker that dies between a call's answer and that
write leaves the call "pending", as one dying between the answer and a settle of
its own did. Recording is fenced on the attempt: an attempt that recovery has
moved on makes no more calls.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from django.db import connection

from dispatch_app.db.retry import on_fresh_connections
from dispatch_app.domains.providers import ProviderError
from dispatch_app.store.tables import JOB, VENDOR_CALL

log = logging.getLogger("dispatch_app.vendor_calls")

PENDING, SUCCEEDED, FAILED, UNKNOWN = "pending", "succeeded", "failed", "unknown"
UNSETTLED = (PENDING, UNKNOWN)

TABLE = VENDOR_CALL
# Fenced on the attempt: the insert happens only while this attempt is the job's running one.
# Touching the job (vendor_request_id, kept for compatibility) moves updated_at: a job making
# vendor calls is making progress, and recovery's compare-and-set sees the new call.
RECORD_SQL = f"""
WITH j AS (
    UPDATE {JOB} SET vendor_request_id = %(request_id)s
    WHERE id = %(job)s AND attempt = %(attempt)s AND status = 'running'
    RETURNING id
)
INSERT INTO {TABLE} (job_id, attempt, seq, purpose, request_id, status, created_at, error)
SELECT j.id, %(attempt)s, %(seq)s, %(purpose)s, %(request_id)s, 'pending', clock_timestamp(), ''
FROM j
RETURNING id
"""

# The outcome of the attempt's previous call (succeeded), carried by its next write: one commit per call instead
# of a record and a settle. That outcome's finished_at is when it was written.
SETTLED_CTE = f"""settled AS (
    UPDATE {TABLE} SET status = 'succeeded', result = %(settled_result)s, error = '', finished_at = clock_timestamp()
    WHERE id = %(settled_id)s AND status IN ('pending', 'unknown')
)"""
RECORD_SETTLING_SQL = f"WITH {SETTLED_CTE}, " + RECORD_SQL.strip().removeprefix("WITH ")

RECORDED_SQL = f"""
SELECT id FROM {TABLE} WHERE job_id = %(job)s AND seq = %(seq)s AND request_id = %(request_id)s
"""

SETTLE_SQL = f"""
UPDATE {TABLE} SET status = %s, result = %s, error = %s, finished_at = clock_timestamp()
WHERE id = %s AND status IN ('pending', 'unknown')
"""

# A success commits without waiting for its WAL flush (synchronous_commit off for this statement's
# transaction only): one durable commit per call, the record before the side effect. The outcome is in
# PostgreSQL's WAL at once, so a worker killed a moment later does not lose it; the next synchronous
# commit of any session (this attempt's next record or its finish, which follow in the same session)
# flushes it, or the WAL writer within a fraction of a second. Only a PostgreSQL crash in that window
# loses it, and then the call reads "pending": in doubt, as for a worker killed before its settle.
SETTLE_SUCCEEDED_SQL = f"""
UPDATE {TABLE} SET status = %s, result = %s, error = %s, finished_at = clock_timestamp()
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
WHERE id = %s AND status IN ('pending', 'unknown')
"""

# The newest call per position, with its age on the database clock.
LATEST_SQL = f"""
SELECT DISTINCT ON (seq) id, attempt, seq, purpose, request_id, status, result,
       EXTRACT(EPOCH FROM clock_timestamp() - created_at)::float8
FROM {TABLE}
WHERE job_id = %s
ORDER BY seq, id DESC
"""


class AttemptSuperseded(RuntimeError):
    """The attempt is no longer the job's running one (recovered, cancelled): no call is made."""


class VendorCallInDoubt(ProviderError):
    """A call may have taken effect and nobody can say yet: the work stops here, nothing is repeated.

    A ``ProviderError`` only so the worker's failure path (``execution.attempt._provider_failed``)
    receives it; it checks for this class first, because unlike its base it does
    not say "the call took no effect".
    """

    def __init__(self, call: Call, why: str):
        super().__init__(f"vendor call {call.seq} ({call.purpose}, request {call.request_id or '-'}) {why}")
        self.call = call


@dataclass(frozen=True)
class Call:
    id: int
    attempt: int
    seq: int
    purpose: str
    request_id: str
    status: str
    result: Any
    age_seconds: float  # since it was recorded, database clock

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "seq": self.seq,
            "attempt": self.attempt,
            "purpose": self.purpose,
            "request_id": self.request_id,
            "status": self.status,
            "age_seconds": round(self.age_seconds, 1),
        }


def latest_calls(job_id: int) -> dict[int, Call]:
    """seq -> the newest recorded call at that position (any attempt)."""
    with connection.cursor() as cursor:
        cursor.execute(LATEST_SQL, [job_id])
        rows = cursor.fetchall()
    calls = {}
    for id_, attempt, seq, purpose, request_id, status, result, age in rows:
        if isinstance(result, str):  # Django leaves jsonb undecoded on raw cursors
            result = json.loads(result)
        calls[seq] = Call(id_, attempt, seq, purpose, request_id, status, result, age)
    return calls


def unsettled(job_id: int) -> list[Call]:
    return [call for call in latest_calls(job_id).values() if call.status in UNSETTLED]


def record(
    job_id: int, attempt: int, seq: int, purpose: str, request_id: str, settled: tuple[int, Any] | None = None
) -> int:
    """Record a call before it is made; retried on fresh connections if the old one had died (db.retry).

    The call is not made yet, so a lost connection here must not fail the job.
    The request id is new for this call: a row already carrying it is this
    record, committed before its answer was lost, and is not inserted twice
    (nor is ``settled``, written in the same statement).

    ``settled``: (call id, result) of the attempt's previous call, which
    succeeded and whose outcome is written by this statement. It is written
    even when the attempt has moved on (``AttemptSuperseded``): it took effect.
    """
    params = {"job": job_id, "attempt": attempt, "seq": seq, "purpose": purpose[:200], "request_id": request_id}
    sql = RECORD_SQL
    if settled is not None:
        sql = RECORD_SETTLING_SQL
        params.update(settled_params(settled))

    def run(cursor, retry: bool):
        if retry:
            cursor.execute(RECORDED_SQL, params)
            row = cursor.fetchone()
            if row is not None:
                return row
        cursor.execute(sql, params)
        return cursor.fetchone()

    row = on_fresh_connections(
        run,
        log,
        "job %s attempt %s: connection lost while recording vendor call %s; retrying on a fresh connection",
        job_id,
        attempt,
        seq,
        action="vendor_record_retry",
    )
    if row is None:
        raise AttemptSuperseded(f"job {job_id} attempt {attempt} is no longer running; vendor call {seq} not made")
    return row[0]


def settle(call_id: int, status: str, result: Any = None, error: str = "") -> bool:
    """Record a call's outcome; retried on fresh connections if the old one died during the call (db.retry).

    The vendor has answered by now: an outcome lost with a terminated session
    would fail the job (the work's exception) though the call took effect. The
    UPDATE only moves a call still pending or unknown, so a retry after a
    commit whose answer was lost changes nothing.
    """
    from psycopg.types.json import Jsonb

    params = [status, Jsonb(result) if result is not None else None, error[:4000], call_id]

    sql = SETTLE_SUCCEEDED_SQL if status == SUCCEEDED else SETTLE_SQL

    def run(cursor, retry: bool) -> bool:
        cursor.execute(sql, params)
        return cursor.rowcount == 1

    return on_fresh_connections(
        run,
        log,
        "vendor call %s: connection lost before its outcome was saved; retrying on a fresh connection",
        call_id,
        action="vendor_settle_retry",
    )


def abandon_in_doubt(job_id: int, reason: str) -> int:
    """An operator's decision to retry anyway: the job's calls in doubt count as not taken effect.

    Without it, a retry of an ``outcome_unknown`` job stops at the same call in
    doubt again. Returns how many calls were settled; call it in the retry's transaction.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {TABLE} SET status = 'failed', error = %s, finished_at = clock_timestamp() "
            "WHERE job_id = %s AND status IN ('pending', 'unknown')",
            [f"abandoned: {reason}"[:4000], job_id],
        )
        return cursor.rowcount


def settle_in_doubt(cursor, call_id: int, status: str, note: str) -> bool:
    """The vendor's word on a call in doubt (recovery asked), in the caller's transaction; False: settled since."""
    cursor.execute(SETTLE_SQL, [status, None, note, call_id])
    return cursor.rowcount == 1


def settled_params(settled: tuple[int, Any]) -> dict:
    """``SETTLED_CTE``'s parameters for a succeeded call's (id, result)."""
    from psycopg.types.json import Jsonb

    return {"settled_id": settled[0], "settled_result": Jsonb(settled[1]) if settled[1] is not None else None}


def confirmed_result(call: Call) -> dict:
    """What a retry gets for a call the vendor confirmed but whose own result was never recorded."""
    return {"request_id": call.request_id, "confirmed_by_vendor": True}
