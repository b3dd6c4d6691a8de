"""The recovery decision: a pure function of (state, evidence, policy, now).

No I/O, no clock of its own: ``now`` is the database clock read with the
state, so every threshold compares database times.

For a job interrupted mid-run in a domain that is not retry-safe, the vendor
calls in doubt decide (the vendor-call ledger, ``dispatch_app.store.vendor_calls``):
each is settled by what the vendor says about it; when none is left in doubt,
the job resumes as its next attempt, from the first call that did not take
effect. A vendor's "pending" (or no answer) is believed only for the domain's
``vendor_evidence_trust_seconds`` after the call was recorded; past it the job
is ``outcome_unknown``, never waited on forever.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from dispatch_app.config.tuning import RQ_LIST_READ_MAX
from dispatch_app.domains.base import CONCLUDE, RERUN

REDISPATCH = "redispatch"
LEAVE_ALONE = "leave_alone"
OUTCOME_UNKNOWN = "outcome_unknown"
FAIL = "fail"
KINDS = (REDISPATCH, LEAVE_ALONE, OUTCOME_UNKNOWN, FAIL)

TERMINAL = ("succeeded", "failed", "outcome_unknown", "cancelled")
# RQ states in which the job is still waiting for a worker.
RQ_WAITING = ("queued", "deferred", "scheduled", "created")


@dataclass(frozen=True)
class JobState:
    """A job as re-read (without a lock; the action later checks it is unchanged)."""

    job_id: int
    status: str
    attempt: int
    updated_at: datetime
    envelope_status: str | None = None  # the current attempt's envelope, None if there is none
    vendor_request_id: str = ""  # the last one recorded (kept for jobs from before the ledger)
    started_at: datetime | None = None
    # The ledger's calls in doubt (newest per position, pending/unknown), as vendor_calls.Call.
    in_doubt: tuple[Any, ...] = ()
    calls_recorded: int = 0  # ledger rows of this job, any attempt
    ledger_mark: str = ""  # changes with every ledger write: part of the compare-and-set


@dataclass(frozen=True)
class Evidence:
    rq_status: str | None = None  # "missing" after Redis loss; None = not asked
    worker_name: str | None = None
    worker_alive: bool | None = None  # None = no worker named or not asked
    # A started RQ job on a live worker: seconds from its RQ start to that worker's last heartbeat, both written
    # by the worker on its own clock (no skew against the database's). None = not known.
    started_for: float | None = None
    # An RQ job that says "queued": whether its id is in its queue or its queue's intermediate list (taken by a
    # worker). False: popped by a worker that died or lost the connection before it took the job. None = not asked.
    rq_listed: bool | None = None
    # Not looked for: the id is not in the first RQ_LIST_READ_MAX ids of a list this long (recovery.evidence).
    rq_unread_depth: int | None = None
    # A running job whose RQ job waits and no worker ever wrote its start: nothing ran it (evidence.gather).
    # None = not so, or not asked.
    rq_never_started: bool | None = None
    # About the job's vendor_request_id (jobs from before the ledger):
    vendor_status: str | None = None  # succeeded | failed | pending | unknown | error; None = not asked
    vendor_error: str = ""
    # About the ledger's calls in doubt: ((call id, status, error), ...); a call not listed was not asked.
    vendor_answers: tuple[tuple[int, str, str], ...] = ()

    def answer(self, call_id: int) -> tuple[str, str]:
        for id_, status, error in self.vendor_answers:
            if id_ == call_id:
                return status, error
        return "error", "not asked"

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v not in (None, "", ())}


@dataclass(frozen=True)
class Decision:
    kind: str
    reason: str
    # Ledger calls the vendor's answers settle, written with the action: ((call id, status, note), ...).
    settle: tuple[tuple[int, str, str], ...] = ()


def _attempt_or_fail(state: JobState, policy, why: str) -> Decision:
    if state.attempt >= policy.max_attempts:
        return Decision(FAIL, f"{why}; attempts used up ({state.attempt} of {policy.max_attempts})")
    return Decision(REDISPATCH, f"{why}; re-dispatching as attempt {state.attempt + 1} of {policy.max_attempts}")


def _rq_story(evidence: Evidence) -> str:
    if evidence.rq_status in (None, "missing"):
        return "its RQ job is missing (lost from Redis)"
    if evidence.rq_status == "started":
        worker = evidence.worker_name or "an unnamed worker"
        return f"its RQ job started on {worker}, which is gone"
    if evidence.rq_listed is False:
        return (
            f"its RQ job is {evidence.rq_status} but in neither its queue nor a worker's hands "
            "(popped by a worker that died or lost its connection before taking it)"
        )
    return f"its RQ job is {evidence.rq_status}"


def _waiting(evidence: Evidence) -> str:
    unread = evidence.rq_unread_depth
    further = "" if unread is None else f" (of its queue's {unread:,} ids, the first {RQ_LIST_READ_MAX:,} looked at)"
    return f"RQ job is {evidence.rq_status}: waiting for a worker{further}"


def decide(state: JobState, evidence: Evidence, policy, now: datetime) -> Decision:
    status = state.status
    if status == "cancelled":
        return Decision(LEAVE_ALONE, "cancelled by a user; not touched")
    if status in TERMINAL:
        return Decision(LEAVE_ALONE, f"already {status}; nothing to recover")

    age = (now - state.updated_at).total_seconds()
    threshold = policy.stale_seconds(status)
    # Strict, like the discovery SQL (updated_at < now - threshold): at the threshold it is not stale yet.
    if age <= threshold:
        return Decision(LEAVE_ALONE, f"not stale: {status} for {age:.1f}s, threshold {threshold:g}s")

    if status == "submitted" and state.envelope_status == "pending":
        return Decision(
            LEAVE_ALONE, f"envelope of attempt {state.attempt} is pending in the outbox: the dispatcher sends it"
        )
    if state.envelope_status == "dead":
        return Decision(FAIL, f"the dispatcher gave up on attempt {state.attempt} (envelope dead)")

    if status in ("submitted", "queued"):
        if evidence.rq_status in RQ_WAITING and evidence.rq_listed is not False:
            return Decision(LEAVE_ALONE, _waiting(evidence))
        if evidence.rq_status == "started" and evidence.worker_alive:
            lost = evidence.started_for is not None and evidence.started_for > threshold
            if not lost:
                return Decision(
                    LEAVE_ALONE, f"RQ job started on live worker {evidence.worker_name}; its start is not committed yet"
                )
            # The worker runs the start compare-and-set right after it starts the job in Redis; alive this long
            # since, without it, it lost the job (a reply lost to a dropped connection). Re-dispatching is safe:
            # the old attempt's start, should it still come, finds the attempt superseded.
            return _attempt_or_fail(
                state,
                policy,
                f"{status} but its RQ job started on live worker {evidence.worker_name} "
                f"{evidence.started_for:.0f}s before that worker's last heartbeat and the start never committed",
            )
        # The worker's start compare-and-set never committed: nothing ran, whatever the domain.
        return _attempt_or_fail(state, policy, f"{status} but {_rq_story(evidence)} before the job started")

    # running
    if evidence.rq_status == "started" and evidence.worker_alive:
        return Decision(LEAVE_ALONE, f"running on live worker {evidence.worker_name}")
    if evidence.rq_never_started and not state.in_doubt:
        # A worker makes the start in PostgreSQL while Redis hands it the job (execution.start_protocol) and runs the
        # job only once Redis has its start too: it stopped in between. Calls in doubt (an earlier attempt's,
        # then) are the ledger's to settle first, below.
        return _attempt_or_fail(
            state,
            policy,
            f"running, but {_rq_story(evidence)} and no worker ever started it: the worker that made the start "
            "stopped before it took the job, so nothing ran",
        )
    story = f"interrupted mid-run: {_rq_story(evidence)}"
    # What happens to calls in doubt is the policy's (RecoveryPolicy.in_doubt, which the worker and the ledger ask
    # too): a retry-safe domain re-runs whatever is in doubt, so its next attempt makes those calls again.
    if policy.in_doubt(askable=True) == RERUN:
        return _attempt_or_fail(state, policy, f"{story}; re-running is safe")
    if policy.records_vendor_calls and (state.calls_recorded or not state.vendor_request_id):
        return _over_the_ledger(state, evidence, policy, now, story)
    if policy.uses_vendor_request_id:
        return _legacy_request(state, evidence, policy, now, story)
    return Decision(OUTCOME_UNKNOWN, f"{story}; a non-idempotent step may have happened and cannot be checked")


def _untrusted(policy, age: float, what: str, said: str, story: str) -> Decision:
    """A vendor that says "pending" (or nothing) is believed for a bounded time only."""
    trust = policy.vendor_evidence_trust_seconds
    if age > trust:
        return Decision(
            OUTCOME_UNKNOWN,
            f"{story}; {what} {said} {age:.0f}s after it was recorded, past the {trust:g}s trust bound "
            "(VENDOR_EVIDENCE_TRUST_SECONDS): it may have taken effect",
        )
    return Decision(
        LEAVE_ALONE,
        f"{story}; {what} {said} {age:.0f}s after it was recorded (trusted up to {trust:g}s), asking again later",
    )


def _said(status: str, error: str) -> str:
    if status == "pending":
        return "still pending"
    return f"status unavailable ({error})" if error else "status unavailable"


def _over_the_ledger(state: JobState, evidence: Evidence, policy, now: datetime, story: str) -> Decision:
    settle = []
    confirmed = redo = 0
    for call in sorted(state.in_doubt, key=lambda c: c.seq):
        what = f"vendor call {call.seq} ({call.purpose}, request {call.request_id or '-'})"
        if policy.in_doubt(askable=bool(call.request_id)) == CONCLUDE:
            return Decision(OUTCOME_UNKNOWN, f"{story}; {what} was in flight and this vendor cannot be asked")
        status, error = evidence.answer(call.id)
        if status == "succeeded":
            settle.append((call.id, "succeeded", "the vendor says it succeeded (asked by recovery)"))
            confirmed += 1
        elif status in ("failed", "unknown"):
            said = "failed" if status == "failed" else "never reached the vendor"
            settle.append((call.id, "failed", f"the vendor says it {said} (asked by recovery)"))
            redo += 1
        else:
            return _untrusted(policy, call.age_seconds, what, _said(status, error), story)
    if state.in_doubt:
        found = (
            f"the vendor settled the {len(state.in_doubt)} call(s) in doubt ({confirmed} took effect, {redo} did not)"
        )
    else:
        found = f"no vendor call in doubt ({state.calls_recorded} recorded)"
    decision = _attempt_or_fail(state, policy, f"{story}; {found}; resuming after the calls that took effect")
    return replace(decision, settle=tuple(settle))


def _legacy_request(state: JobState, evidence: Evidence, policy, now: datetime, story: str) -> Decision:
    """A job whose only record is Job.vendor_request_id (started before the ledger, or a domain without it)."""
    request = state.vendor_request_id
    if not request:
        return Decision(OUTCOME_UNKNOWN, f"{story}; no vendor request id recorded, the vendor cannot be asked")
    vendor = evidence.vendor_status
    if vendor == "succeeded":
        return Decision(
            OUTCOME_UNKNOWN, f"{story}; vendor request {request} succeeded but its result was never recorded"
        )
    if vendor in ("failed", "unknown"):
        said = "failed" if vendor == "failed" else "never reached the vendor"
        return _attempt_or_fail(state, policy, f"{story}; vendor request {request} {said}")
    # The request was recorded after the start: the start bounds its age from above.
    age = (now - (state.started_at or state.updated_at)).total_seconds()
    return _untrusted(policy, age, f"vendor request {request}", _said(vendor or "error", evidence.vendor_error), story)
