"""Recovery paces its re-dispatches by the headroom new work has left at the workers.

Lanes (``dispatch_app.lanes``) keep a recovered job from waiting in front of a
new one inside a worker, but recovered jobs still use CPU, and a worker process
running a recovery storm of four domains slows the delivery worker beside it on
the same host. Only recovery itself can give that CPU back: by sending less.

So each recovery loop asks its process's ``Pacer`` how many jobs its round may
re-dispatch. The pacer looks at where the user feels it: new work's wait from
commit (or from its due time) to its first line, at ``RECOVERY_PACE_QUANTILE``
(the 99th percentile by default) over the first attempts dispatched in the last
``RECOVERY_PACE_WINDOW`` seconds (jobs still waiting count with their wait so
far), on PostgreSQL's clock. It compares it with the
quietest such wait it has seen (a baseline that drifts up slowly, so a load
that became heavier for good is accepted within minutes):

- above ``baseline x RECOVERY_PACE_TOLERANCE + RECOVERY_PACE_SLACK_MS``: new
  work is being slowed, and the domain's share of its per-round cap is halved;
- otherwise (or with too little new work to judge): the share grows back by
  5 % of the cap per second since the domain's last round, to the whole cap.

A domain's share starts at the floor when the process starts (a slow start), so
the quietest wait is one seen with little recovered work beside it.

The share never falls below ``RECOVERY_PACE_MIN_SHARE`` of the cap (at least one
job): under saturation recovery still re-dispatches that much per round, and
the worker's lane share (``RECOVERY_LANE_EVERY``) bounds how much of it runs in
front of new work. It looks at new work of every domain, because domains share
hosts and a storm in one slows the others. One look serves every domain's loop
of the process within ``SAMPLE_SECONDS``. ``recover --once`` is not paced: an
operator who runs it wants the batch now.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import Error, connection

from dispatch_app.tuning import BASELINE_DRIFT, GROWTH_PER_SECOND, MIN_SAMPLES, QUANTILE, SAMPLE_SECONDS

log = logging.getLogger("dispatch_app.recovery")


# First attempts whose envelope was marked dispatched within the window (index envelope_status_dispatched),
# with their job's start: the attempts table has no row for a job still waiting, the job row has. Its due
# time, when later than its creation (a scheduled submit), is only in the attempts table. The clock is
# read once (a sub-select), so the window is an index range.
WAIT_SQL = """
SELECT count(*),
       percentile_cont(%(q)s) WITHIN GROUP (
           ORDER BY extract(epoch FROM coalesce(j.started_at, c.now) - greatest(e.created_at, a.due_at))
       )
FROM (SELECT clock_timestamp() AS now) c
JOIN dispatch_app_dispatchenvelope e
  ON e.status = 'dispatched' AND e.dispatched_at > c.now - make_interval(secs => %(window)s) AND e.attempt = 1
JOIN dispatch_app_job j ON j.id = e.job_id AND j.attempt = 1
LEFT JOIN dispatch_app_jobattempt a ON a.job_id = e.job_id AND a.attempt = 1
"""


@dataclass(frozen=True)
class Sample:
    count: int
    wait_ms: float | None  # the window's QUANTILE of new work's commit -> start; None: no first attempt in it


def measure_wait(window: float, quantile: float = QUANTILE) -> Sample:
    """New work's wait at the workers over the last ``window`` seconds (database clock), at ``quantile``."""
    with connection.cursor() as cursor:
        cursor.execute(WAIT_SQL, {"q": quantile, "window": window})
        count, wait = cursor.fetchone()
    return Sample(int(count), None if wait is None else float(wait) * 1000.0)


@dataclass(frozen=True)
class Allowance:
    limit: int  # re-dispatches this round may make
    congested: bool
    wait_ms: float | None
    baseline_ms: float | None
    quantile: float  # the Pacer's: no default, so a description never names a quantile nobody measured

    def describe(self) -> str:
        if self.wait_ms is None or self.baseline_ms is None:
            return f"paced to {self.limit}"
        state = "new work slowed" if self.congested else "headroom"
        return (
            f"paced to {self.limit} ({state}: new work's p{self.quantile * 100:g} start wait {self.wait_ms:.1f} ms, "
            f"quietest {self.baseline_ms:.1f} ms)"
        )


class Pacer:
    """One per process, shared by its domains' recovery loops (thread-safe)."""

    def __init__(
        self,
        *,
        window: float,
        tolerance: float,
        slack_ms: float,
        min_share: float,
        quantile: float = QUANTILE,
        start_share: float | None = None,
        measure: Callable[[float], Sample] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sample_seconds: float = SAMPLE_SECONDS,
    ):
        self.window = window
        self.tolerance = tolerance
        self.slack_ms = slack_ms
        self.min_share = min_share
        self.quantile = quantile
        # A domain's share before its first round: the floor unless told (a slow start, see ``allowance``).
        self.start_share = min_share if start_share is None else start_share
        self._measure = measure or functools.partial(measure_wait, quantile=quantile)
        self.clock = clock
        self.sample_seconds = sample_seconds
        self._lock = threading.Lock()
        self._sample: Sample | None = None
        self._sampled_at: float | None = None
        self._congested = False
        self.baseline_ms: float | None = None
        self._shares: dict[str, tuple[float, float]] = {}  # domain -> (share of its cap, when last set)

    @classmethod
    def from_settings(cls, conf) -> Pacer | None:
        if not conf.RECOVERY_PACING:
            return None
        return cls(
            window=conf.RECOVERY_PACE_WINDOW,
            tolerance=conf.RECOVERY_PACE_TOLERANCE,
            slack_ms=conf.RECOVERY_PACE_SLACK_MS,
            min_share=conf.RECOVERY_PACE_MIN_SHARE,
            quantile=conf.RECOVERY_PACE_QUANTILE,
        )

    def _look(self) -> tuple[Sample | None, bool]:
        """The shared sample, fresh within ``sample_seconds``; a failed look is no evidence of congestion."""
        with self._lock:
            now = self.clock()
            if self._sampled_at is not None and now - self._sampled_at < self.sample_seconds:
                return self._sample, self._congested
            self._sampled_at = now
            try:
                sample = self._measure(self.window)
            except Error:
                # The round meets the broken database itself and reports it; pacing must not hide that.
                log.warning(
                    "recovery pacing could not read new work's wait; pacing by the last look",
                    exc_info=True,
                    extra={"action": "recovery_pace_error", "domain": "*"},
                )
                return self._sample, self._congested
            self._sample = sample
            self._congested = self._judge(sample)
            return sample, self._congested

    def _judge(self, sample: Sample) -> bool:
        if sample.wait_ms is None or sample.count < MIN_SAMPLES:
            return False
        if self.baseline_ms is None:
            self.baseline_ms = sample.wait_ms
        else:
            self.baseline_ms = min(self.baseline_ms * (1 + BASELINE_DRIFT), sample.wait_ms)
        return sample.wait_ms > self.baseline_ms * self.tolerance + self.slack_ms

    def allowance(self, domain: str, cap: int) -> Allowance:
        """How many jobs ``domain``'s round may re-dispatch now, of its per-round ``cap``."""
        sample, congested = self._look()
        floor = min(cap, max(1, math.ceil(cap * self.min_share)))
        with self._lock:
            now = self.clock()
            # A domain's first round starts at the floor (a slow start): the first looks then see new work's wait
            # with little recovered work beside it, so the quietest wait is measured, not assumed, and the share
            # earns its way up. Starting at the whole cap made the quietest a storm's own wait.
            share, since = self._shares.get(domain, (self.start_share, now))
            if congested:
                share = max(self.min_share, share / 2)
            else:
                share = min(1.0, share + GROWTH_PER_SECOND * max(0.0, now - since))
            self._shares[domain] = (share, now)
        limit = max(floor, min(cap, math.floor(cap * share)))
        wait = None if sample is None else sample.wait_ms
        return Allowance(limit, congested, wait, self.baseline_ms, self.quantile)
