"""Work that falls due later (a delayed submit, a lease that ran out unmarked) wakes the loop when it does.

No trigger fires when time passes, so the claim says when the next pending
envelope falls due and the loop's wait ends then. The fallback tick is an hour
away here: only that due time can explain the wake. Real PostgreSQL and Redis.
"""

from datetime import timedelta

import pytest
from django.db import connection

from dispatch_app import submit
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.dispatch.wake import DUE, NOTIFY, TICK, Wake
from dispatch_app.models import DispatchEnvelope, EnvelopeStatus, Job, JobStatus
from dispatch_app.rq.publish import Publisher
from dispatch_app.store.claim import ENVELOPE, claim_batch
from tests.factories import PAYLOADS
from tests.integration.loop_kit import NEVER, loop_settings

pytestmark = pytest.mark.django_db(transaction=True)


def make_loop(redis_conn, clock=None):
    conf = loop_settings()
    kwargs = {"clock": clock} if clock is not None else {}
    return DispatchLoop(conf, wake=Wake(), publisher=Publisher(conf, redis_conn), **kwargs)


def test_the_claim_says_when_the_next_pending_envelope_falls_due():
    later = submit("delivery", PAYLOADS["delivery"], available_at=timedelta(seconds=40))
    sooner = submit("delivery", PAYLOADS["delivery"], available_at=timedelta(seconds=20))
    submit("delivery", PAYLOADS["delivery"])  # due now: claimed, not counted as due later

    batch = claim_batch(10, lease_seconds=60)

    assert len(batch.envelopes) == 1
    # The sooner of the two, read in the claim's own statement (its own 60 s lease is not in its snapshot).
    assert 15 < batch.next_due_in <= 20, batch.next_due_in
    assert {later.pk, sooner.pk}.isdisjoint(e.job_id for e in batch.envelopes)


def test_an_empty_claim_still_says_when_and_nothing_pending_says_none():
    assert claim_batch(10, 30).next_due_in is None
    submit("delivery", PAYLOADS["delivery"], available_at=timedelta(seconds=5))
    batch = claim_batch(10, 30)
    assert batch.envelopes == []
    assert 0 < batch.next_due_in <= 5


def test_the_wait_ends_when_the_claim_said_and_reads_as_due_not_tick(redis_conn):
    class Clock:
        now = 1000.0

        def __call__(self):
            return self.now

    clock = Clock()
    loop = make_loop(redis_conn, clock)
    submit("delivery", PAYLOADS["delivery"], available_at=timedelta(seconds=30))
    result = loop.run_once(NOTIFY)
    assert result.claimed == 0 and 25 < result.next_due_in <= 30
    # The wait is bounded by the due time, not by the hour-long tick...
    assert loop.wait_timeout() == pytest.approx(result.next_due_in)
    assert loop.wait_timeout() < NEVER
    # ...and a wait that ends there is a due scan (nothing else woke it).
    clock.now += result.next_due_in
    assert loop.wait() == DUE
    # Said once: the next wait is a plain tick again until a claim says otherwise.
    assert loop.wait_timeout() == NEVER
    loop.wake.set(NOTIFY)
    assert loop.wait() == NOTIFY
    loop.close()


def test_a_lease_that_ran_out_unmarked_is_sent_again_when_it_runs_out(redis_conn):
    job = submit("delivery", PAYLOADS["delivery"])
    # A dispatcher claimed it with a short lease and died before sending or marking it.
    dead = claim_batch(10, lease_seconds=0.5)
    assert [e.job_id for e in dead.envelopes] == [job.pk]

    loop = make_loop(redis_conn)
    first = loop.run_once(NOTIFY)
    assert first.claimed == 0 and 0 < first.next_due_in <= 0.5
    # Real time: the wait returns by itself when the lease runs out, an hour before any tick.
    assert loop.wait() == DUE
    second = loop.run_once(DUE)
    loop.close()

    assert second.dispatched == 1
    envelope = DispatchEnvelope.objects.get(job=job)
    assert envelope.status == EnvelopeStatus.DISPATCHED and envelope.send_attempts == 2
    assert Job.objects.get(pk=job.pk).status == JobStatus.QUEUED


def test_a_tick_is_still_a_tick_when_nothing_falls_due(redis_conn):
    conf = loop_settings(POLL_INTERVAL=0.01)
    loop = DispatchLoop(conf, wake=Wake(), publisher=Publisher(conf, redis_conn))
    assert loop.run_once(NOTIFY).next_due_in is None
    assert loop.wait() == TICK
    loop.close()


def test_the_next_due_probe_ignores_rows_no_longer_pending(redis_conn):
    job = submit("delivery", PAYLOADS["delivery"], available_at=timedelta(seconds=30))
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {ENVELOPE} SET status = 'dead' WHERE job_id = %s", [job.pk])
    assert claim_batch(10, 30).next_due_in is None
