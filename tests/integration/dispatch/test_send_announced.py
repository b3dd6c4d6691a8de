"""Announced envelopes are sent before their claim, then claimed and marked once (real PostgreSQL and Redis).

What a writer named in its NOTIFY (dispatch.announced) reaches the loop through
the wake. The publisher below records, at each send, how many times the database
says the envelope was claimed: 0 means it went out ahead of its claim.
"""

import pytest
from rq import Queue
from rq.serializers import JSONSerializer

from dispatch_app import submit_many
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.dispatch.wake import NOTIFY
from dispatch_app.housekeeping.metrics import DispatchMetrics
from dispatch_app.models import DispatchEnvelope
from dispatch_app.rq.publish import Publisher
from dispatch_app.store.claim import Claimed, claim_batch
from tests.factories import PAYLOADS
from tests.integration.loop_kit import loop_settings

pytestmark = pytest.mark.django_db(transaction=True)


class ClaimsAtSend(Publisher):
    """The real publisher; each send notes (envelope id, its send_attempts in the database right then)."""

    def __init__(self, conf, connection):
        super().__init__(conf, connection)
        self.seen: list[tuple[int, int]] = []

    def send(self, chunk):
        claims = dict(
            DispatchEnvelope.objects.filter(pk__in=[e.envelope_id for e in chunk]).values_list("id", "send_attempts")
        )
        self.seen.extend((e.envelope_id, claims[e.envelope_id]) for e in chunk)
        return super().send(chunk)


def _announced(jobs) -> list[Claimed]:
    envelopes = DispatchEnvelope.objects.filter(job__in=jobs).order_by("id")
    return [Claimed(e.id, e.job_id, e.attempt, e.domain, e.queue, 0, True) for e in envelopes]


def _loop(redis_conn, **overrides):
    conf = loop_settings(**overrides)
    return DispatchLoop(conf, publisher=ClaimsAtSend(conf, redis_conn))


def _in_rq(redis_conn) -> int:
    return Queue("delivery", connection=redis_conn, serializer=JSONSerializer).count


def test_an_announced_envelope_is_sent_before_its_claim_and_marked_without_a_second_send(redis_conn):
    jobs = submit_many([("delivery", PAYLOADS["delivery"])] * 2)
    metrics = DispatchMetrics(database=False)
    loop = _loop(redis_conn)
    loop.observer = metrics
    loop.wake.announced.extend(_announced(jobs))
    try:
        result = loop.run_once(NOTIFY)
    finally:
        loop.close()
    ids = [e.envelope_id for e in _announced(jobs)]
    assert metrics.registry.get_sample_value("productflow_envelopes_sent_ahead_total") == 2
    # Each went out once, while the database still had it unclaimed.
    assert loop.publisher.seen == [(i, 0) for i in ids]
    assert (result.claimed, result.sent_ahead, result.dispatched, result.duplicates) == (2, 2, 2, 0)
    assert result.sends == 2, "sent ahead, not again after the claim"
    assert list(DispatchEnvelope.objects.filter(pk__in=ids).values_list("status", "send_attempts").distinct()) == [
        ("dispatched", 1)
    ]
    assert _in_rq(redis_conn) == 2
    assert not loop.wake.announced and not loop._sent_ahead


def test_with_send_announced_off_the_claim_comes_first(redis_conn):
    jobs = submit_many([("delivery", PAYLOADS["delivery"])])
    loop = _loop(redis_conn, SEND_ANNOUNCED=False)
    loop.wake.announced.extend(_announced(jobs))
    try:
        result = loop.run_once(NOTIFY)
    finally:
        loop.close()
    [envelope] = _announced(jobs)
    assert loop.publisher.seen == [(envelope.envelope_id, 1)]
    assert (result.claimed, result.sent_ahead, result.dispatched) == (1, 0, 1)
    assert not loop.wake.announced, "taken and dropped, not left to go stale"


def test_an_envelope_a_peer_claimed_first_is_sent_twice_but_queued_once(redis_conn):
    jobs = submit_many([("delivery", PAYLOADS["delivery"])])
    [envelope] = _announced(jobs)
    peer = claim_batch(10, 30.0)  # another dispatcher's claim, still sending
    assert [e.envelope_id for e in peer.envelopes] == [envelope.envelope_id]
    loop = _loop(redis_conn)
    loop.wake.announced.append(envelope)
    try:
        result = loop.run_once(NOTIFY)
        # The peer's send finds the job this loop sent ahead: a duplicate, not a second entry in the queue.
        again = loop.publisher.send(peer.envelopes)
    finally:
        loop.close()
    assert (result.claimed, result.sent_ahead, result.dispatched) == (0, 0, 0)
    assert not loop._sent_ahead, "forgotten once the drain is over"
    assert (again.sent, again.duplicates) == (0, 1)
    assert (result.sends, result.duplicates) == (1, 0), "this loop's one send, ahead"
    assert _in_rq(redis_conn) == 1
    assert DispatchEnvelope.objects.get(pk=envelope.envelope_id).lease_token == peer.token


def test_an_unregistered_domain_is_not_sent_ahead_and_the_claim_dead_letters_it(redis_conn):
    jobs = submit_many([("delivery", PAYLOADS["delivery"])])
    [envelope] = _announced(jobs)
    DispatchEnvelope.objects.filter(pk=envelope.envelope_id).update(domain="gone")
    loop = _loop(redis_conn)
    loop.wake.announced.append(Claimed(envelope.envelope_id, envelope.job_id, 1, "gone", "delivery", 0, True))
    try:
        result = loop.run_once(NOTIFY)
    finally:
        loop.close()
    assert loop.publisher.seen == []
    assert (result.claimed, result.sent_ahead, result.dead) == (1, 0, 1)
    assert _in_rq(redis_conn) == 0


def test_an_announcement_heard_after_the_claim_that_took_its_envelope_is_not_sent_again(redis_conn):
    # The listener hears a NOTIFY while a drain runs; that drain's claim already took and sent the envelope.
    jobs = submit_many([("delivery", PAYLOADS["delivery"])] * 3)
    metrics = DispatchMetrics(database=False)
    loop = _loop(redis_conn)
    loop.observer = metrics
    try:
        first = loop.run_once(NOTIFY)
        loop.wake.announced.extend(_announced(jobs))  # heard late, handed over with the next wake
        second = loop.run_once(NOTIFY)
    finally:
        loop.close()
    ids = [e.envelope_id for e in _announced(jobs)]
    assert (first.claimed, first.dispatched) == (3, 3)
    assert sorted(i for i, _ in loop.publisher.seen) == ids, "each envelope through the publisher once"
    assert (second.claimed, second.sends, second.duplicates) == (0, 0, 0)
    assert _in_rq(redis_conn) == 3
    sample = metrics.registry.get_sample_value
    assert (sample("productflow_envelope_sends_total"), sample("productflow_envelopes_dispatched_total")) == (3, 3)
    assert sample("productflow_envelope_send_duplicates_total") == 0


def test_a_wake_of_announcements_alone_all_marked_makes_no_claim(redis_conn):
    announced_jobs = submit_many([("delivery", PAYLOADS["delivery"])] * 2)
    # Committed without a word to this loop (as if its NOTIFY were lost): only a claim finds it.
    [silent] = submit_many([("delivery", PAYLOADS["delivery"])])
    loop = _loop(redis_conn)
    loop.wake.announced.extend(_announced(announced_jobs))
    loop.wake.set(NOTIFY, named=True)  # as the listener does for NOTIFYs that all named their envelopes
    try:
        skipped = loop.run_once(loop.wait())
        scanned = loop.run_once(NOTIFY)
    finally:
        loop.close()
    assert (skipped.claimed, skipped.sent_ahead, skipped.dispatched, skipped.claim_skipped) == (2, 2, 2, True)
    assert (scanned.claimed, scanned.dispatched, scanned.claim_skipped) == (1, 1, False)
    assert DispatchEnvelope.objects.get(job=silent).status == "dispatched"
    assert _in_rq(redis_conn) == 3


def test_an_announced_wake_whose_envelope_was_not_marked_still_claims(redis_conn):
    jobs = submit_many([("delivery", PAYLOADS["delivery"])] * 2)
    [first, second] = _announced(jobs)
    loop = _loop(redis_conn)
    # The second was claimed by this loop's previous drain: not sent ahead again, so the wake is not covered.
    loop.ahead.remember([(second.envelope_id, second.attempt)])
    loop.wake.announced.extend([first, second])
    loop.wake.set(NOTIFY, named=True)
    try:
        result = loop.run_once(loop.wait())
    finally:
        loop.close()
    assert (result.sent_ahead, result.claimed, result.claim_skipped) == (1, 2, False)
    assert _in_rq(redis_conn) == 2
