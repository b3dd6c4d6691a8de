"""Pause dispatch while Redis as a whole refuses: error classification and a circuit breaker with a probe.

A server-wide condition (out of memory under ``noeviction``, a read-only replica
after a failover, a dataset still loading, an ACL denial, no reachable master,
no connection at all) says nothing about the envelopes that happened to be in
flight: counting it against them dead-letters a healthy backlog within minutes.
So such an error opens the breaker: the dispatcher stops claiming, gives the
batch's envelopes back without counting the attempt, and after a backoff lets
one small batch through as the probe. Its success closes the breaker; its
failure doubles the backoff (up to a cap). Only an error that belongs to one
envelope counts toward MAX_SEND_ATTEMPTS.

The breaker lives on the dispatch loop's thread and reads an injected
monotonic clock, so tests drive it without sleeping.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from dispatch_app.rq.errors import UNREACHABLE, outage_reason

__all__ = ["CLOSED", "HALF_OPEN", "OPEN", "UNREACHABLE", "BreakerState", "CircuitBreaker", "outage_reason"]

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"

# What Redis as a whole refusing looks like (its error codes and redis-py's types) is the RQ door's: rq.errors.


@dataclass(frozen=True)
class BreakerState:
    """What the observers (heartbeat, metrics) are told after each drain."""

    state: str
    reason: str = ""
    error: str = ""
    paused_seconds: float = 0.0  # how long this pause has lasted (0 when closed)
    pauses: int = 0  # pauses started since the process started
    probe_in: float | None = None  # seconds until the next probe is let through (open only)


class CircuitBreaker:
    def __init__(self, base: float, cap: float, clock=time.monotonic):
        if base <= 0 or cap < base:
            raise ValueError(f"breaker backoff needs 0 < base <= cap, got base={base!r} cap={cap!r}")
        self.base = base
        self.cap = cap
        self.clock = clock
        self.state = CLOSED
        self.reason = ""
        self.error = ""
        self.backoff = 0.0
        self.opened_at: float | None = None
        self.retry_at = 0.0
        self.pauses = 0
        self.probes = 0

    def allow(self) -> bool:
        """May the loop claim now? Open: only once the backoff is over, and then as a probe (half-open)."""
        if self.state == OPEN:
            if self.clock() < self.retry_at:
                return False
            self.state = HALF_OPEN
            self.probes += 1
        return True

    @property
    def probing(self) -> bool:
        return self.state == HALF_OPEN

    def seconds_to_probe(self) -> float | None:
        if self.state != OPEN:
            return None
        return max(0.0, self.retry_at - self.clock())

    def failed(self, reason: str, error: str) -> float:
        """A server-wide error: open (or stay open, backing off further); returns the delay before the probe."""
        now = self.clock()
        if self.state == CLOSED:
            self.pauses += 1
            self.opened_at = now
            self.backoff = self.base
        else:
            self.backoff = min(self.backoff * 2, self.cap)
        self.state = OPEN
        self.reason, self.error = reason, error
        self.retry_at = now + self.backoff
        return self.backoff

    def succeeded(self) -> float:
        """Redis took a send: close. Returns how long the pause lasted (0 if there was none)."""
        if self.state == CLOSED:
            return 0.0
        paused = self.clock() - (self.opened_at or self.clock())
        self.state, self.backoff, self.opened_at = CLOSED, 0.0, None
        return paused

    def snapshot(self) -> BreakerState:
        if self.state == CLOSED:
            return BreakerState(CLOSED, pauses=self.pauses)
        return BreakerState(
            self.state,
            reason=self.reason,
            error=self.error,
            paused_seconds=self.clock() - (self.opened_at or self.clock()),
            pauses=self.pauses,
            probe_in=self.seconds_to_probe(),
        )
