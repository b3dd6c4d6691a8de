"""The vendor-call ledger: a retry or a recovery resumes from the first call that did not take effect.

Real PostgreSQL, real Redis, the real local provider (a subclass that fails the
calls a test names, as a vendor with a bad moment would).
"""

from __future__ import annotations

import pytest

from dispatch_app import submit
from dispatch_app.domains.providers import LocalProvider, ProviderError, set_provider
from dispatch_app.execution import execute
from dispatch_app.models import Job, JobEvent, RecoveryRound, VendorCall
from dispatch_app.recovery.round import Round
from dispatch_app.store import vendor_calls
from tests.integration.recovery_helpers import (
    dispatch_now,
    other_connection,
    policy,
    run_workers,
    start_like_a_worker,
    statuses,
)

pytestmark = pytest.mark.django_db(transaction=True)  # the worker manages its own connection


class ScriptedProvider(LocalProvider):
    """The local provider; the calls numbered in ``fail`` (1-based, all operations) answer with a failure."""

    def __init__(self, root, fail=(), **kwargs):
        kwargs.setdefault("latency_ms", 0)
        super().__init__(root=root, failure_rate=0, **kwargs)
        self.fail = set(fail)
        self.calls: list[tuple[str, str | None]] = []  # every call that reached the vendor
        self.on_status = None  # called inside request_status (a test's hook into a slow vendor)

    def _call(self, op, request_id, record=True):
        self.calls.append((op, request_id))
        if len(self.calls) in self.fail:
            if request_id and record:
                self._record(request_id, "failed")
            raise ProviderError(f"scripted failure of call {len(self.calls)}")
        super()._call(op, request_id, record)

    def request_status(self, request_id):
        if self.on_status is not None:
            self.on_status(request_id)
        return super().request_status(request_id)


@pytest.fixture
def make_provider(tmp_path):
    def make(**kwargs):
        provider = ScriptedProvider(tmp_path, **kwargs)
        set_provider(provider)
        return provider

    yield make
    set_provider(None)


@pytest.fixture(autouse=True)
def no_backoff(settings):
    settings.DISPATCH = {"SEND_BACKOFF_BASE": 0}


def run(job) -> dict:
    job.refresh_from_db()
    return execute(job.domain, job.pk, job.attempt)


def ledger(job) -> list[tuple[int, int, str]]:
    return list(VendorCall.objects.filter(job=job).order_by("seq", "id").values_list("seq", "attempt", "status"))


def test_image_series_retry_generates_only_the_image_that_failed(make_provider):
    provider = make_provider(fail={3})
    job = submit("image_series", {"product_id": "p", "prompt": "shoe", "count": 3, "size": 8})

    assert run(job) == {"retrying": True}
    assert ledger(job) == [(0, 1, "succeeded"), (1, 1, "succeeded"), (2, 1, "failed")]
    assert run(job) == {"succeeded": True}

    job.refresh_from_db()
    assert (job.status, job.attempt) == ("succeeded", 2)
    assert [op for op, _ in provider.calls] == ["generate_image"] * 4  # 3, then only image 3 again
    first_two = [rid for _, rid in provider.calls[:2]]
    assert job.result["images"][:2] == [str(provider.root / "outputs" / f"{rid}.png") for rid in first_two]
    assert ledger(job) == [(0, 1, "succeeded"), (1, 1, "succeeded"), (2, 1, "failed"), (2, 2, "succeeded")]


def test_agent_retry_reruns_only_from_the_failing_step(make_provider):
    provider = make_provider(fail={2})
    job = submit("agent", {"goal": "caption", "max_steps": 3})

    assert run(job) == {"retrying": True}
    assert run(job) == {"succeeded": True}

    steps_made = [rid for _, rid in provider.calls]
    assert len(steps_made) == 4  # step 0, step 1 (failed), then steps 1 and 2
    by_seq = {}
    for seq, attempt, status in ledger(job):
        by_seq.setdefault(seq, []).append((attempt, status))
    assert by_seq == {0: [(1, "succeeded")], 1: [(1, "failed"), (2, "succeeded")], 2: [(2, "succeeded")]}
    assert Job.objects.get(pk=job.pk).result == {"steps": 3}


def _died_inside_call_two(job, provider, vendor_says):
    """Attempt 1 made image 1, recorded image 2 and died inside that call; the vendor says ``vendor_says``."""
    dispatch_now()
    job.refresh_from_db()
    start_like_a_worker(job)
    first = vendor_calls.record(job.pk, 1, 0, "image 1 of 2", "local-first")
    vendor_calls.settle(first, "succeeded", result={"image": "made-by-attempt-1.png", "request_id": "local-first"})
    vendor_calls.record(job.pk, 1, 1, "image 2 of 2", "local-second")
    if vendor_says is not None:
        provider._record("local-second", vendor_says)


@pytest.mark.parametrize(
    ("vendor_says", "generated_again", "settled_as"),
    [("succeeded", 0, "succeeded"), ("failed", 1, "failed"), (None, 1, "failed")],
    ids=["took-effect", "failed", "never-reached"],
)
def test_recovery_settles_the_call_in_doubt_then_the_next_attempt_resumes_after_it(
    redis_conn, make_provider, vendor_says, generated_again, settled_as
):
    provider = make_provider()
    job = submit("image_series", {"product_id": "p", "prompt": "shoe", "count": 2, "size": 8})
    _died_inside_call_two(job, provider, vendor_says)
    redis_conn.flushdb()  # its RQ job and worker are gone

    result = Round(policy("image_series"), redis=redis_conn, provider=provider).run_once()

    assert (result.ok, result.redispatched) == (True, 1), result
    assert statuses([job]) == {job.pk: ("submitted", 2)}
    second = VendorCall.objects.get(job=job, seq=1)
    assert second.status == settled_as and "asked by recovery" in second.error
    dispatch_now()
    run_workers(redis_conn)
    job.refresh_from_db()
    assert (job.status, job.attempt) == ("succeeded", 2)
    assert len(provider.calls) == generated_again  # image 1 never again; image 2 only if it did not take effect
    assert job.result["images"][0] == "made-by-attempt-1.png"


def test_recovery_trusts_a_pending_vendor_only_up_to_the_bound(redis_conn, make_provider):
    provider = make_provider()
    job = submit("image_series", {"product_id": "p", "prompt": "shoe", "count": 2, "size": 8})
    _died_inside_call_two(job, provider, "pending")
    redis_conn.flushdb()

    trusting = Round(policy("image_series"), redis=redis_conn, provider=provider).run_once()
    assert (trusting.left_alone, trusting.unknown) == (1, 0)
    assert "still pending" in trusting.candidates[0].reason and "trusted up to 600s" in trusting.candidates[0].reason

    bounded = policy("image_series", VENDOR_EVIDENCE_TRUST_SECONDS=0)
    dry = Round(bounded, redis=redis_conn, provider=provider, dry_run=True).run_once()
    assert (dry.candidates[0].decision, dry.candidates[0].outcome) == ("outcome_unknown", "would")
    assert "past the 0s trust bound" in dry.candidates[0].reason
    assert dry.candidates[0].evidence["calls_in_doubt"][0]["request_id"] == "local-second"

    done = Round(bounded, redis=redis_conn, provider=provider).run_once()
    assert done.unknown == 1
    job.refresh_from_db()
    assert job.status == "outcome_unknown" and "image 2 of 2" in job.error and "trust bound" in job.error
    event = JobEvent.objects.get(job=job, kind="recovery_outcome_unknown")
    assert "VENDOR_EVIDENCE_TRUST_SECONDS" in event.reason
    assert event.data["calls_in_doubt"][0]["seq"] == 1
    assert provider.calls == []


def test_a_worker_finishes_while_recovery_waits_on_the_vendor_and_recovery_then_stands_down(redis_conn, make_provider):
    provider = make_provider()
    job = submit("image_series", {"product_id": "p", "prompt": "shoe", "count": 2, "size": 8})
    _died_inside_call_two(job, provider, "pending")
    redis_conn.flushdb()  # so recovery believes the worker gone and asks the vendor
    finished_inside_the_vendor_call = []

    def worker_finishes(request_id):
        # The worker's outcome, from another session that refuses to wait for any lock.
        with other_connection() as worker:
            worker.execute("SET lock_timeout = '1s'")
            cur = worker.execute(
                "UPDATE dispatch_app_job SET status = 'succeeded', finished_at = clock_timestamp() "
                "WHERE id = %s AND status = 'running'",
                [job.pk],
            )
            finished_inside_the_vendor_call.append(cur.rowcount)

    provider.on_status = worker_finishes
    bounded = policy("image_series", VENDOR_EVIDENCE_TRUST_SECONDS=0)  # it would say outcome_unknown
    result = Round(bounded, redis=redis_conn, provider=provider).run_once()

    assert finished_inside_the_vendor_call == [1], "the worker's finish waited for recovery"
    assert (result.unknown, result.skipped) == (0, 1)
    assert result.candidates[0].outcome == "moved"
    assert "would have been: outcome_unknown" in result.candidates[0].reason
    assert statuses([job]) == {job.pk: ("succeeded", 1)}
    assert not JobEvent.objects.filter(job=job, kind__startswith="recovery_").exists()


def test_a_call_that_times_out_is_in_doubt_never_retried(make_provider):
    make_provider(latency_ms=400, timeout=0.05)
    images = submit("image_series", {"product_id": "p", "prompt": "shoe", "count": 1, "size": 8})
    agent = submit("agent", {"goal": "caption", "max_steps": 1})

    assert "in_doubt" in run(images)
    assert "outcome_unknown" in run(agent)

    assert statuses([images, agent]) == {images.pk: ("running", 1), agent.pk: ("outcome_unknown", 1)}
    assert ledger(images) == [(0, 1, "unknown")] and ledger(agent) == [(0, 1, "unknown")]
    event = JobEvent.objects.get(job=images, kind="vendor_call_in_doubt")
    assert "gave no answer" in event.reason and "left running for recovery" in event.reason
    assert "cannot be asked" in Job.objects.get(pk=agent.pk).error


def _workflow_died_inside_step_two(job):
    """Attempt 1 ran step 0 and died inside step 1 (recorded, never settled); the job moved on to attempt 2."""
    from django.db import transaction

    from dispatch_app.store.transitions import redispatch

    dispatch_now()
    job.refresh_from_db()
    start_like_a_worker(job)
    first = vendor_calls.record(job.pk, 1, 0, "step 0: fetch", "local-first")
    vendor_calls.settle(first, "succeeded", result={"step": "fetch", "ok": True})
    vendor_calls.record(job.pk, 1, 1, "step 1: render", "local-second")
    with transaction.atomic():
        assert redispatch(job.pk, 1, kind="recovery_redispatch", reason="test", allowed_statuses=("running",))
    job.refresh_from_db()


def test_a_retry_safe_domain_makes_a_call_left_in_doubt_again(make_provider):
    provider = make_provider()
    job = submit("workflow", {"workflow_id": "w", "steps": ["fetch", "render"]})
    _workflow_died_inside_step_two(job)

    assert run(job) == {"succeeded": True}
    assert statuses([job]) == {job.pk: ("succeeded", 2)}
    assert [op for op, _ in provider.calls] == ["run_step"]  # step 0 took effect: skipped; step 1 made again
    assert ledger(job) == [(0, 1, "succeeded"), (1, 1, "unknown"), (1, 2, "succeeded")]
    assert "made again (retry-safe)" in VendorCall.objects.get(job=job, seq=1, attempt=1).error


def test_a_call_that_times_out_in_a_retry_safe_domain_is_retried_through_the_outbox(make_provider):
    make_provider(latency_ms=400, timeout=0.05)
    job = submit("workflow", {"workflow_id": "w", "steps": ["fetch"]})

    assert run(job) == {"retrying": True}
    assert statuses([job]) == {job.pk: ("submitted", 2)}
    assert ledger(job) == [(0, 1, "unknown")]
    event = JobEvent.objects.get(job=job, kind="retry_after_failure")
    assert "gave no answer" in event.reason and "re-running is safe" in event.reason


def test_an_attempt_moved_on_makes_no_more_calls(make_provider):
    job = submit("image_series", {"product_id": "p", "prompt": "shoe", "count": 1, "size": 8})  # not running
    with pytest.raises(vendor_calls.AttemptSuperseded):
        vendor_calls.record(job.pk, 1, 0, "image 1 of 1", "local-x")
    assert not VendorCall.objects.filter(job=job).exists()


def test_candidates_that_raise_are_backed_off_so_the_27th_is_handled(redis_conn, make_provider):
    provider = make_provider()
    jobs = [submit("delivery", {"asset": f"a{i}", "target": f"https://t.example.invalid/{i}"}) for i in range(27)]
    dispatch_now()
    from dispatch_app.rq.publish import rq_job_id

    for job in jobs[:26]:  # a corrupt RQ hash: reading it raises (ValueError) for this candidate only
        redis_conn.hset(f"rq:job:{rq_job_id(job.pk, 1)}", "created_at", "not a date")
    redis_conn.delete(f"rq:job:{rq_job_id(jobs[26].pk, 1)}")
    delivery = policy("delivery")  # batch 25

    first = Round(delivery, redis=redis_conn, provider=provider).run_once()
    assert (first.scanned, first.errors, first.redispatched) == (25, 25, 0)
    assert not first.ok and first.status == "failed"
    assert RecoveryRound.objects.get(pk=first.round_id).errors == 25
    event = JobEvent.objects.filter(job=jobs[0], kind="recovery_error").get()
    assert "ValueError" in event.reason and "backed off" in event.reason

    second = Round(delivery, redis=redis_conn, provider=provider).run_once()
    assert [c.job_id for c in second.candidates[:2]] == [jobs[25].pk, jobs[26].pk]
    assert second.redispatched == 1
    assert statuses([jobs[26]]) == {jobs[26].pk: ("submitted", 2)}
    assert statuses([jobs[0]]) == {jobs[0].pk: ("queued", 1)}  # backed off, not touched otherwise


def test_an_operator_can_abandon_the_calls_in_doubt_so_a_retry_makes_them_again(make_provider):
    from django.db import transaction

    from dispatch_app.store.transitions import redispatch

    provider = make_provider(latency_ms=400, timeout=0.05)
    job = submit("agent", {"goal": "caption", "max_steps": 2})
    assert "outcome_unknown" in run(job)
    assert "outcome_unknown" in run_retry(job, redispatch, transaction, abandon=False)  # stops at the same step

    provider.latency = 0
    assert run_retry(job, redispatch, transaction, abandon=True) == {"succeeded": True}
    assert ledger(job) == [(0, 1, "failed"), (0, 3, "succeeded"), (1, 3, "succeeded")]


def run_retry(job, redispatch, transaction, *, abandon: bool) -> dict:
    job.refresh_from_db()
    with transaction.atomic():
        if abandon:
            assert vendor_calls.abandon_in_doubt(job.pk, "retried by an operator") == 1
        assert redispatch(
            job.pk, job.attempt, kind="operator_redispatch", reason="test", allowed_statuses=("outcome_unknown",)
        )
    return run(job)
