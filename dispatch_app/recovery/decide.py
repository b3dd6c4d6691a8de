"""The recovery decision: a pure function of (state, evidence, policy, now).

No I/O, no clock of its own: ``now`` is the database clock read in the same
transaction as the state, so every threshold compares database times.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

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
    """A job as re-read under its row lock."""

    job_id: int
    status: str
    attempt: int
    updated_at: datetime
    envelope_status: str | None = None  # the current attempt's envelope, None if there is none
    vendor_request_id: str = ""


@dataclass(frozen=True)
class Evidence:
    rq_status: str | None = None  # "missing" after Redis loss; None = not asked
    worker_name: str | None = None
    worker_alive: bool | None = None  # None = no worker named or not asked
    vendor_status: str | None = None  # succeeded | failed | pending | unknown | error; None = not asked
    vendor_error: str = ""

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v not in (None, "")}


@dataclass(frozen=True)
class Decision:
    kind: str
    reason: str


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
    return f"its RQ job is {evidence.rq_status}"


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
        if evidence.rq_status in RQ_WAITING:
            return Decision(LEAVE_ALONE, f"RQ job is {evidence.rq_status}: waiting for a worker")
        if evidence.rq_status == "started" and evidence.worker_alive:
            return Decision(
                LEAVE_ALONE, f"RQ job started on live worker {evidence.worker_name}; its start is not committed yet"
            )
        # The worker's start compare-and-set never committed: nothing ran, whatever the domain.
        return _attempt_or_fail(state, policy, f"{status} but {_rq_story(evidence)} before the job started")

    # running
    if evidence.rq_status == "started" and evidence.worker_alive:
        return Decision(LEAVE_ALONE, f"running on live worker {evidence.worker_name}")
    story = f"interrupted mid-run: {_rq_story(evidence)}"
    if policy.retry_safe:
        return _attempt_or_fail(state, policy, f"{story}; re-running is safe")
    if policy.uses_vendor_request_id:
        request = state.vendor_request_id
        if not request:
            return Decision(OUTCOME_UNKNOWN, f"{story}; no vendor request id recorded, the vendor cannot be asked")
        vendor = evidence.vendor_status
        if vendor == "pending":
            return Decision(LEAVE_ALONE, f"{story}; vendor request {request} still pending, asking again later")
        if vendor == "succeeded":
            return Decision(
                OUTCOME_UNKNOWN, f"{story}; vendor request {request} succeeded but its result was never recorded"
            )
        if vendor in ("failed", "unknown"):
            said = "failed" if vendor == "failed" else "never reached the vendor"
            return _attempt_or_fail(state, policy, f"{story}; vendor request {request} {said}")
        detail = f" ({evidence.vendor_error})" if evidence.vendor_error else ""
        return Decision(LEAVE_ALONE, f"{story}; vendor status of {request} unavailable{detail}, asking again later")
    return Decision(OUTCOME_UNKNOWN, f"{story}; a non-idempotent step may have happened and cannot be checked")
