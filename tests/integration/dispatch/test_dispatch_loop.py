"""The dispatch loop, driven by wakes alone (the fallback tick is an hour away), on real PostgreSQL and Redis."""

import threading

import pytest
from django.db import connection
from rq import Queue
from rq.serializers import JSONSerializer

from dispatch_app import submit, submit_many
from dispatch_app.db.check import ConnectionCheck
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.dispatch.wake import CATCH_UP, NOTIFY, STOP
from dispatch_app.models import DispatchEnvelope, EnvelopeStatus, Job, JobStatus
from dispatch_app.rq.publish import Publisher
from dispatch_app.runtime.runner import LoopRunner
from dispatch_app.store.claim import claim_batch
from tests.factories import PAYLOADS
from tests.integration.loop_kit import NEVER, DrainLog, HeldPublisher, ObservedWake, loop_settings

B = 5


def delivery_jobs(n: int):
    return submit_many([("delivery", PAYLOADS["delivery"])] * n)


def queued_in_redis(redis_conn) -> int:
    return Queue("delivery", connection=redis_conn, serializer=JSONSerializer).count


class Running:
    """A LoopRunner thread around a DispatchLoop, stopped and joined at the end."""

    def __init__(self, redis_conn, publisher_class=Publisher, **runner_options):
        self.conf = loop_settings(BATCH_SIZE=B)
        self.wake = ObservedWake()
        self.stop = threading.Event()
        self.log = DrainLog()
        self.publisher = publisher_class(self.conf, redis_conn)
        self.loop = DispatchLoop(self.conf, wake=self.wake, stop=self.stop, observer=self.log, publisher=self.publisher)
        self.runner = LoopRunner(self.loop, self.stop, **runner_options)

    def __enter__(self):
        self.runner.start()
        return self

    def __exit__(self, *exc):
        if isinstance(self.publisher, HeldPublisher):
            self.publisher.release.set()
        self.stop.set()
        self.wake.set(STOP)
        assert self.runner.join(10), "the dispatch loop did not stop"
        self.loop.close()


@pytest.mark.django_db(transaction=True)
def test_one_wake_dispatches_a_backlog_of_3b_plus_1_without_a_tick(redis_conn):
    jobs = delivery_jobs(3 * B + 1)
    with Running(redis_conn) as run:
        run.wake.idle.wait_for(1)
        run.wake.set(NOTIFY)
        run.log.drains.wait_for(1)
        # Back to waiting with nothing pending: that one wake gave one scan.
        run.wake.idle.wait_for(2)
        assert run.loop.scans == 1
    (drain,) = run.log.results
    assert drain.trigger == NOTIFY
    assert drain.batch_sizes == [B, B, B, 1]
    assert drain.dispatched == 3 * B + 1
    assert set(DispatchEnvelope.objects.values_list("status", flat=True)) == {EnvelopeStatus.DISPATCHED}
    assert Job.objects.filter(status=JobStatus.QUEUED, dispatched_at__isnull=False).count() == len(jobs)
    assert queued_in_redis(redis_conn) == 3 * B + 1


@pytest.mark.django_db(transaction=True)
def test_a_wake_during_a_scan_gives_exactly_one_more_scan(redis_conn):
    submit("delivery", PAYLOADS["delivery"])
    with Running(redis_conn, HeldPublisher) as run:
        run.wake.idle.wait_for(1)
        run.wake.set(NOTIFY)
        assert run.publisher.entered.wait(10)
        # While the first scan is held in its send: new work and several wakes.
        late = submit("delivery", PAYLOADS["delivery"])
        for _ in range(3):
            run.wake.set(NOTIFY)
        run.publisher.release.set()
        run.wake.idle.wait_for(2)
        assert run.loop.scans == 2
    first, second = run.log.results
    assert (first.dispatched, second.dispatched) == (1, 1)
    assert DispatchEnvelope.objects.get(job=late).status == EnvelopeStatus.DISPATCHED
    assert queued_in_redis(redis_conn) == 2


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_wakes_coalesces_into_one_scan(redis_conn):
    delivery_jobs(2)
    with Running(redis_conn) as run:
        run.wake.idle.wait_for(1)
        for _ in range(50):
            run.wake.set(NOTIFY)
        run.log.drains.wait_for(1)
        run.wake.idle.wait_for(2)
        assert run.loop.scans == 1
        assert run.wake.signals == 50
    assert run.log.results[0].dispatched == 2


@pytest.mark.django_db
def test_after_stop_no_new_batch_starts_and_unsent_envelopes_are_given_back(redis_conn):
    # Two full batches' worth; each envelope is its own chunk, one send at a time.
    delivery_jobs(2 * B)
    conf = loop_settings(BATCH_SIZE=B, SEND_CHUNK_SIZE=1, SEND_CONCURRENCY=1)
    stop = threading.Event()
    publisher = HeldPublisher(conf, redis_conn, on_first_send=stop.set)
    publisher.release.set()  # not held: the first send just raises the stop signal
    loop = DispatchLoop(conf, stop=stop, publisher=publisher)
    try:
        result = loop.run_once(NOTIFY)
    finally:
        loop.close()
    # The send in flight finished and was recorded; the rest of the batch went back.
    assert (result.batches, result.claimed, result.dispatched, result.released) == (1, B, 1, B - 1)
    assert publisher.sends == 1
    envelopes = DispatchEnvelope.objects.order_by("id")
    assert [e.status for e in envelopes].count(EnvelopeStatus.DISPATCHED) == 1
    pending = [e for e in envelopes if e.status == EnvelopeStatus.PENDING]
    assert len(pending) == 2 * B - 1
    # Given back, not leased: claimable at once, and the attempt not counted.
    assert all(e.lease_token is None and e.send_attempts == 0 for e in pending)
    assert len(claim_batch(2 * B, 30).envelopes) == 2 * B - 1
    assert queued_in_redis(redis_conn) == 1


@pytest.mark.django_db(transaction=True)
def test_a_wake_spent_on_a_connection_the_server_killed_is_not_lost(redis_conn):
    """A PostgreSQL restart kills the loop's idle connection (checked only after an idle spell, as the
    supervisor runs it), and the listener's one catch-up wake then meets it: the failed drain is run again
    after the backoff, not left for the tick (an hour here)."""
    delivery_jobs(1)
    with Running(redis_conn, db_check=ConnectionCheck(interval=NEVER), error_backoff=0.01) as run:
        run.wake.idle.wait_for(1)
        run.wake.set(NOTIFY)
        run.log.drains.wait_for(1)
        run.wake.idle.wait_for(2)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            assert cursor.fetchone()[0] >= 1  # the loop's connection, and the marker's if it has one
        delivery_jobs(2)
        run.wake.set(CATCH_UP)
        run.log.drains.wait_for(2)
        assert run.runner.errors == 1
        assert run.wake.signals == 2
    assert [(d.trigger, d.dispatched) for d in run.log.results] == [(NOTIFY, 1), (CATCH_UP, 2)]
    assert set(DispatchEnvelope.objects.values_list("status", flat=True)) == {EnvelopeStatus.DISPATCHED}
    assert queued_in_redis(redis_conn) == 3
