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
from django.db import connection, connections, transaction

from dispatch_app import submit
from dispatch_app.dispatch.announced import parse
from dispatch_app.dispatch.arming import DISARM_AT_CLAIMED, REARM_AT_CLAIMED, Arming
from dispatch_app.dispatch.listener import Listener, listener_conninfo
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.dispatch.publisher import Publisher
from dispatch_app.models import DispatchEnvelope, NotifyArm
from dispatch_app.runtime.wake import CATCH_UP, HANDOVER, NOTIFY, POLL, STOP, Wake
from tests.factories import PAYLOADS
from tests.helpers import wait_until
from tests.integration.loop_kit import loop_settings
from tests.integration.test_notify import SENTINEL, listen, received_until_sentinel, sentinel  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


class HeldWriter(threading.Thread):
    """submit() in its own transaction, held open after the INSERT (its trigger has run) until released."""

    def __init__(self, isolation: str | None = None, before_insert: threading.Event | None = None):
        super().__init__(daemon=True)
        self.isolation = isolation
        self.before_insert = before_insert
        self.inserted = threading.Event()
        self.snapshot_taken = threading.Event()
        self.release = threading.Event()
        self.done = threading.Event()
        self.xid: str | None = None
        self.job = None
        self.error: BaseException | None = None

    def run(self):
        try:
            with transaction.atomic():
                if self.isolation:
                    with connection.cursor() as cursor:
                        cursor.execute(f"SET TRANSACTION ISOLATION LEVEL {self.isolation}")
                        cursor.execute("SELECT count(*) FROM dispatch_app_notifyarm")  # the snapshot is taken here
                    self.snapshot_taken.set()
                    assert self.before_insert.wait(10)
                self.job = submit("delivery", PAYLOADS["delivery"])
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_current_xact_id()::text")
                    self.xid = cursor.fetchone()[0]
                self.inserted.set()
                assert self.release.wait(10), "never released"
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self.error = exc
        finally:
            connections.close_all()
            self.done.set()

    def commit(self):
        self.release.set()
        assert self.done.wait(10)
        assert self.error is None, self.error


class Dispatcher:
    """A dispatch loop and its arming, driven from the test thread; optionally a real Listener on the same wake."""

    def __init__(self, redis_conn, *, listener: bool = False, clock=None):
        self.conf = loop_settings(BATCH_SIZE=10)
        self.wake = Wake()
        self.stop = threading.Event()
        self.listening = threading.Event()
        self.listener = None
        if listener:
            self.listener = Listener(self.conf, self.wake, self.stop)
            self.arming = self.wake.arming
        else:
            self.listening.set()
            kwargs = {"clock": clock} if clock else {}
            self.arming = Arming(self.conf, self.wake, listening=self.listening, stop=self.stop, **kwargs)
            self.wake.arming = self.arming
        self.loop = DispatchLoop(self.conf, wake=self.wake, stop=self.stop, publisher=Publisher(self.conf, redis_conn))

    def start_listening(self):
        self.listener.start()
        assert self.listener.connected.wait(10)
        assert self.wake.wait(10) == CATCH_UP

    def scan(self, trigger):
        return self.loop.run_once(trigger)

    def close(self):
        self.stop.set()
        self.wake.set(STOP)
        if self.listener is not None:
            assert self.listener.join(10)
        self.loop.close()


@pytest.fixture
def dispatcher(redis_conn):
    made = []

    def make(**kwargs):
        d = Dispatcher(redis_conn, **kwargs)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


def armed_rows() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM dispatch_app_notifyarm WHERE armed_until > clock_timestamp()")
        return cursor.fetchone()[0]


def status(job) -> str:
    return DispatchEnvelope.objects.get(job=job).status


def announced(listen, sentinel) -> list[str]:  # noqa: F811
    """The domains the commits so far announced: one per envelope a payload names (dispatch.announced)."""
    sentinel()
    got = []
    for payload in received_until_sentinel(listen)[:-1]:
        named = parse(payload)
        got.extend([e.domain for e in named] if named else [payload])
    return got


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


def test_a_busy_dispatcher_disarms_and_its_writers_stop_notifying(dispatcher, listen, sentinel):  # noqa: F811
    d = dispatcher(listener=True)
    d.start_listening()
    d.scan(CATCH_UP)
    assert d.wake.wait(0) == HANDOVER
    d.scan(HANDOVER)
    submit("delivery", PAYLOADS["delivery"])
    assert d.wake.wait(10) == NOTIFY
    for _ in range(DISARM_AT_CLAIMED - 1):
        submit("delivery", PAYLOADS["delivery"])  # arrive while the dispatcher "drains"
    wait_until(lambda: d.listener.notifications >= DISARM_AT_CLAIMED, 10, message="the other NOTIFYs")
    result = d.scan(NOTIFY)
    assert result.claimed == DISARM_AT_CLAIMED
    assert not d.arming.armed and armed_rows() == 0, "work keeps arriving faster than drains: disarmed"
    job = submit("delivery", PAYLOADS["delivery"])
    # The earlier commits were announced, this one was not: a busy dispatcher needs no announcements.
    assert announced(listen, sentinel) == ["delivery"] * DISARM_AT_CLAIMED
    # (The real listener hears the sentinel too; it collapses into the wake still pending.)
    wait_until(lambda: d.listener.notifications >= DISARM_AT_CLAIMED + 1, 10, message="the sentinel")
    assert d.wake.wait(0) == NOTIFY
    assert d.scan(NOTIFY).dispatched == 1
    assert status(job) == "dispatched"
    # Disarmed, it found one job: a quiet scan (a trickle or a gap). It scans again after a short linger
    # (no tick); a second quiet scan in a row and it arms.
    assert not d.arming.armed, "one quiet scan after work is only a gap"
    assert d.wake.wait(10) == POLL
    assert d.scan(POLL).claimed == 0
    assert d.arming.armed and armed_rows() == 1
    assert d.wake.wait(0) == HANDOVER


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


def test_a_drain_of_several_envelopes_disarms_and_polls_instead(dispatcher):
    d = dispatcher()
    d.arming.arm()
    assert d.wake.wait(0) == HANDOVER
    d.arming.drained(type("R", (), {"claimed": DISARM_AT_CLAIMED})())  # many commits since the last scan
    assert not d.arming.armed and armed_rows() == 0
    assert d.wake.wait(10) == POLL, "disarmed, it must scan again without a tick"


def drain(claimed: int, first: int | None = None):
    return type("R", (), {"claimed": claimed, "claimed_first": claimed if first is None else first})()


def test_a_disarmed_dispatcher_at_a_trickle_arms_again_but_not_while_busy(dispatcher):
    """Disarmed by a burst, then one job per linger (200/s): it must not stay a poller for good."""
    d = dispatcher()
    d.arming.arm()
    assert d.wake.wait(0) == HANDOVER
    d.arming.drained(drain(DISARM_AT_CLAIMED))  # the burst
    assert not d.arming.armed
    for claimed in (REARM_AT_CLAIMED + 1, REARM_AT_CLAIMED, REARM_AT_CLAIMED + 1, REARM_AT_CLAIMED):
        assert d.wake.wait(10) == POLL
        d.arming.drained(drain(claimed))
        assert not d.arming.armed, "busy scans between the quiet ones keep it polling"
    assert d.wake.wait(10) == POLL
    d.arming.drained(drain(REARM_AT_CLAIMED))  # the second quiet scan in a row
    assert d.arming.armed and armed_rows() == 1
    assert d.wake.wait(0) == HANDOVER


def test_redispatches_neither_disarm_nor_keep_a_dispatcher_polling(dispatcher):
    """A recovery storm's bursts are later attempts: only new work (first attempts) counts."""
    d = dispatcher()
    d.arming.arm()
    assert d.wake.wait(0) == HANDOVER
    d.arming.drained(drain(50, first=1))
    assert d.arming.armed and armed_rows() == 1, "a burst of re-dispatches must not disarm"
    d.arming.drained(drain(DISARM_AT_CLAIMED + 1, first=DISARM_AT_CLAIMED))
    assert not d.arming.armed
    for _ in range(2):
        assert d.wake.wait(10) == POLL
        d.arming.drained(drain(50, first=0))
    assert d.arming.armed, "scans that found only re-dispatches are quiet for new work"


def test_a_few_envelopes_per_drain_keep_the_dispatcher_armed(dispatcher):
    """A few hundred jobs/s: announcements are cheap for the writers and keep commit -> dispatched short."""
    d = dispatcher()
    d.arming.arm()
    assert d.wake.wait(0) == HANDOVER
    d.wake.set(NOTIFY)  # one more commit announced while it drained
    d.arming.drained(type("R", (), {"claimed": DISARM_AT_CLAIMED - 1})())
    assert d.arming.armed and armed_rows() == 1


def test_a_long_transaction_in_the_fence_blocks_nothing(dispatcher):
    d = dispatcher(listener=True)
    d.start_listening()
    with psycopg.connect(**listener_conninfo()) as long_one:
        xid = long_one.execute("SELECT pg_current_xact_id()::text").fetchone()[0]  # holds an xid, commits nothing
        assert d.scan(CATCH_UP).claimed == 0
        assert xid in d.arming.fence
        assert d.wake.wait(0) == HANDOVER
        d.scan(HANDOVER)
        # Armed while the fence stays open: a commit is announced and served at once.
        job = submit("delivery", PAYLOADS["delivery"])
        assert d.wake.wait(10) == NOTIFY
        assert d.scan(NOTIFY).dispatched == 1
        assert status(job) == "dispatched"
        assert xid in d.arming.fence
        long_one.rollback()
    # Its end is noticed by the fence check: one more scan, then the fence is closed.
    assert d.wake.wait(10) == HANDOVER
    assert d.arming.fence == []
