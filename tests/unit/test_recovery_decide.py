"""The pure decision: every branch and boundary, no database, no Redis."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from dispatch_app.domains.policy import resolve
from dispatch_app.recovery.decide import FAIL, LEAVE_ALONE, OUTCOME_UNKNOWN, REDISPATCH, Evidence, JobState, decide
from dispatch_app.store.vendor_calls import Call

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
OVERRIDES = {
    domain: {"QUEUED_STALE_SECONDS": 60, "RUNNING_STALE_SECONDS": 600, "MAX_ATTEMPTS": 3}
    for domain in ("delivery", "image_series", "agent")
}
DELIVERY = resolve("delivery", OVERRIDES)  # retry-safe
IMAGES = resolve("image_series", OVERRIDES)  # not retry-safe, vendor request id
AGENT = resolve("agent", OVERRIDES)  # not retry-safe, no vendor evidence

MISSING = Evidence(rq_status="missing")
DEAD_WORKER = Evidence(rq_status="started", worker_name="w1", worker_alive=False)
LIVE_WORKER = Evidence(rq_status="started", worker_name="w1", worker_alive=True)


def state(status="queued", age=3600.0, attempt=1, envelope="dispatched", vendor="", started=60.0, calls=(), recorded=0):
    return JobState(
        1,
        status,
        attempt,
        NOW - timedelta(seconds=age),
        envelope,
        vendor,
        started_at=NOW - timedelta(seconds=started),
        in_doubt=tuple(calls),
        calls_recorded=recorded or len(calls),
    )


def call(id_=7, seq=0, age=60.0, request="r-7", purpose="image 1 of 3"):
    return Call(id_, 1, seq, purpose, request, "pending", None, age)


@pytest.mark.parametrize("status", ["succeeded", "failed", "outcome_unknown", "cancelled"])
def test_terminal_jobs_are_left_alone_whatever_the_evidence(status):
    decision = decide(state(status), MISSING, DELIVERY, NOW)
    assert decision.kind == LEAVE_ALONE
    assert ("cancelled by a user" if status == "cancelled" else f"already {status}") in decision.reason


@pytest.mark.parametrize(
    ("status", "threshold"), [("submitted", 60), ("queued", 60), ("running", 600)], ids=["submitted", "queued", "run"]
)
def test_threshold_boundary_is_strict_like_the_sql(status, threshold):
    inside = decide(state(status, age=threshold), MISSING, DELIVERY, NOW)
    assert inside.kind == LEAVE_ALONE
    assert inside.reason.startswith("not stale")
    outside = decide(state(status, age=threshold + 0.001), MISSING, DELIVERY, NOW)
    assert outside.kind == REDISPATCH


def test_threshold_is_per_status():
    # 120s: stale for queued (60s), not for running (600s).
    assert decide(state("queued", age=120), MISSING, AGENT, NOW).kind == REDISPATCH
    assert decide(state("running", age=120), MISSING, AGENT, NOW).kind == LEAVE_ALONE


def test_submitted_with_pending_envelope_is_the_dispatchers_business():
    decision = decide(state("submitted", envelope="pending"), MISSING, DELIVERY, NOW)
    assert decision.kind == LEAVE_ALONE
    assert "pending in the outbox" in decision.reason


def test_submitted_without_envelope_is_redispatched():
    decision = decide(state("submitted", envelope=None), MISSING, AGENT, NOW)
    assert decision.kind == REDISPATCH


def test_dead_envelope_fails_the_job():
    decision = decide(state("submitted", envelope="dead"), MISSING, DELIVERY, NOW)
    assert decision.kind == FAIL
    assert "envelope dead" in decision.reason


@pytest.mark.parametrize("rq_status", ["queued", "deferred", "scheduled"])
def test_queued_with_rq_job_waiting_is_left_alone(rq_status):
    assert decide(state("queued"), Evidence(rq_status=rq_status), AGENT, NOW).kind == LEAVE_ALONE


def test_queued_started_on_live_worker_is_left_alone():
    decision = decide(state("queued"), LIVE_WORKER, AGENT, NOW)
    assert decision.kind == LEAVE_ALONE
    assert "live worker w1" in decision.reason


@pytest.mark.parametrize("listed", [True, None])
def test_queued_with_rq_job_queued_and_listed_or_not_asked_is_left_alone(listed):
    assert decide(state("queued"), Evidence(rq_status="queued", rq_listed=listed), AGENT, NOW).kind == LEAVE_ALONE


@pytest.mark.parametrize("policy", [DELIVERY, AGENT], ids=["retry-safe", "not-retry-safe"])
def test_queued_with_rq_job_queued_in_no_list_was_popped_and_lost_and_is_redispatched(policy):
    decision = decide(state("queued", attempt=2), Evidence(rq_status="queued", rq_listed=False), policy, NOW)
    assert decision.kind == REDISPATCH
    assert "in neither its queue nor a worker's hands" in decision.reason
    assert "attempt 3 of 3" in decision.reason


@pytest.mark.parametrize("started_for", [None, 0.0, 59.9, 60.0])
def test_queued_started_on_live_worker_within_the_stale_threshold_by_its_clock_is_left_alone(started_for):
    evidence = Evidence(rq_status="started", worker_name="w1", worker_alive=True, started_for=started_for)
    assert decide(state("queued"), evidence, AGENT, NOW).kind == LEAVE_ALONE


@pytest.mark.parametrize("policy", [DELIVERY, AGENT], ids=["retry-safe", "not-retry-safe"])
def test_queued_started_on_live_worker_longer_than_the_threshold_is_a_lost_start_and_redispatched(policy):
    # The worker heartbeats on, 61 s (its clock) after it started the job in Redis, and the start never committed.
    evidence = Evidence(rq_status="started", worker_name="w1", worker_alive=True, started_for=61.0)
    decision = decide(state("queued", attempt=2), evidence, policy, NOW)
    assert decision.kind == REDISPATCH
    assert "started on live worker w1 61s before that worker's last heartbeat" in decision.reason
    assert "attempt 3 of 3" in decision.reason
    assert decide(state("queued", attempt=3), evidence, policy, NOW).kind == FAIL


def test_running_on_live_worker_is_left_alone_however_long_ago_it_started():
    evidence = Evidence(rq_status="started", worker_name="w1", worker_alive=True, started_for=10_000.0)
    assert decide(state("running"), evidence, AGENT, NOW).kind == LEAVE_ALONE


@pytest.mark.parametrize(
    "evidence",
    [MISSING, DEAD_WORKER, Evidence(rq_status="failed"), Evidence(rq_status="finished")],
    ids=["missing", "dead-worker", "rq-failed", "rq-finished"],
)
@pytest.mark.parametrize("policy", [DELIVERY, AGENT], ids=["retry-safe", "not-retry-safe"])
def test_queued_never_started_is_redispatched_even_when_not_retry_safe(evidence, policy):
    decision = decide(state("queued", attempt=2), evidence, policy, NOW)
    assert decision.kind == REDISPATCH
    assert "before the job started" in decision.reason
    assert "attempt 3 of 3" in decision.reason


def test_queued_lost_at_max_attempts_fails():
    decision = decide(state("queued", attempt=3), MISSING, DELIVERY, NOW)
    assert decision.kind == FAIL
    assert "attempts used up (3 of 3)" in decision.reason


def test_running_on_live_worker_is_left_alone_even_when_not_retry_safe():
    decision = decide(state("running"), LIVE_WORKER, AGENT, NOW)
    assert decision.kind == LEAVE_ALONE
    assert "running on live worker w1" in decision.reason


@pytest.mark.parametrize("evidence", [MISSING, DEAD_WORKER, Evidence(rq_status="failed")], ids=str)
def test_running_interrupted_retry_safe_is_redispatched(evidence):
    decision = decide(state("running", attempt=1), evidence, DELIVERY, NOW)
    assert decision.kind == REDISPATCH
    assert "re-running is safe" in decision.reason


def test_running_interrupted_retry_safe_at_max_attempts_fails():
    assert decide(state("running", attempt=3), DEAD_WORKER, DELIVERY, NOW).kind == FAIL
    assert decide(state("running", attempt=2), DEAD_WORKER, DELIVERY, NOW).kind == REDISPATCH


@pytest.mark.parametrize("evidence", [MISSING, DEAD_WORKER], ids=["redis-lost", "worker-dead"])
def test_running_interrupted_with_an_unaskable_call_in_doubt_is_outcome_unknown(evidence):
    decision = decide(state("running", calls=[call(purpose="agent-step-1")]), evidence, AGENT, NOW)
    assert decision.kind == OUTCOME_UNKNOWN
    assert "agent-step-1" in decision.reason and "cannot be asked" in decision.reason


def test_a_domain_without_the_ledger_and_no_vendor_evidence_is_outcome_unknown():
    policy = replace(AGENT, records_vendor_calls=False)
    decision = decide(state("running"), DEAD_WORKER, policy, NOW)
    assert decision.kind == OUTCOME_UNKNOWN
    assert "cannot be checked" in decision.reason


@pytest.mark.parametrize(
    "policy", [replace(AGENT, records_vendor_calls=False), AGENT, IMAGES], ids=["no-ledger", "agent", "image_series"]
)
def test_running_whose_rq_job_never_started_is_redispatched_whatever_the_domain(policy):
    """The worker made the start in PostgreSQL while Redis handed it the job, then died before the job was its."""
    never = Evidence(rq_status="queued", rq_listed=True, rq_never_started=True)
    decision = decide(state("running"), never, policy, NOW)
    assert decision.kind == REDISPATCH
    assert "no worker ever started it" in decision.reason and "nothing ran" in decision.reason
    assert decide(state("running", attempt=3), never, policy, NOW).kind == FAIL
    # Without that evidence the same job is an interrupted run.
    interrupted = decide(state("running"), replace(never, rq_never_started=None), policy, NOW)
    assert "interrupted mid-run" in interrupted.reason


def test_a_never_started_job_with_an_earlier_call_in_doubt_goes_to_the_ledger_first():
    never = Evidence(rq_status="queued", rq_listed=True, rq_never_started=True)
    decision = decide(state("running", calls=[call(purpose="agent-step-1")]), never, AGENT, NOW)
    assert decision.kind == OUTCOME_UNKNOWN and "agent-step-1" in decision.reason


@pytest.mark.parametrize("policy", [AGENT, IMAGES], ids=["agent", "image_series"])
def test_no_call_in_doubt_resumes_as_the_next_attempt(policy):
    # Died between two calls (3 recorded, all settled), or before its first: nothing can repeat.
    for recorded in (0, 3):
        decision = decide(state("running", recorded=recorded), DEAD_WORKER, policy, NOW)
        assert decision.kind == REDISPATCH, decision
        assert f"no vendor call in doubt ({recorded} recorded)" in decision.reason
        assert decision.settle == ()


@pytest.mark.parametrize(
    ("answer", "kind", "settled", "text"),
    [
        ("succeeded", REDISPATCH, "succeeded", "1 took effect, 0 did not"),
        ("failed", REDISPATCH, "failed", "0 took effect, 1 did not"),
        ("unknown", REDISPATCH, "failed", "0 took effect, 1 did not"),
        ("pending", LEAVE_ALONE, None, "still pending 60s after it was recorded (trusted up to 600s)"),
        ("error", LEAVE_ALONE, None, "status unavailable (ConnectionError: down)"),
    ],
)
def test_a_call_in_doubt_is_settled_by_the_vendor(answer, kind, settled, text):
    evidence = Evidence(rq_status="missing", vendor_answers=((7, answer, "ConnectionError: down"),))
    decision = decide(state("running", calls=[call()]), evidence, IMAGES, NOW)
    assert decision.kind == kind
    assert text in decision.reason
    assert decision.settle == (((7, settled, decision.settle[0][2]),) if settled else ())


@pytest.mark.parametrize("answer", ["pending", "error"])
def test_pending_or_no_answer_is_trusted_only_up_to_the_bound(answer):
    evidence = Evidence(rq_status="missing", vendor_answers=((7, answer, "ProviderTimeout: no answer"),))
    policy = replace(IMAGES, vendor_evidence_trust_seconds=120)
    within = decide(state("running", calls=[call(age=120)]), evidence, policy, NOW)
    past = decide(state("running", calls=[call(age=120.5)]), evidence, policy, NOW)
    assert within.kind == LEAVE_ALONE and "trusted up to 120s" in within.reason
    assert past.kind == OUTCOME_UNKNOWN
    assert "past the 120s trust bound (VENDOR_EVIDENCE_TRUST_SECONDS)" in past.reason


def test_every_call_in_doubt_must_be_settled_before_resuming():
    calls = [call(7, seq=0), call(8, seq=1, request="r-8")]
    first_only = Evidence(rq_status="missing", vendor_answers=((7, "succeeded", ""),))
    both = Evidence(rq_status="missing", vendor_answers=((7, "succeeded", ""), (8, "failed", "")))
    assert decide(state("running", calls=calls), first_only, IMAGES, NOW).kind == LEAVE_ALONE  # 8 not asked
    decision = decide(state("running", calls=calls), both, IMAGES, NOW)
    assert decision.kind == REDISPATCH
    assert [(i, s) for i, s, _ in decision.settle] == [(7, "succeeded"), (8, "failed")]


def test_a_settled_call_at_max_attempts_fails_the_job():
    evidence = Evidence(rq_status="missing", vendor_answers=((7, "failed", ""),))
    decision = decide(state("running", attempt=3, calls=[call()]), evidence, IMAGES, NOW)
    assert decision.kind == FAIL and "attempts used up" in decision.reason


def test_started_with_no_worker_named_counts_as_gone():
    decision = decide(state("running"), Evidence(rq_status="started"), DELIVERY, NOW)
    assert decision.kind == REDISPATCH


def test_vendor_domain_without_ledger_or_request_id_is_outcome_unknown():
    decision = decide(state("running", vendor=""), DEAD_WORKER, replace(IMAGES, records_vendor_calls=False), NOW)
    assert decision.kind == OUTCOME_UNKNOWN
    assert "no vendor request id" in decision.reason


def test_legacy_request_pending_past_the_bound_since_the_start_is_outcome_unknown():
    evidence = Evidence(rq_status="missing", vendor_status="pending")
    decision = decide(state("running", vendor="r-1", started=601), evidence, IMAGES, NOW)
    assert decision.kind == OUTCOME_UNKNOWN and "past the 600s trust bound" in decision.reason


@pytest.mark.parametrize(
    ("vendor", "attempt", "kind", "text"),
    [
        ("pending", 1, LEAVE_ALONE, "still pending"),
        ("succeeded", 1, OUTCOME_UNKNOWN, "succeeded but its result was never recorded"),
        ("failed", 1, REDISPATCH, "vendor request r-1 failed"),
        ("unknown", 1, REDISPATCH, "never reached the vendor"),
        ("failed", 3, FAIL, "attempts used up"),
        ("unknown", 3, FAIL, "attempts used up"),
        ("error", 1, LEAVE_ALONE, "unavailable (ConnectionError: down)"),
    ],
)
def test_vendor_evidence(vendor, attempt, kind, text):
    evidence = Evidence(rq_status="started", worker_name="w1", worker_alive=False, vendor_status=vendor)
    if vendor == "error":
        evidence = Evidence(rq_status="missing", vendor_status="error", vendor_error="ConnectionError: down")
    decision = decide(state("running", attempt=attempt, vendor="r-1"), evidence, IMAGES, NOW)
    assert decision.kind == kind
    assert text in decision.reason


def test_vendor_evidence_is_ignored_for_retry_safe_domains():
    evidence = Evidence(rq_status="missing", vendor_status="succeeded")
    assert decide(state("running", vendor="r-1"), evidence, DELIVERY, NOW).kind == REDISPATCH


def test_decide_is_pure_and_uses_only_the_given_now():
    job = state("queued", age=30)
    later = NOW + timedelta(seconds=31)
    assert decide(job, MISSING, DELIVERY, NOW).kind == LEAVE_ALONE
    assert decide(job, MISSING, DELIVERY, later).kind == REDISPATCH
    assert decide(job, MISSING, DELIVERY, NOW) == decide(job, MISSING, DELIVERY, NOW)
