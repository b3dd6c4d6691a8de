"""Conditional NOTIFY: the hand-over between writers and an arming dispatcher, on committed transactions.

Every interleaving is driven step by step: the writer is a thread holding its
transaction open on an Event, the dispatcher is driven from the test thread
(run_once / wake.wait), a real Listener turns NOTIFY into wakes, and "nothing
was announced" is shown with a sentinel NOTIFY on a second LISTEN connection
(anything sent before it arrives before it). Bounded waits are safety nets only.
"""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection

from dispatch_app import submit
from dispatch_app.dispatch.listener import listener_conninfo
from dispatch_app.dispatch.wake import CATCH_UP, HANDOVER, NOTIFY, STOP
from dispatch_app.models import NotifyArm
from tests.factories import PAYLOADS
from tests.integration import arming_kit
from tests.integration.arming_kit import HeldWriter, announced, armed_rows, status
from tests.integration.dispatch.test_notify import SENTINEL, listen, sentinel  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def dispatcher(redis_conn):
    yield from arming_kit.dispatchers(redis_conn)


def test_with_no_dispatcher_armed_a_commit_announces_nothing(listen, sentinel):  # noqa: F811
    assert armed_rows() == 0
    submit("delivery", PAYLOADS["delivery"])
    assert announced(listen, sentinel) == []


def test_commit_before_the_arm_is_found_by_the_hand_over_scan(dispatcher, listen, sentinel):  # noqa: F811
    d = dispatcher()
    job = submit("delivery", PAYLOADS["delivery"])
    assert announced(listen, sentinel) == [], "nobody was armed: the writer must not notify"
    # The dispatcher was busy (disarmed); its last scan found nothing: it goes idle and arms.
    d.arming.drained(type("R", (), {"claimed": 0})())
    assert d.arming.armed and armed_rows() == 1
    assert d.wake.wait(0) == HANDOVER
    result = d.scan(HANDOVER)
    assert result.dispatched == 1 and result.unannounced == 0
    assert status(job) == "dispatched"


def test_commit_during_the_arm_is_found_when_the_fence_sees_it_end(dispatcher, listen, sentinel):  # noqa: F811
    d = dispatcher()
    writer = HeldWriter()
    writer.start()
    assert writer.inserted.wait(10)  # its trigger read "not armed"
    assert d.scan(CATCH_UP).claimed == 0  # idle: arms at the end of this drain
    assert d.arming.armed
    assert writer.xid in d.arming.fence, "a transaction in progress at the arm must be fenced"
    assert d.wake.wait(0) == HANDOVER
    assert d.scan(HANDOVER).claimed == 0, "the hand-over scan cannot see an uncommitted row"
    writer.commit()
    assert announced(listen, sentinel) == [], "its trigger ran before the arm: no NOTIFY"
    # No tick (an hour away): the fence check alone brings the scan that finds it.
    assert d.wake.wait(10) == HANDOVER
    result = d.scan(HANDOVER)
    assert result.dispatched == 1 and result.unannounced == 0
    assert status(writer.job) == "dispatched"
    assert d.arming.fence == []


def test_commit_after_the_arm_is_announced_and_wakes_the_listener(dispatcher):
    d = dispatcher(listener=True)
    d.start_listening()
    assert d.scan(CATCH_UP).claimed == 0
    assert d.arming.armed
    assert d.wake.wait(0) == HANDOVER
    assert d.scan(HANDOVER).claimed == 0
    job = submit("delivery", PAYLOADS["delivery"])
    assert d.wake.wait(10) == NOTIFY
    assert d.listener.notifications == 1
    assert d.scan(NOTIFY).dispatched == 1
    assert status(job) == "dispatched"
    assert d.arming.armed, "a lone job does not make the dispatcher busy"


def test_a_read_committed_writer_that_began_before_the_arm_and_inserts_after_it_notifies(
    dispatcher,
    listen,  # noqa: F811
    sentinel,  # noqa: F811
):
    d = dispatcher()
    go = threading.Event()
    writer = HeldWriter("READ COMMITTED", before_insert=go)
    writer.start()
    assert writer.snapshot_taken.wait(10)  # its transaction is open and has read the arm table: empty
    d.arming.arm()
    go.set()
    # Its trigger's query takes a fresh snapshot, which sees the arm.
    assert writer.inserted.wait(10)
    writer.commit()
    assert announced(listen, sentinel) == ["delivery"]


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_a_writer_on_an_older_snapshot_always_notifies(isolation, listen, sentinel):  # noqa: F811
    go = threading.Event()
    writer = HeldWriter(isolation, before_insert=go)
    writer.start()
    assert writer.snapshot_taken.wait(10)
    go.set()
    assert writer.inserted.wait(10)
    writer.commit()
    assert armed_rows() == 0
    assert announced(listen, sentinel) == ["delivery"], "its snapshot could predate any arm: it must announce"


def test_any_armed_dispatcher_suffices(dispatcher, listen, sentinel):  # noqa: F811
    busy, idle = dispatcher(), dispatcher()
    idle.arming.arm()
    busy.arming.arm()
    busy.arming.disarm()
    assert armed_rows() == 1
    submit("delivery", PAYLOADS["delivery"])
    assert announced(listen, sentinel) == ["delivery"]


def test_a_dead_dispatchers_arm_runs_out(dispatcher, listen, sentinel):  # noqa: F811
    d = dispatcher()
    d.arming.arm()
    submit("delivery", PAYLOADS["delivery"])
    assert announced(listen, sentinel) == ["delivery"]
    # It "dies" (no renewal) and its lease runs out on the database clock.
    NotifyArm.objects.filter(token=d.arming.token).update(armed_until="2000-01-01T00:00:00Z")
    submit("delivery", PAYLOADS["delivery"])
    assert announced(listen, sentinel) == []


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_lapsed_lease_is_a_fresh_arm_with_its_own_fence_and_hand_over(dispatcher):
    clock = Clock()
    d = dispatcher(clock=clock)
    d.arming.arm()
    assert d.wake.wait(0) == HANDOVER
    idle = type("R", (), {"claimed": 0})()
    # Half the lease later the renewal extends it: no new arm, no extra scan.
    clock.now += d.arming.lease * 0.6
    d.arming.drained(idle)
    assert d.arming.arms == 1 and not d.wake.is_set()
    # The host paused past the lease: the database already let it lapse; renewing is arming again.
    NotifyArm.objects.filter(token=d.arming.token).update(armed_until="2000-01-01T00:00:00Z")
    clock.now += d.arming.lease * 0.6
    d.arming.drained(idle)
    assert d.arming.arms == 2 and armed_rows() == 1
    assert d.wake.wait(0) == HANDOVER


def test_without_a_listener_connected_nobody_arms(dispatcher):
    d = dispatcher()
    d.listening.clear()
    d.scan(CATCH_UP)
    assert not d.arming.armed and armed_rows() == 0


def test_a_stop_disarms(dispatcher):
    d = dispatcher()
    d.arming.arm()
    assert armed_rows() == 1
    d.wake.wait(0)
    d.stop.set()
    d.wake.set(STOP)
    assert d.wake.wait(0) == STOP
    assert armed_rows() == 0


def test_the_fence_ignores_transactions_of_other_databases(dispatcher, settings):
    d = dispatcher()
    other = dict(listener_conninfo())
    other["dbname"] = connection.settings_dict["NAME"].removeprefix("test_")  # the non-test database
    with psycopg.connect(**other) as elsewhere, psycopg.connect(**listener_conninfo()) as here:
        far = elsewhere.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        near = here.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        d.arming.arm()
        assert near in d.arming.fence
        assert far not in d.arming.fence
        elsewhere.rollback()
        here.rollback()
