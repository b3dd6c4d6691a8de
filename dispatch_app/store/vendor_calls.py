"""The vendor-call ledger: every vendor call of a job is recorded before it is made and settled after.

A ``ProviderError`` says the *failing* call took no effect; the calls before it
in the same attempt did. So a retry must not start the work from the top: it
walks the same calls in the same order (``seq``, the call's position in the
domain's work) and, per call, reads the ledger first:

- ``succeeded``: the call took effect; its recorded result is returned and the
  vendor is not called again;
- ``failed``: it took no effect; it is made again (a new request id);
- ``pending``/``unknown``: in doubt (the worker died mid-call, or the call timed
  out). The domain's policy decides (``RecoveryPolicy.in_doubt``): a retry-safe
  domain makes the call again; a vendor that keeps request records
  (``verifiable``) is asked, and its answer settles the call; otherwise the work
  stops with ``VendorCallInDoubt`` and recovery decides (``recovery.decide``),
  within the domain's ``VENDOR_EVIDENCE_TRUST_SECONDS``.

Each record is committed on its own (autocommit, outside any transaction), so
it survives the worker dying a moment later. A success's outcome rides with the
attempt's next write (the next call's record, ``RECORD_SETTLING_SQL``), or is
written right before the job's finish without waiting for its WAL flush
(``SETTLE_SUCCEEDED_SQL``): one commit per call instead of two. A worker that
dies between a call's answer and that write leaves the call "pending", as one
dying between the answer and a settle of its own did. Recording is fenced on the
attempt: an attempt that recovery has moved on makes no more calls.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connection

from dispatch_app.dbretry import on_fresh_connections
from dispatch_app.domains.base import CONCLUDE, RERUN, RecoveryPolicy
from dispatch_app.providers import ProviderError, ProviderTimeout, call_with_timeout
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

# The same record, carrying the outcome of the attempt's previous call (succeeded) in the same statement:
# one commit per call instead of a record and a settle. That outcome's finished_at is when it was written.
RECORD_SETTLING_SQL = f"""
WITH settled AS (
    UPDATE {TABLE} SET status = 'succeeded', result = %(settled_result)s, error = '', finished_at = clock_timestamp()
    WHERE id = %(settled_id)s AND status IN ('pending', 'unknown')
), """ + RECORD_SQL.strip().removeprefix("WITH ")

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

    A ``ProviderError`` only so the worker's failure path (``worker._provider_failed``)
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
    """Record a call before it is made; retried on fresh connections if the old one had died (dbretry).

    The call is not made yet, so a lost connection here must not fail the job.
    The request id is new for this call: a row already carrying it is this
    record, committed before its answer was lost, and is not inserted twice
    (nor is ``settled``, written in the same statement).

    ``settled``: (call id, result) of the attempt's previous call, which
    succeeded and whose outcome is written by this statement. It is written
    even when the attempt has moved on (``AttemptSuperseded``): it took effect.
    """
    from psycopg.types.json import Jsonb

    params = {"job": job_id, "attempt": attempt, "seq": seq, "purpose": purpose[:200], "request_id": request_id}
    sql = RECORD_SQL
    if settled is not None:
        sql = RECORD_SETTLING_SQL
        params.update(settled_id=settled[0], settled_result=Jsonb(settled[1]) if settled[1] is not None else None)

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
    """Record a call's outcome; retried on fresh connections if the old one died during the call (dbretry).

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


def confirmed_result(call: Call) -> dict:
    """What a retry gets for a call the vendor confirmed but whose own result was never recorded."""
    return {"request_id": call.request_id, "confirmed_by_vendor": True}


class Ledger:
    """One attempt's walk through its calls (``WorkContext.call_vendor``)."""

    # Without a domain's policy, a call's own ``verifiable`` decides: asked if it is, outcome_unknown if not.
    ASK_WHEN_VERIFIABLE = RecoveryPolicy(uses_vendor_request_id=True)

    def __init__(self, job_id: int, attempt: int, provider, policy: RecoveryPolicy | None = None):
        self.job_id = job_id
        self.attempt = attempt
        self.provider = provider
        self.policy = policy if policy is not None else self.ASK_WHEN_VERIFIABLE
        self.next_seq = 0
        # A first attempt has nothing to resume (no attempt before it recorded anything): no query.
        self._prior: dict[int, Call] | None = {} if attempt == 1 else None
        # (call id, result) of a call that succeeded and whose outcome rides with the attempt's next
        # write: the next call's record, or ``write_outcome`` (the worker's, before the finish).
        self._unwritten: tuple[int, Any] | None = None

    def _earlier(self, seq: int) -> Call | None:
        if self._prior is None:
            self._prior = latest_calls(self.job_id)  # one query, before the attempt's first call
        return self._prior.get(seq)

    def _timeout(self) -> float:
        timeout = float(getattr(self.provider, "timeout", 30.0))
        # The provider raises ProviderTimeout itself at `timeout`; this guard only catches one that does not.
        return timeout + max(1.0, timeout * 0.1)

    def write_outcome(self, *, quiet: bool = False) -> None:
        """Write the outcome still riding (a succeeded call's), on its own: the work ended or broke.

        ``quiet``: on the way out of an exception, a database error is logged, not raised over it;
        the call then reads "pending" (in doubt), as if the worker had died right after it.
        """
        if self._unwritten is None:
            return
        call_id, result = self._unwritten
        self._unwritten = None
        try:
            settle(call_id, SUCCEEDED, result=result)
        except DatabaseError as exc:
            if not quiet:
                raise
            log.warning(
                "job %s: the outcome of vendor call %s (succeeded) could not be saved: %s",
                self.job_id,
                call_id,
                exc,
                extra={"action": "vendor_outcome_unsaved", "domain": "worker"},
            )

    def call(self, purpose: str, fn: Callable[[str], Any], *, verifiable: bool) -> Any:
        try:
            return self._call(purpose, fn, verifiable)
        except BaseException:
            self.write_outcome(quiet=True)
            raise

    def _call(self, purpose: str, fn: Callable[[str], Any], verifiable: bool) -> Any:
        seq = self.next_seq
        self.next_seq += 1
        earlier = self._earlier(seq)
        if earlier is not None:
            if earlier.purpose != purpose[:200]:
                raise RuntimeError(
                    f"job {self.job_id}: vendor call {seq} was {earlier.purpose!r} in attempt {earlier.attempt}, "
                    f"now {purpose!r}; the work must make its calls in the same order every attempt"
                )
            if earlier.status == SUCCEEDED:
                # Settled by recovery on the vendor's word: the vendor's answer is all there is.
                return earlier.result if earlier.result is not None else confirmed_result(earlier)
            if earlier.status in UNSETTLED:
                resumed = self._settle_earlier(earlier, verifiable)
                if resumed is not None:
                    return resumed
        request_id = self.provider.new_request_id()
        riding, self._unwritten = self._unwritten, None
        try:
            call_id = record(self.job_id, self.attempt, seq, purpose, request_id, settled=riding)
        except AttemptSuperseded:
            raise  # the statement ran: the outcome it carried is written
        except BaseException:
            self._unwritten = riding  # not written: call() writes it on the way out
            raise
        try:
            result = call_with_timeout(lambda: fn(request_id), self._timeout(), f"{purpose} ({request_id})")
        except VendorCallInDoubt:
            raise
        except ProviderError as exc:
            settle(call_id, FAILED, error=f"{type(exc).__name__}: {exc}")
            raise
        except ProviderTimeout as exc:
            settle(call_id, UNKNOWN, error=f"{type(exc).__name__}: {exc}")
            call = Call(call_id, self.attempt, seq, purpose, request_id, UNKNOWN, None, 0.0)
            raise VendorCallInDoubt(call, f"gave no answer: {exc}") from exc
        except BaseException as exc:
            # Whatever broke, the vendor may have acted: in doubt, never "failed".
            settle(call_id, UNKNOWN, error=f"{type(exc).__name__}: {exc}")
            raise
        self._unwritten = (call_id, result)
        return result

    def _settle_earlier(self, earlier: Call, verifiable: bool) -> Any | None:
        """An earlier call in doubt, as the policy says: its result if it took effect, None to call again."""
        action = self.policy.in_doubt(askable=verifiable and bool(earlier.request_id))
        if action == RERUN:
            # Kept in doubt (it may have taken effect), but closed: the newest call at this position is the new one.
            settle(earlier.id, UNKNOWN, error="in doubt when its attempt ended; made again (retry-safe)")
            log.info(
                "job %s: vendor call %s (%s) was in doubt when its attempt ended; making it again (retry-safe)",
                self.job_id,
                earlier.seq,
                earlier.request_id or "-",
                extra={"action": "vendor_call_rerun", "domain": "worker"},
            )
            return None
        if action == CONCLUDE:
            raise VendorCallInDoubt(earlier, "was in flight when its attempt ended; this vendor cannot be asked")
        try:
            answer = call_with_timeout(
                lambda: self.provider.request_status(earlier.request_id),
                self._timeout(),
                f"status of {earlier.request_id}",
            )
        except Exception as exc:  # the vendor being unreachable leaves the call in doubt
            raise VendorCallInDoubt(earlier, f"in doubt, vendor status unavailable ({type(exc).__name__}: {exc})")
        if answer == SUCCEEDED:
            result = confirmed_result(earlier)
            settle(earlier.id, SUCCEEDED, result=result, error="confirmed by the vendor on resume")
            return result
        if answer in (FAILED, "unknown"):
            said = "failed" if answer == FAILED else "never reached the vendor"
            settle(earlier.id, FAILED, error=f"vendor says it {said} (asked on resume)")
            log.info(
                "job %s: vendor call %s (%s) %s; making it again",
                self.job_id,
                earlier.seq,
                earlier.request_id,
                said,
                extra={"action": "vendor_call_resume", "domain": "worker"},
            )
            return None
        raise VendorCallInDoubt(earlier, f"in doubt, vendor says {answer!r}")
