"""The wake channel: capacity one.

Any number of signals between two scans collapse into one pending wake; a
signal that arrives during a scan causes exactly one more scan. That is enough
because the work itself is always found in the table, never in the signal.
"""

from __future__ import annotations

import threading

NOTIFY = "notify"
TICK = "tick"
CATCH_UP = "catch_up"
STOP = "stop"


class Wake:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: str | None = None
        self.signals = 0  # how many set() calls, before collapsing (for metrics and tests)

    def set(self, reason: str = NOTIFY) -> None:
        with self._cond:
            self.signals += 1
            # A NOTIFY/catch-up reason wins over a tick: it says the work was announced.
            if self._pending is None or self._pending == TICK:
                self._pending = reason
            self._cond.notify_all()

    def wait(self, timeout: float | None) -> str:
        """Block until a wake or the timeout; take (clear) the pending wake and return its reason."""
        with self._cond:
            if self._pending is None:
                self._cond.wait(timeout)
            reason, self._pending = self._pending, None
        return reason or TICK

    def is_set(self) -> bool:
        with self._cond:
            return self._pending is not None
