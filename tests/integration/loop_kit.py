"""Test doubles for driving the dispatch loop deterministically (real PostgreSQL and Redis underneath).

They only add signals a test can wait on; the wake, the publisher and the SQL are the real ones.
"""

from __future__ import annotations

import threading

from dispatch_app.config.settings import dispatch_settings
from dispatch_app.dispatch.wake import Wake
from dispatch_app.rq.publish import Publisher

NEVER = 3600.0  # a fallback tick that cannot fire during a test


def loop_settings(**overrides):
    # MARK_AHEAD_DELAY 0: a drain's marks are written before it returns, for the tests that are not about their
    # wait (test_mark_ahead_delay.py is, with a clock of its own).
    values = {"POLL_INTERVAL": NEVER, "LEASE_SECONDS": 30.0, "SEND_CONCURRENCY": 2, "MARK_AHEAD_DELAY": 0.0}
    values.update(overrides)
    return dispatch_settings(**values)


class Counted:
    """A condition a test can wait on until a counter reaches n."""

    def __init__(self):
        self._cond = threading.Condition()
        self.count = 0

    def bump(self) -> None:
        with self._cond:
            self.count += 1
            self._cond.notify_all()

    def wait_for(self, n: int, timeout: float = 10.0) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.count >= n, timeout), f"reached {self.count}, expected {n}"


class ObservedWake(Wake):
    """Counts the waits that found nothing pending: the loop is idle there."""

    def __init__(self):
        super().__init__()
        self.idle = Counted()

    def wait(self, timeout):
        if not self.is_set():
            self.idle.bump()
        return super().wait(timeout)


class DrainLog:
    """The loop's observer: every drain's result, in order."""

    def __init__(self):
        self.results = []
        self.drains = Counted()

    def drained(self, result) -> None:
        self.results.append(result)
        self.drains.bump()


class HeldPublisher(Publisher):
    """The real publisher, whose first send waits until the test releases it."""

    def __init__(self, conf, connection, *, on_first_send=None):
        super().__init__(conf, connection)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.on_first_send = on_first_send
        self._first = threading.Lock()
        self.sends = 0

    def send(self, chunk):
        first = self._first.acquire(blocking=False)
        self.sends += 1
        if first:
            if self.on_first_send is not None:
                self.on_first_send()
            self.entered.set()
            assert self.release.wait(30), "the test never released the held send"
        return super().send(chunk)
