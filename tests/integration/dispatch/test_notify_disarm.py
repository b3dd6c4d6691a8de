"""Conditional NOTIFY under load: a busy dispatcher disarms (its writers stop notifying) and polls, and arms again
when the work thins out; re-dispatches never count as new work.

Driven as in test_notify_arming.py (the harness is tests.integration.arming_kit): the dispatcher from the test
thread, a real Listener where the wake matters, a sentinel NOTIFY to show what was announced.
"""

from __future__ import annotations

import psycopg
import pytest

from dispatch_app import submit
from dispatch_app.dispatch.arming import DISARM_AT_CLAIMED, REARM_AT_CLAIMED
from dispatch_app.dispatch.listener import listener_conninfo
from dispatch_app.dispatch.wake import CATCH_UP, HANDOVER, NOTIFY, POLL
from tests.factories import PAYLOADS
from tests.helpers import wait_until
from tests.integration import arming_kit
from tests.integration.arming_kit import announced, armed_rows, status
from tests.integration.dispatch.test_notify import SENTINEL, listen, sentinel  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def dispatcher(redis_conn):
    yield from arming_kit.dispatchers(redis_conn)


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


def drain(claimed: int, first: int | None = None):
    return type("R", (), {"claimed": claimed, "claimed_first": claimed if first is None else first})()


def armed(dispatcher):
    """A dispatcher just armed, its hand-over scan taken from the wake."""
    d = dispatcher()
    d.arming.arm()
    assert d.wake.wait(0) == HANDOVER
    return d


def test_a_drain_of_several_envelopes_disarms_and_polls_instead(dispatcher):
    d = armed(dispatcher)
    d.arming.drained(drain(DISARM_AT_CLAIMED))  # many commits since the last scan
    assert not d.arming.armed and armed_rows() == 0
    assert d.wake.wait(10) == POLL, "disarmed, it must scan again without a tick"


def test_a_disarmed_dispatcher_at_a_trickle_arms_again_but_not_while_busy(dispatcher):
    """Disarmed by a burst, then one job per linger (200/s): it must not stay a poller for good."""
    d = armed(dispatcher)
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
    d = armed(dispatcher)
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
    d = armed(dispatcher)
    d.wake.set(NOTIFY)  # one more commit announced while it drained
    d.arming.drained(drain(DISARM_AT_CLAIMED - 1))
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
