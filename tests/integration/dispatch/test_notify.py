"""NOTIFY from the envelope trigger: delivered after commit, never before, never after rollback.

"Not before" is shown without waiting for silence: a sentinel NOTIFY committed by a
third connection while the business transaction is still open arrives first; anything
the trigger had sent early would have to arrive before it.
"""

import threading
import uuid
from contextlib import contextmanager

import psycopg
import pytest
from django.db import transaction

import dispatch_app.store.arms as arms
from dispatch_app import submit, submit_many
from dispatch_app.config.settings import NOTIFY_CHANNEL, dispatch_settings
from dispatch_app.config.tuning import ANNOUNCE_MAX_ROWS
from dispatch_app.dispatch import announced
from dispatch_app.dispatch.listener import Listener, listener_conninfo
from dispatch_app.dispatch.wake import CATCH_UP, HANDOVER, NOTIFY, Wake
from dispatch_app.models import DispatchEnvelope, DomainPause
from dispatch_app.store.claim import Claimed
from tests.factories import PAYLOADS

pytestmark = pytest.mark.django_db(transaction=True)

SENTINEL = "sentinel"


@pytest.fixture
def listen():
    conn = psycopg.connect(autocommit=True, **listener_conninfo())
    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
    yield conn
    conn.close()


@pytest.fixture
def armed():
    """A dispatcher armed (dispatch.arming): only then do writers announce their commits."""

    with psycopg.connect(autocommit=True, **listener_conninfo()) as conn:
        conn.execute(arms.ARM_SQL, {"token": uuid.uuid4(), "process": "test", "lease": 3600})


@pytest.fixture
def sentinel():
    conn = psycopg.connect(autocommit=True, **listener_conninfo())

    def send():
        conn.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, SENTINEL])

    yield send
    conn.close()


def received_until_sentinel(conn) -> list[str]:
    """Payloads received up to and including the sentinel (bounded: 10s)."""
    got = []
    for note in conn.notifies(timeout=10):
        got.append(note.payload)
        if note.payload == SENTINEL:
            break
    assert got and got[-1] == SENTINEL, f"sentinel never arrived: {got}"
    return got


def test_nothing_before_commit_then_one_notification_per_domain_after(armed, listen, sentinel):
    with transaction.atomic():
        # More than a small insert: announced by domain, not envelope by envelope.
        submit_many([("delivery", PAYLOADS["delivery"])] * ANNOUNCE_MAX_ROWS + [("workflow", PAYLOADS["workflow"])])
        sentinel()
        assert received_until_sentinel(listen) == [SENTINEL]
    sentinel()
    # Identical payloads within one transaction are merged: one per domain.
    assert sorted(received_until_sentinel(listen)) == sorted(["delivery", "workflow", SENTINEL])


def _as_announced(jobs) -> list[Claimed]:
    envelopes = DispatchEnvelope.objects.filter(job__in=jobs).order_by("id")
    return [Claimed(e.id, e.job_id, e.attempt, e.domain, e.queue, 0, True) for e in envelopes]


def test_a_small_insert_names_its_envelopes_in_one_payload(armed, listen, sentinel):
    jobs = submit_many([("delivery", PAYLOADS["delivery"]), ("workflow", PAYLOADS["workflow"])])
    sentinel()
    payload, end = received_until_sentinel(listen)
    assert end == SENTINEL and payload.startswith(announced.PREFIX)
    assert announced.parse(payload) == _as_announced(jobs)


def test_a_paused_domains_envelope_is_announced_by_domain_only(armed, listen, sentinel):
    DomainPause.objects.create(domain="workflow")
    jobs = submit_many([("delivery", PAYLOADS["delivery"]), ("workflow", PAYLOADS["workflow"])])
    sentinel()
    got = received_until_sentinel(listen)
    [listed] = [p for p in got if p.startswith(announced.PREFIX)]
    assert announced.parse(listed) == _as_announced(jobs[:1])
    assert sorted(p for p in got if p != listed) == sorted(["workflow", SENTINEL])


def test_nothing_after_rollback(armed, listen, sentinel):
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        submit("delivery", PAYLOADS["delivery"])
        raise Abort
    sentinel()
    assert received_until_sentinel(listen) == [SENTINEL]


def test_a_delayed_envelope_still_notifies_on_commit(armed, listen, sentinel):
    from datetime import timedelta

    submit("delivery", PAYLOADS["delivery"], available_at=timedelta(hours=1))
    sentinel()
    assert received_until_sentinel(listen) == ["delivery", SENTINEL]


@contextmanager
def idle_listener():
    """A real listener, connected, past its catch-up scan, its dispatcher idle and armed: (listener, wake)."""
    conf = dispatch_settings(LISTEN_TIMEOUT=0.1)
    wake, stop = Wake(), threading.Event()
    listener = Listener(conf, wake, stop)
    listener.start()
    try:
        assert listener.connected.wait(10)
        # LISTEN first, then look: the first wake is the catch-up scan.
        assert wake.wait(10) == CATCH_UP
        # The dispatcher goes idle: it arms (dispatch.arming) and scans once more.
        wake.arming.arm()
        assert wake.wait(0) == HANDOVER
        yield listener, wake
    finally:
        stop.set()
        assert listener.join(10)


def test_the_listener_requests_a_catch_up_scan_then_wakes_on_each_commit():
    with idle_listener() as (listener, wake):
        job = submit("delivery", PAYLOADS["delivery"])
        assert wake.wait(10) == NOTIFY
        assert wake.only_named, "the commit named its envelope: the loop may skip its claim once it marked it"
        assert listener.notifications == 1
        # The envelope the commit named is handed to the loop with the wake (dispatch.announced).
        assert announced.take(wake.announced) == _as_announced([job])
        # A payload that starts like a list but is not one: said so, and the wake still comes.
        with psycopg.connect(autocommit=True, **listener_conninfo()) as conn:
            conn.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, "+[[1, 2]"])
        assert wake.wait(10) == NOTIFY
        assert (listener.notifications, listener.bad_payloads, list(wake.announced)) == (2, 1, [])


def test_a_domain_payload_among_announcements_makes_the_wake_a_scan():
    with idle_listener() as (listener, wake):
        submit("delivery", PAYLOADS["delivery"])
        with psycopg.connect(autocommit=True, **listener_conninfo()) as conn:
            conn.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, "delivery"])  # "worth a scan"
        # Bounded: both notifications heard, in one wake or two; a scan is asked for either way.
        named = [(wake.wait(10), wake.only_named)]
        while listener.notifications < 2 and len(named) < 5:
            named.append((wake.wait(10), wake.only_named))
        assert listener.notifications == 2
        assert named[-1] == (NOTIFY, False)
