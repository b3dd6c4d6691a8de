"""What one drain of the dispatch loop did: counts for the metrics, the heartbeat, conditional NOTIFY and tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from dispatch_app.dispatch.breaker import CLOSED, BreakerState
from dispatch_app.dispatch.wake import TICK


@dataclass
class DrainResult:
    trigger: str = TICK
    batches: int = 0
    claimed: int = 0
    claimed_first: int = 0  # of those, first attempts (new work; the rest are re-dispatches)
    again_full: bool = False  # the last claim took its most re-dispatches (claim.AGAIN_PER_CLAIM): claim again
    dispatched: int = 0
    sends: int = 0  # envelopes Redis answered for (ahead of their claim or after it): > dispatched is waste
    duplicates: int = 0  # of those, sends that found the RQ job there already
    foreign: int = 0  # of those, sends that replaced a hash this deployment did not write (dispatch.foreign)
    failed: int = 0
    dead: int = 0
    released: int = 0
    lost_lease: int = 0
    unannounced: int = 0  # first sends found by a tick-triggered scan: a missed wake-up
    sent_ahead: int = 0  # claimed after their send: a writer named them in its NOTIFY (dispatch.announced)
    outage_released: int = 0  # given back uncounted: Redis as a whole refused (never dead-lettered)
    outage: str = ""  # why Redis as a whole refused this drain's sends (breaker.outage_reason), if it did
    # The breaker after this drain (set by run_once, for the heartbeat and the metrics).
    breaker: BreakerState = field(default_factory=lambda: BreakerState(CLOSED))
    claim_skipped: bool = False  # an announced-only wake whose envelopes were all sent ahead: no claim
    paused: bool = False  # nothing was claimed: the breaker is open and its probe is not due
    batch_sizes: list[int] = field(default_factory=list)
    # For the metrics (dispatch_app.housekeeping.metrics): outbox waits of the envelopes marked
    # dispatched (s, database clock), and host time spent getting a connection / claiming.
    latencies: list[float] = field(default_factory=list)
    connect_seconds: float = 0.0
    claim_seconds: float = 0.0
    # From the drain's last claim: seconds until the next pending envelope not yet claimable falls due.
    next_due_in: float | None = None

    def add(self, other: DrainResult) -> None:
        for name in (
            "batches",
            "claimed",
            "claimed_first",
            "dispatched",
            "sends",
            "duplicates",
            "foreign",
            "failed",
            "dead",
            "released",
            "lost_lease",
            "unannounced",
            "sent_ahead",
            "outage_released",
            "connect_seconds",
            "claim_seconds",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.outage = self.outage or other.outage
        self.batch_sizes.extend(other.batch_sizes)
        self.latencies.extend(other.latencies)
