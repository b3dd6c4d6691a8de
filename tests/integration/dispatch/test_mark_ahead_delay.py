"""Envelopes sent ahead wait MARK_AHEAD_DELAY and are then marked together (real PostgreSQL and Redis).

The loop's clock is injected: the delay passes when the test says so. While an envelope waits for its mark it is
pending and unleased, in RQ, and a worker may start its job; the mark then dates the dispatch no later than that
start.
"""

import pytest
from django.db import OperationalError, connection
from rq import Queue
from rq.serializers import JSONSerializer

from dispatch_app import submit_many
from dispatch_app.dispatch import announced
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.dispatch.wake import MARK, NOTIFY, TICK
from dispatch_app.models import DispatchEnvelope, Job
from dispatch_app.rq.publish import Publisher
from dispatch_app.store import transitions
from dispatch_app.store.claim import Claimed, claim_batch
from tests.factories import PAYLOADS
from tests.integration.loop_kit import loop_settings

pytestmark = pytest.mark.django_db(transaction=True)

DELAY = 0.1


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingPublisher(Publisher):
    def __init__(self, conf, connection):
        super().__init__(conf, connection)
        self.sent: list[int] = []

    def send(self, chunk):
        self.sent.extend(e.envelope_id for e in chunk)
        return super().send(chunk)


@pytest.fixture
def make_loop(redis_conn):
    loops = []

    def make(**overrides):
        conf = loop_settings(MARK_AHEAD_DELAY=DELAY, **overrides)
        loop = DispatchLoop(conf, publisher=CountingPublisher(conf, redis_conn), clock=Clock())
        loops.append(loop)
        return loop

    yield make
    for loop in loops:
        loop.close()


def _announce(loop, jobs) -> None:
    envelopes = DispatchEnvelope.objects.filter(job__in=jobs).order_by("id")
    loop.wake.announced.extend(Claimed(e.id, e.job_id, e.attempt, e.domain, e.queue, 0, True) for e in envelopes)
    loop.wake.set(NOTIFY, named=True)


def _statuses(jobs) -> list[tuple[str, object]]:
    return list(DispatchEnvelope.objects.filter(job__in=jobs).order_by("id").values_list("status", "lease_token"))


def _in_rq(redis_conn) -> int:
    return Queue("delivery", connection=redis_conn, serializer=JSONSerializer).count


def test_a_sent_envelope_waits_for_its_mark_unleased_and_is_marked_when_the_delay_is_up(make_loop, redis_conn):
    loop = make_loop()
    jobs = submit_many([("delivery", PAYLOADS["delivery"])])
    _announce(loop, jobs)

    sent = loop.run_once(loop.wait())

    assert (sent.claimed, sent.claimed_first, sent.sends, sent.dispatched, sent.claim_skipped) == (1, 1, 1, 0, True)
    assert _in_rq(redis_conn) == 1, "sent at once"
    assert _statuses(jobs) == [("pending", None)], "unmarked, and never leased"
    assert loop.wait_timeout() == pytest.approx(DELAY)

    loop.ahead.clock.now += DELAY / 2
    assert loop.wait_timeout() == pytest.approx(DELAY / 2)
    loop.ahead.clock.now += DELAY / 2
    assert loop.wait() == MARK, "the wait ends when the mark is due, and says why"
    marked = loop.run_once(MARK)

    assert (marked.claimed, marked.dispatched, marked.sent_ahead, marked.claim_skipped) == (0, 1, 1, False)
    assert marked.claim_seconds == 0.0, "no claim either: a MARK step only marks"
    assert _statuses(jobs) == [("dispatched", None)]
    assert Job.objects.get(pk=jobs[0].pk).status == "queued"
    assert loop.publisher.sent == [DispatchEnvelope.objects.get(job=jobs[0]).pk], "one send in all"
    assert loop.wait_timeout() == loop.conf.POLL_INTERVAL, "nothing waits any more"


def test_the_sends_of_several_drains_share_one_mark(make_loop):
    loop = make_loop()
    jobs = []
    for _ in range(3):
        batch = submit_many([("delivery", PAYLOADS["delivery"])] * 2)
        jobs.extend(batch)
        _announce(loop, batch)
        assert loop.run_once(loop.wait()).dispatched == 0
        loop.ahead.clock.now += DELAY / 4
    assert loop.wait_timeout() == pytest.approx(DELAY / 4), "the oldest send sets the deadline"
    loop.ahead.clock.now += DELAY / 4
    marked = loop.run_once(loop.wait())
    assert (marked.trigger, marked.dispatched) == (MARK, 6)
    assert {status for status, _ in _statuses(jobs)} == {"dispatched"}


def test_a_job_started_before_its_mark_gets_a_dispatch_time_no_later_than_its_start(make_loop):
    loop = make_loop()
    [job] = submit_many([("delivery", PAYLOADS["delivery"])])
    _announce(loop, [job])
    loop.run_once(loop.wait())
    with connection.cursor() as cursor:
        assert transitions.start(cursor, "worker-1", job.pk, 1) is not None, "a pending, due envelope starts"
    loop.ahead.clock.now += DELAY
    assert loop.run_once(loop.wait()).dispatched == 1
    envelope = DispatchEnvelope.objects.get(job=job)
    started = Job.objects.get(pk=job.pk)
    assert started.status == "running", "the mark does not move a started job back"
    assert envelope.status == "dispatched"
    assert envelope.created_at <= envelope.dispatched_at <= started.started_at


def test_a_claim_marks_what_waits_first_and_does_not_send_it_again(make_loop, redis_conn):
    loop = make_loop()
    announced_jobs = submit_many([("delivery", PAYLOADS["delivery"])])
    _announce(loop, announced_jobs)
    loop.run_once(loop.wait())
    silent = submit_many([("delivery", PAYLOADS["delivery"])])  # no NOTIFY: only a claim finds it

    scanned = loop.run_once(TICK)

    assert (scanned.dispatched, scanned.sent_ahead, scanned.claim_skipped) == (2, 1, False)
    assert scanned.unannounced == 1, "the silent one, not the one sent ahead"
    assert {s for s, _ in _statuses(announced_jobs + silent)} == {"dispatched"}
    assert len(loop.publisher.sent) == 2 and _in_rq(redis_conn) == 2, "each sent once"
    assert loop.ahead.mark_in() is None


def test_a_burst_of_mark_ahead_max_is_marked_at_once(make_loop, monkeypatch):
    monkeypatch.setattr(announced, "MARK_AHEAD_MAX", 3)
    loop = make_loop()
    jobs = submit_many([("delivery", PAYLOADS["delivery"])] * 3)
    _announce(loop, jobs)
    result = loop.run_once(loop.wait())
    assert (result.dispatched, result.claim_skipped) == (3, True)
    assert loop.ahead.mark_in() is None


def test_envelopes_waiting_at_shutdown_are_marked_by_close(make_loop):
    loop = make_loop()
    jobs = submit_many([("delivery", PAYLOADS["delivery"])] * 2)
    _announce(loop, jobs)
    loop.run_once(loop.wait())
    assert {s for s, _ in _statuses(jobs)} == {"pending"}
    loop.close()
    assert {s for s, _ in _statuses(jobs)} == {"dispatched"}


def test_a_peer_that_claims_a_waiting_envelope_keeps_it_and_this_loop_forgets_it(make_loop):
    loop = make_loop()
    jobs = submit_many([("delivery", PAYLOADS["delivery"])])
    _announce(loop, jobs)
    loop.run_once(loop.wait())
    peer = claim_batch(10, 30.0)  # another dispatcher's tick, during the wait: a duplicate send, never a second run
    assert len(peer.envelopes) == 1
    loop.ahead.clock.now += DELAY
    result = loop.run_once(loop.wait())
    assert result.dispatched == 0, "not marked here: the peer's lease holds it"
    assert result.claim_seconds > 0, "the claim looked again (and found it leased)"
    assert _statuses(jobs) == [("pending", peer.token)], "the peer's lease is left alone"
    assert loop.ahead.mark_in() is None, "forgotten"


def test_a_stopping_loop_marks_what_waits_at_once(make_loop):
    loop = make_loop()
    jobs = submit_many([("delivery", PAYLOADS["delivery"])])
    _announce(loop, jobs)
    loop.run_once(loop.wait())
    assert _statuses(jobs) == [("pending", None)]
    loop.stop.set()
    assert loop.run_once(MARK).dispatched == 1, "before its delay is up"
    assert _statuses(jobs) == [("dispatched", None)]


def test_a_mark_that_failed_is_retried_as_a_claim_that_sends_and_marks_again(make_loop, monkeypatch, redis_conn):
    loop = make_loop()
    jobs = submit_many([("delivery", PAYLOADS["delivery"])])
    _announce(loop, jobs)
    loop.run_once(loop.wait())
    real = announced.store.mark_ahead

    def down(*args):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(announced.store, "mark_ahead", down)
    loop.ahead.clock.now += DELAY
    trigger = loop.wait()
    with pytest.raises(OperationalError):
        loop.run_once(trigger)
    assert loop.ahead.mark_in() is None, "forgotten: the claim finds them"
    monkeypatch.setattr(announced.store, "mark_ahead", real)

    retried = loop.run_once(trigger)  # the runner retries a failed step with its trigger

    assert (retried.trigger, retried.claim_skipped, retried.dispatched) == (MARK, False, 1)
    assert _statuses(jobs)[0][0] == "dispatched"
    assert _in_rq(redis_conn) == 1, "sent again: a duplicate in Redis, not a second job"
