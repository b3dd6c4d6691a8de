"""One recovery round against real PostgreSQL and real Redis (and a real RQ worker)."""

from __future__ import annotations

import pytest
from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker

from dispatch_app import submit
from dispatch_app.models import DispatchEnvelope, Job, JobEvent, RecoveryRound
from dispatch_app.recovery.discovery import Discovery
from dispatch_app.recovery.round import Round, RoundSignals
from dispatch_app.store import vendor_calls
from tests.factories import PAYLOADS
from tests.integration import provider_kit
from tests.integration.recovery_helpers import (
    dispatch_now,
    mark_rq_started,
    other_connection,
    policy,
    run_workers,
    snapshot,
    start_like_a_worker,
    statuses,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def provider(tmp_path):
    yield from provider_kit.installed(tmp_path)


def events(job, kind_prefix="recovery_"):
    return list(JobEvent.objects.filter(job=job, kind__startswith=kind_prefix).order_by("id"))


def test_redis_flushed_after_dispatch_every_unfinished_job_is_redispatched_then_runs(redis_conn, provider):
    jobs = [submit(domain, PAYLOADS[domain]) for domain in PAYLOADS for _ in range(2)]
    done = submit("delivery", PAYLOADS["delivery"])
    cancelled = submit("workflow", PAYLOADS["workflow"])
    dispatch_now()
    Job.objects.filter(pk=done.pk).update(status="succeeded")
    Job.objects.filter(pk=cancelled.pk).update(status="cancelled")
    terminal_before = list(Job.objects.filter(pk__in=[done.pk, cancelled.pk]).order_by("pk").values())

    redis_conn.flushdb()  # Redis lost everything (the test database only)

    for domain in PAYLOADS:
        result = Round(policy(domain), redis=redis_conn, provider=provider).run_once()
        assert result.ok and result.ran
        assert (result.scanned, result.redispatched) == (2, 2), result
    for job in jobs:
        job.refresh_from_db()
        assert (job.status, job.attempt) == ("submitted", 2)
        (event,) = events(job)
        assert event.kind == "recovery_redispatch"
        assert "RQ job is missing" in event.reason and "before the job started" in event.reason
    # Terminal in PostgreSQL: not candidates, not touched.
    assert list(Job.objects.filter(pk__in=[done.pk, cancelled.pk]).order_by("pk").values()) == terminal_before
    assert not JobEvent.objects.filter(job__in=[done, cancelled]).exists()

    dispatch_now()
    run_workers(redis_conn)
    assert statuses(jobs) == {job.pk: ("succeeded", 2) for job in jobs}


def test_worker_died_mid_run_outcome_unknown_unless_retry_safe(redis_conn, provider):
    delivery = submit("delivery", PAYLOADS["delivery"])
    images = submit("image_series", PAYLOADS["image_series"])
    agent = submit("agent", PAYLOADS["agent"])
    alive = submit("delivery", PAYLOADS["delivery"])
    dispatch_now()
    for job in (delivery, images, agent, alive):
        job.refresh_from_db()
        start_like_a_worker(job)
    # Each died inside a vendor call: the image vendor still says pending, the agent's tools cannot be asked.
    vendor_calls.record(images.pk, 1, 0, "image 1 of 1", "local-req-images")
    provider._record("local-req-images", "pending")
    vendor_calls.record(agent.pk, 1, 0, "agent-step-0", "local-req-agent")
    for job in (delivery, images, agent):
        mark_rq_started(redis_conn, job.pk, 1, "worker-that-died")  # its hash is gone: no heartbeat
    live_worker = SimpleWorker(["delivery"], connection=redis_conn, serializer=JSONSerializer, name="live-one")
    live_worker.register_birth()
    mark_rq_started(redis_conn, alive.pk, 1, "live-one")
    alive_before = Job.objects.get(pk=alive.pk)

    results = {
        d: Round(policy(d, VENDOR_EVIDENCE_TRUST_SECONDS=0), redis=redis_conn, provider=provider).run_once()
        for d in ("delivery", "image_series", "agent")
    }

    assert (results["delivery"].redispatched, results["delivery"].left_alone) == (1, 1)
    assert results["image_series"].unknown == results["agent"].unknown == 1
    assert statuses([delivery, images, agent, alive]) == {
        delivery.pk: ("submitted", 2),
        images.pk: ("outcome_unknown", 1),
        agent.pk: ("outcome_unknown", 1),
        alive.pk: ("running", 1),
    }
    images.refresh_from_db()
    assert images.finished_at is not None and "still pending" in images.error
    assert "past the 0s trust bound (VENDOR_EVIDENCE_TRUST_SECONDS)" in images.error
    (unknown,) = events(agent)
    assert unknown.kind == "recovery_outcome_unknown" and "worker-that-died, which is gone" in unknown.reason
    assert "agent-step-0" in unknown.reason and "cannot be asked" in unknown.reason
    assert unknown.data["evidence"]["worker_alive"] is False
    (left,) = events(alive)
    assert left.kind == "recovery_leave_alone" and "live worker live-one" in left.reason
    # Left alone = looked at: to the back of the discovery order until its threshold passes again.
    assert Job.objects.get(pk=alive.pk).updated_at > alive_before.updated_at

    dispatch_now()
    run_workers(redis_conn)
    assert statuses([delivery]) == {delivery.pk: ("succeeded", 2)}
    live_worker.register_death()


@pytest.mark.parametrize(
    ("vendor_says", "expected", "text"),
    [
        (None, ("submitted", 2), "never reached the vendor"),
        ("failed", ("submitted", 2), "failed"),
        ("pending", ("running", 1), "still pending"),
        ("succeeded", ("outcome_unknown", 1), "never recorded"),
    ],
)
def test_a_job_from_before_the_ledger_asks_the_vendor_about_its_request_id(
    redis_conn, provider, vendor_says, expected, text
):
    job = submit("image_series", PAYLOADS["image_series"])
    dispatch_now()
    job.refresh_from_db()
    start_like_a_worker(job)
    Job.objects.filter(pk=job.pk).update(vendor_request_id="local-req-1")
    if vendor_says:
        provider._record("local-req-1", vendor_says)
    redis_conn.flushdb()

    result = Round(policy("image_series"), redis=redis_conn, provider=provider).run_once()

    assert result.ok and result.scanned == 1
    assert statuses([job]) == {job.pk: expected}
    assert text in JobEvent.objects.filter(job=job, kind__startswith="recovery_").get().reason


def test_submitted_job_with_pending_envelope_is_not_a_candidate(redis_conn, provider):
    job = submit("delivery", PAYLOADS["delivery"])  # never dispatched: in the outbox
    lost = submit("delivery", PAYLOADS["delivery"])
    DispatchEnvelope.objects.filter(job=lost).delete()  # submitted, no envelope: lost
    result = Round(policy("delivery"), redis=redis_conn, provider=provider).run_once()
    assert (result.scanned, result.redispatched) == (1, 1)
    assert statuses([job, lost]) == {job.pk: ("submitted", 1), lost.pk: ("submitted", 2)}
    assert not JobEvent.objects.filter(job=job).exists()


def test_front_candidates_locked_by_another_transaction_are_skipped_then_done(redis_conn, provider):
    jobs = [submit("delivery", PAYLOADS["delivery"]) for _ in range(3)]
    dispatch_now()
    redis_conn.flushdb()
    front, later = jobs[:2], jobs[2]
    ordered = list(Job.objects.filter(pk__in=[j.pk for j in jobs]).order_by("updated_at", "id"))
    assert [j.pk for j in ordered] == [j.pk for j in jobs]

    with other_connection() as other:
        other.execute("SELECT id FROM dispatch_app_job WHERE id = ANY(%s) FOR UPDATE", [[j.pk for j in front]])
        first = Round(policy("delivery"), redis=redis_conn, provider=provider).run_once()
        assert (first.scanned, first.redispatched) == (1, 1)
        assert statuses(jobs) == {front[0].pk: ("queued", 1), front[1].pk: ("queued", 1), later.pk: ("submitted", 2)}
        other.rollback()

    second = Round(policy("delivery"), redis=redis_conn, provider=provider).run_once()
    assert (second.scanned, second.redispatched) == (2, 2)
    assert [c.job_id for c in second.candidates] == [front[0].pk, front[1].pk]
    assert statuses(jobs) == {j.pk: ("submitted", 2) for j in jobs}


def test_candidate_moved_between_discovery_and_reread_is_not_touched(redis_conn, provider):
    finished = submit("delivery", PAYLOADS["delivery"])
    cancelled = submit("delivery", PAYLOADS["delivery"])
    locked = submit("delivery", PAYLOADS["delivery"])
    still_lost = submit("delivery", PAYLOADS["delivery"])
    dispatch_now()
    redis_conn.flushdb()
    other = other_connection()

    def move_them(found: Discovery):
        assert {c.job_id for c in found.candidates} == {finished.pk, cancelled.pk, locked.pk, still_lost.pk}
        with other.transaction():
            # A worker finished one, a user cancelled another...
            other.execute(
                "UPDATE dispatch_app_job SET status = 'succeeded', finished_at = clock_timestamp() WHERE id = %s",
                [finished.pk],
            )
            other.execute("UPDATE dispatch_app_job SET status = 'cancelled' WHERE id = %s", [cancelled.pk])
        # ...and a third is held by a transaction that stays open through the re-read.
        other.execute("SELECT 1 FROM dispatch_app_job WHERE id = %s FOR UPDATE", [locked.pk])

    try:
        rows_after_move = {}
        signals = RoundSignals(after_discovery=move_them)
        result = Round(policy("delivery"), redis=redis_conn, provider=provider, signals=signals).run_once()
        other.rollback()
        rows_after_move = {j: Job.objects.filter(pk=j).values().get() for j in (finished.pk, cancelled.pk)}
    finally:
        other.close()

    assert (result.scanned, result.skipped, result.redispatched) == (4, 3, 1)
    outcomes = {c.job_id: c.outcome for c in result.candidates}
    assert outcomes == {finished.pk: "moved", cancelled.pk: "moved", locked.pk: "locked", still_lost.pk: "done"}
    assert rows_after_move[finished.pk]["status"] == "succeeded" and rows_after_move[finished.pk]["attempt"] == 1
    assert rows_after_move[cancelled.pk]["status"] == "cancelled" and rows_after_move[cancelled.pk]["attempt"] == 1
    assert not JobEvent.objects.filter(job_id__in=[finished.pk, cancelled.pk, locked.pk]).exists()
    assert DispatchEnvelope.objects.filter(job_id__in=[finished.pk, cancelled.pk, locked.pk]).count() == 3
    assert statuses([still_lost]) == {still_lost.pk: ("submitted", 2)}


def test_round_is_recorded_with_its_counts(redis_conn, provider):
    jobs = [submit("delivery", PAYLOADS["delivery"]) for _ in range(4)]
    dispatch_now()
    redis_conn.flushdb()

    result = Round(policy("delivery", BATCH_SIZE=3), redis=redis_conn, provider=provider).run_once()

    record = RecoveryRound.objects.get(pk=result.round_id)
    assert record.domain == "delivery" and record.finished_at >= record.started_at
    assert (record.scanned, record.redispatched, record.has_more, record.errors) == (3, 3, True, 0)
    assert record.oldest_candidate_age == pytest.approx(result.oldest_candidate_age) and record.oldest_candidate_age > 0
    assert [c.job_id for c in result.candidates] == [j.pk for j in jobs[:3]]


def test_redispatch_rate_cap_defers_the_rest_to_the_next_round(redis_conn, provider):
    jobs = [submit("workflow", PAYLOADS["workflow"]) for _ in range(4)]
    dispatch_now()
    redis_conn.flushdb()
    capped = policy("workflow", MAX_REDISPATCHES_PER_ROUND=1)

    first = Round(capped, redis=redis_conn, provider=provider).run_once()
    assert (first.scanned, first.redispatched, first.skipped, first.has_more) == (4, 1, 3, True)
    assert [c.outcome for c in first.candidates] == ["done", "deferred", "deferred", "deferred"]
    assert not JobEvent.objects.filter(job_id__in=[j.pk for j in jobs[1:]]).exists()

    second = Round(capped, redis=redis_conn, provider=provider).run_once()
    assert second.candidates[0].job_id == jobs[1].pk and second.redispatched == 1


def test_dry_run_decides_but_changes_nothing(redis_conn, provider):
    for domain in PAYLOADS:
        submit(domain, PAYLOADS[domain])
    dispatch_now()
    redis_conn.flushdb()
    before = snapshot()
    for domain in PAYLOADS:
        result = Round(policy(domain), redis=redis_conn, provider=provider, dry_run=True).run_once()
        assert [(c.decision, c.outcome) for c in result.candidates] == [("redispatch", "would")]
        assert result.round_id is None
    assert snapshot() == before


def test_redis_unreachable_ends_the_round_at_the_first_candidate(redis_conn, provider, tmp_path):
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    jobs = [submit("delivery", PAYLOADS["delivery"]) for _ in range(2)]
    dispatch_now()
    unreachable = redis.Redis(
        unix_socket_path=str(tmp_path / "no-redis.sock"), socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )

    with pytest.raises(redis.ConnectionError):
        Round(policy("delivery"), redis=unreachable, provider=provider).run_once()

    record = RecoveryRound.objects.get(domain="delivery")
    assert "ConnectionError" in record.error and record.finished_at is not None
    assert statuses(jobs) == {j.pk: ("queued", 1) for j in jobs}
    assert not JobEvent.objects.exists()
    assert Round(policy("delivery"), redis=redis_conn, provider=provider).run_once().ran  # lock given back


def test_an_action_that_raises_rolls_back_the_batch_and_only_its_candidate_is_an_error(redis_conn, provider):
    # The round acts on all its candidates in one transaction; a redispatch PostgreSQL refuses for one
    # job (a trigger, as a broken row would) must not cost the others their action.
    jobs = [submit("delivery", PAYLOADS["delivery"]) for _ in range(3)]
    dispatch_now()
    redis_conn.flushdb()
    bad = jobs[1]
    with other_connection() as other:
        other.execute(
            "CREATE FUNCTION pf_test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$"
        )
        other.execute(
            "CREATE TRIGGER pf_test_refuse BEFORE UPDATE ON dispatch_app_job FOR EACH ROW "
            f"WHEN (NEW.id = {int(bad.pk)} AND NEW.attempt <> OLD.attempt) EXECUTE FUNCTION pf_test_refuse()"
        )
        other.commit()
        try:
            result = Round(policy("delivery"), redis=redis_conn, provider=provider).run_once()
        finally:
            other.execute("DROP TRIGGER pf_test_refuse ON dispatch_app_job")
            other.execute("DROP FUNCTION pf_test_refuse()")
            other.commit()

    assert (result.scanned, result.redispatched, result.errors, result.skipped) == (3, 2, 1, 0), result
    outcomes = {c.job_id: c.outcome for c in result.candidates}
    assert outcomes == {jobs[0].pk: "done", bad.pk: "error", jobs[2].pk: "done"}
    assert "refused by the test" in next(c.reason for c in result.candidates if c.job_id == bad.pk)
    assert statuses(jobs) == {jobs[0].pk: ("submitted", 2), bad.pk: ("queued", 1), jobs[2].pk: ("submitted", 2)}
    assert [e.kind for e in events(bad)] == ["recovery_error"]
    for job in (jobs[0], jobs[2]):
        assert [e.kind for e in events(job)] == ["recovery_redispatch"]
        assert DispatchEnvelope.objects.filter(job=job, attempt=2, status="pending").count() == 1
    assert not DispatchEnvelope.objects.filter(job=bad, attempt=2).exists()
    record = RecoveryRound.objects.get(pk=result.round_id)
    assert (record.redispatched, record.errors) == (2, 1)


def test_redis_lost_mid_round_still_acts_on_what_was_decided_before(redis_conn, provider):
    import redis

    jobs = [submit("delivery", PAYLOADS["delivery"]) for _ in range(3)]
    dispatch_now()
    redis_conn.flushdb()
    asked = []

    class LostAfterTwo(type(redis_conn)):
        # The real server answers the first two candidates' questions; then the connection is gone.
        def exists(self, *names):
            asked.append(names)
            if len(asked) > 2:
                raise redis.ConnectionError("lost by the test")
            return super().exists(*names)

    flaky = LostAfterTwo(connection_pool=redis_conn.connection_pool)
    with pytest.raises(redis.ConnectionError):
        Round(policy("delivery"), redis=flaky, provider=provider).run_once()

    assert statuses(jobs) == {jobs[0].pk: ("submitted", 2), jobs[1].pk: ("submitted", 2), jobs[2].pk: ("queued", 1)}
    record = RecoveryRound.objects.get(domain="delivery")
    assert "lost by the test" in record.error and record.redispatched == 2
    assert not events(jobs[2])
