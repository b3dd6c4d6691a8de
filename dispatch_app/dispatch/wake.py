"""The wake channel: capacity one.

Any number of signals between two scans collapse into one pending wake; a
signal that arrives during a scan causes exactly one more scan. That is enough
because the work itself is always found in the table, never in the signal.

With conditional NOTIFY (dispatch_app.dispatch.arming) the channel also carries
the dispatcher's side of the hand-over: ``drained()`` is called where a drain
ends, and while the arming owes a scan (an open fence, a busy dispatcher's
next poll) ``wait()`` asks it between short steps, so that scan happens
without waiting for the fallback tick.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from dispatch_app.config.loops import STOP, TICK  # every loop's two; the rest are the dispatch loop's own
from dispatch_app.config.tuning import ANNOUNCED_MAX

__all__ = ["CATCH_UP", "DUE", "HANDOVER", "MARK", "NOTIFY", "POLL", "STOP", "TICK", "Wake"]

NOTIFY = "notify"
CATCH_UP = "catch_up"
# Scans no NOTIFY announced, by design rather than by a missed wake-up: the scan
# that follows arming (HANDOVER), the scans of a busy, disarmed dispatcher (POLL)
# and the scan when something not yet claimable falls due (DUE).
HANDOVER = "handover"
POLL = "poll"
# A scan at the time the last claim said the next pending envelope falls due (a delayed
# submit, a backoff, a lease that ran out): time passing announces nothing.
DUE = "due"
# Not a scan: the time to mark what was sent ahead of its claim and left to gather (dispatch.announced,
# MARK_AHEAD_DELAY): one statement marks every envelope sent meanwhile.
MARK = "mark"


class Wake:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: str | None = None
        self.signals = 0  # how many set() calls, before collapsing (for metrics and tests)
        # Installed by the listener (dispatch_app.dispatch.arming.Arming): only a
        # dispatcher that hears NOTIFY has a reason to ask writers for it.
        self.arming = None
        # Envelopes a writer named in its NOTIFY, from the listener to the loop (dispatch.announced); deque
        # appends and pops are thread-safe. The bound only matters if the loop stalls: the oldest are dropped,
        # and the claim finds them.
        self.announced: deque = deque(maxlen=ANNOUNCED_MAX)
        self._named = False
        self.only_named = False  # of the wake the last wait() took (see set)

    def set(self, reason: str = NOTIFY, *, named: bool = False) -> None:
        """``named``: this signal is NOTIFYs that all named their envelopes, every one handed over in
        ``announced`` (the listener). When every signal of a wake was such, ``only_named`` says so after
        ``wait()``: the loop that sends and marks them all has no claim to make."""
        with self._cond:
            self.signals += 1
            # "Every signal named its envelopes" holds only while nothing else came.
            self._named = named and (self._pending is None or self._named)
            # A NOTIFY/catch-up reason wins over a tick: it says the work was announced.
            if self._pending is None or self._pending == TICK:
                self._pending = reason
            self._cond.notify_all()

    def wait(self, timeout: float | None) -> str:
        """Block until a wake or the timeout; take (clear) the pending wake and return its reason."""
        arming = self.arming
        if arming is None or arming.due_in() is None:
            with self._cond:
                if self._pending is None:
                    self._cond.wait(timeout)
                reason, self._pending = self._pending, None
                self.only_named, self._named = self._named and reason == NOTIFY, False
            if reason == STOP and arming is not None:
                arming.stopped()
            return reason or TICK
        return self._wait_for_arming(arming, timeout)

    def _wait_for_arming(self, arming, timeout: float | None) -> str:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            due = arming.due_in()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            step = due if left is None else (left if due is None else min(due, left))
            with self._cond:
                if self._pending is None:
                    self._cond.wait(step)
                reason, self._pending = self._pending, None
                self.only_named, self._named = self._named and reason == NOTIFY, False
            if reason is not None:
                if reason == STOP:
                    arming.stopped()
                return reason
            # Outside the lock: a fence check is a database round trip.
            if due is not None and (owed := arming.due()) is not None:
                return owed
            if left is not None and left <= 0:
                return TICK

    def drained(self, result) -> None:
        """The dispatch loop's drain ended (called on its thread): arm, renew or disarm."""
        if self.arming is not None:
            self.arming.drained(result)

    def is_set(self) -> bool:
        with self._cond:
            return self._pending is not None
