"""Envelopes sent ahead of their claim are marked by one compare-and-set (claim.MARK_AHEAD_SQL), on real PostgreSQL.

No lease is ever taken for them; one a peer's claim holds is waited for and left to that peer; a paused domain's
stays pending for the claim after the resume.
"""

import threading
import time
import uuid

import psycopg
import pytest

from dispatch_app import submit
from dispatch_app.dispatch.listener import listener_conninfo
from dispatch_app.models import DispatchEnvelope, DomainPause, Job
from dispatch_app.store import claim
from dispatch_app.store.claim import CLAIM_SQL
from tests.factories import PAYLOADS
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _sent(*jobs) -> dict[int, tuple[int, float]]:
    now = time.monotonic()
    return {DispatchEnvelope.objects.get(job=job).pk: (1, now) for job in jobs}


def test_a_sent_ahead_envelope_is_marked_without_ever_being_leased():
    job = submit("delivery", PAYLOADS["delivery"])
    before = DispatchEnvelope.objects.get(job=job)
    latencies: list[float] = []

    assert claim.mark_ahead(_sent(job), latencies) == [before.pk]

    envelope = DispatchEnvelope.objects.get(job=job)
    assert (envelope.status, envelope.send_attempts, envelope.lease_token) == ("dispatched", 1, None)
    assert envelope.available_at == before.available_at, "no claim moved it to a lease's end"
    assert Job.objects.get(pk=job.pk).status == "queued"
    assert len(latencies) == 1 and latencies[0] >= 0
    assert claim.claim_batch(10, 30).envelopes == [], "nothing left for the claim"


def test_another_attempt_or_a_dispatched_envelope_is_not_marked():
    job = submit("delivery", PAYLOADS["delivery"])
    envelope_id = DispatchEnvelope.objects.get(job=job).pk
    assert claim.mark_ahead({envelope_id: (2, time.monotonic())}) == []
    assert claim.mark_ahead(_sent(job)) == [envelope_id]
    assert claim.mark_ahead(_sent(job)) == [], "marked once"
    assert DispatchEnvelope.objects.get(pk=envelope_id).send_attempts == 1


def test_a_paused_domains_envelope_stays_pending_for_the_claim_after_the_resume():
    job = submit("delivery", PAYLOADS["delivery"])
    DomainPause.objects.create(domain="delivery", reason="test")
    assert claim.mark_ahead(_sent(job)) == []
    assert DispatchEnvelope.objects.get(job=job).status == "pending"


def test_an_envelope_a_peers_uncommitted_claim_holds_is_waited_for_then_left_to_the_peer():
    job = submit("delivery", PAYLOADS["delivery"])
    sent = _sent(job)
    marked: list = []
    done = threading.Event()

    def mark() -> None:
        try:
            marked.append(claim.mark_ahead(sent))
        finally:
            from django.db import connection

            connection.close()
            done.set()

    with (
        psycopg.connect(**listener_conninfo()) as peer,
        psycopg.connect(**listener_conninfo(), autocommit=True) as observer,
    ):
        token = uuid.uuid4()
        peer.execute(
            CLAIM_SQL, {"limit": 10, "lease": 30, "token": token, "again_limit": 10, "writer_grace": 2.0}
        )  # left open
        thread = threading.Thread(target=mark)
        thread.start()
        # Bounded wait until the mark is blocked on the peer's row lock (a real lock wait, not a sleep). The
        # observer is in autocommit: inside a transaction pg_stat_activity is a snapshot taken at its first read.
        waiting = wait_until(
            lambda: observer.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ).fetchone()[0],
            timeout=10,
            interval=0.01,
            message="the mark to wait for the peer's row lock",
        )
        assert waiting == 1, "the mark waits for the peer's claim"
        assert not done.is_set()
        peer.commit()
        assert done.wait(10)
    thread.join(10)
    assert marked == [[]], "the peer's lease: not marked here"
    envelope = DispatchEnvelope.objects.get(job=job)
    assert (envelope.status, envelope.lease_token) == ("pending", token)
