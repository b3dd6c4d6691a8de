"""The mark's times: the outbox wait starts when the envelope is due (not at a delay's or backoff's start), and
dispatched_at is when the job entered RQ (its send's start), never after the worker's start."""

import time
from datetime import timedelta

import pytest
from django.db import connection

from dispatch_app import submit
from dispatch_app.models import DispatchEnvelope, Job
from dispatch_app.store import claim, transitions
from dispatch_app.timeline import stages
from tests.factories import PAYLOADS

pytestmark = pytest.mark.django_db


def _age_envelopes(seconds: float) -> None:
    """As if every envelope, and its delay, had been created `seconds` earlier."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dispatch_app_dispatchenvelope SET created_at = created_at - make_interval(secs => %s),"
            " available_at = available_at - make_interval(secs => %s)",
            [seconds, seconds],
        )
        cursor.execute(
            "UPDATE dispatch_app_jobattempt SET created_at = created_at - make_interval(secs => %s),"
            " due_at = due_at - make_interval(secs => %s)",
            [seconds, seconds],
        )


def test_a_delayed_envelopes_wait_counts_from_its_due_time_and_an_immediate_one_from_its_creation():
    submit("delivery", PAYLOADS["delivery"], available_at=timedelta(seconds=60))
    submit("delivery", PAYLOADS["delivery"])
    _age_envelopes(70)  # the delayed one has been due for ~10 s; the other waited ~70 s

    batch = claim.claim_batch(10, 30)
    latencies: list[float] = []
    assert claim.mark_dispatched([e.envelope_id for e in batch.envelopes], batch.token, latencies) == 2

    delayed, immediate = sorted(latencies)
    assert 9 < delayed < 30, latencies  # from due (~10 s ago), not from creation (~70 s ago)
    assert immediate >= 70, latencies


def _db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def test_dispatched_at_is_when_the_send_started_on_the_database_clock_not_when_the_mark_ran():
    job = submit("delivery", PAYLOADS["delivery"])
    batch = claim.claim_batch(10, 30)
    before, host_before = _db_now(), time.monotonic()
    # The send started two seconds (host monotonic clock) before this mark.
    assert claim.mark_dispatched([batch.envelopes[0].envelope_id], batch.token, sent_at=[host_before - 2.0]) == 1
    host_took = timedelta(seconds=time.monotonic() - host_before)
    after = _db_now()

    envelope = DispatchEnvelope.objects.get(job=job)
    assert before - timedelta(seconds=2) - host_took <= envelope.dispatched_at <= after - timedelta(seconds=2)
    # The job's own dispatch time is the envelope's.
    assert Job.objects.get(pk=job.pk).dispatched_at == envelope.dispatched_at


def test_a_worker_that_started_before_the_mark_is_never_before_its_dispatch():
    job = submit("delivery", PAYLOADS["delivery"])
    batch = claim.claim_batch(10, 30)
    with connection.cursor() as cursor:
        assert transitions.start(cursor, "worker-1", job.pk, 1) is not None  # the worker was first
    started_at = Job.objects.get(pk=job.pk).started_at

    # A mark that dates the send later than the start (here: no send time given, so "now") is held at the start.
    assert claim.mark_dispatched([batch.envelopes[0].envelope_id], batch.token) == 1
    envelope = DispatchEnvelope.objects.get(job=job)
    assert envelope.dispatched_at == started_at
    [attempt] = stages.job_attempts(Job.objects.get(pk=job.pk))
    rq = next(s for s in attempt.stages(_db_now()) if s.key == "rq")
    assert rq.duration == timedelta(0)


def test_a_start_from_before_the_claim_does_not_date_a_re_send_whose_lease_ran_out():
    """A dispatcher killed after its send: the job ran, the lease ran out, another dispatcher re-claims and sends
    again. The re-send is dated when it happened (after the lease), not at the earlier send's start."""
    job = submit("delivery", PAYLOADS["delivery"])
    dead = claim.claim_batch(10, 0)  # a lease that has already run out
    with connection.cursor() as cursor:
        assert transitions.start(cursor, "worker-1", job.pk, 1) is not None  # the dead dispatcher's send ran
    started_at = Job.objects.get(pk=job.pk).started_at

    again = claim.claim_batch(10, 30)
    assert [e.envelope_id for e in again.envelopes] == [e.envelope_id for e in dead.envelopes]
    before = _db_now()
    assert claim.mark_dispatched([again.envelopes[0].envelope_id], again.token, lease_seconds=30) == 1

    dispatched_at = DispatchEnvelope.objects.get(job=job).dispatched_at
    assert dispatched_at > started_at
    assert dispatched_at >= before - timedelta(seconds=1)  # "now": no send time was given
