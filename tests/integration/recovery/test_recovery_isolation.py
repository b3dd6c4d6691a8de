"""Isolation: one domain's recovery held inside its round holds only itself.

Dispatch is still woken by NOTIFY and by its tick, every other domain keeps
completing rounds, and on stop the held loop is the only one left behind, named.
All waiting is on Events; bounded waits are only a safety net.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from datetime import timedelta

import pytest

from dispatch_app import submit
from dispatch_app.config.settings import dispatch_settings
from dispatch_app.dispatch.wake import DUE, NOTIFY, TICK, Wake
from dispatch_app.domains import domain_keys
from dispatch_app.models import Job
from dispatch_app.recovery.loop import RecoveryLoop
from dispatch_app.recovery.round import RoundSignals
from dispatch_app.runtime.supervisor import Supervisor
from tests.factories import PAYLOADS
from tests.helpers import wait_until
from tests.integration.recovery_helpers import policy

pytestmark = pytest.mark.django_db(transaction=True)
SAFETY = 30
HELD = "image_series"


class SteerableTick(Wake):
    """The dispatch loop's wake, with the fallback tick's length in the test's hands."""

    tick_seconds = 3600.0  # phase 1: no tick can fire, only NOTIFY wakes dispatch

    def wait(self, timeout):
        return super().wait(self.tick_seconds)


class Observer:
    def __init__(self):
        self.lock = threading.Lock()
        self.drains: list[tuple[str, int]] = []

    def drained(self, result):
        with self.lock:
            self.drains.append((result.trigger, result.dispatched))

    def dispatched_by(self, trigger=None):
        """Jobs dispatched by drains of this trigger (of any, without one); a drain is seen once it returned,
        after its mark committed."""
        with self.lock:
            return sum(n for t, n in self.drains if trigger is None or t == trigger)

    def loop_tick(self, name):
        pass

    def loop_error(self, name, exc):
        pass

    def listener_reconnect(self):
        pass


def test_held_recovery_round_holds_only_itself(redis_conn, caplog):
    # Marks at once: which wake dispatched a job is read from the drain that marked it, and the tick that would end
    # a mark's wait (MARK_AHEAD_DELAY) is in this test's hands (test_mark_ahead_delay.py is about that wait).
    conf = dispatch_settings(MARK_AHEAD_DELAY=0.0)
    wake, observer = SteerableTick(), Observer()
    supervisor = Supervisor(conf, wake=wake, listen=True, observer=observer)
    held, release = threading.Event(), threading.Event()
    lock = threading.Lock()
    rounds_after_hold: Counter = Counter()

    def hold(found):
        held.set()
        release.wait(SAFETY)

    def count(result):
        if held.is_set():
            with lock:
                rounds_after_hold[result.domain] += 1

    for domain in domain_keys():
        signals = RoundSignals(after_discovery=hold if domain == HELD else None, finished=count)
        loop = RecoveryLoop(policy(domain, PERIOD_SECONDS=0.02), supervisor.stop, signals=signals, redis=redis_conn)
        supervisor.add_loop(loop, domain=domain)
    runners = {r.name: r for r in supervisor.runners}
    caplog.set_level(logging.ERROR, logger="dispatch_app.supervisor")

    supervisor.start()
    try:
        assert held.wait(SAFETY), "the held domain never started a round"
        assert supervisor.listener.connected.wait(SAFETY)
        # Writers announce work only once the idle dispatcher has armed (dispatch.arming).
        wait_until(lambda: supervisor.wake.arming.armed, SAFETY, message="the dispatcher to arm")

        # NOTIFY-woken dispatch (no tick can fire yet).
        first = submit("delivery", PAYLOADS["delivery"])
        wait_until(lambda: Job.objects.get(pk=first.pk).status == "queued", SAFETY, message="NOTIFY-woken dispatch")
        wait_until(lambda: observer.dispatched_by() == 1, SAFETY, message="the drain's result")
        assert observer.dispatched_by(NOTIFY) == 1 and observer.dispatched_by(TICK) == 0

        # Dispatch no NOTIFY woke: an envelope that becomes claimable after its NOTIFY was spent,
        # found when the claim said it falls due (or by the tick that runs at that moment).
        wake.tick_seconds = 0.05
        second = submit("workflow", PAYLOADS["workflow"], available_at=timedelta(seconds=0.3))
        wait_until(lambda: Job.objects.get(pk=second.pk).status == "queued", SAFETY, message="due-woken dispatch")
        wait_until(lambda: observer.dispatched_by() == 2, SAFETY, message="the drain's result")
        # Which wake found it is not this test's subject (test_due_wake's is): on a slow host a 50 ms tick's
        # drain can straddle the due time and claim it first. Either way no NOTIFY woke it.
        assert observer.dispatched_by(DUE) + observer.dispatched_by(TICK) == 1
        assert observer.dispatched_by(NOTIFY) == 1

        others = [d for d in domain_keys() if d != HELD]
        wait_until(lambda: all(rounds_after_hold[d] >= 2 for d in others), SAFETY, message="other domains' rounds")
        assert rounds_after_hold[HELD] == 0

        supervisor.request_stop()
        hung = supervisor.join(deadline=1.0)
        assert hung == [f"recovery-{HELD}"]
        assert f"loop recovery-{HELD} did not stop" in caplog.text
        assert all(not r.thread.is_alive() for name, r in runners.items() if name != f"recovery-{HELD}")
    finally:
        supervisor.request_stop()
        release.set()
        assert runners[f"recovery-{HELD}"].join(SAFETY), "the held loop did not exit after release"
        supervisor.dispatch.close()
    assert rounds_after_hold[HELD] == 1  # the held round finished, and no new one started after stop
