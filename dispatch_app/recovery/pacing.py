"""Recovery paces its re-dispatches by the headroom new work has left at the workers.

Lanes (``dispatch_app.domains.lanes``) keep a recovered job from waiting in front of a
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
- otherwise: the share grows back by 5 % of the cap per second since the
  domain's last round, to the whole cap; for rounds closer together than
  ``RECOVERY_PACE_FLOOR_SECONDS`` that is scaled by period / floor seconds, so
  the recovered *rate* of a round per second grows no faster than a round per
  30 s's does (``regrowth``). With too little new work to judge, 5 % whatever
  the period: there is nobody to slow.

A domain's share starts at the floor when the process starts (a slow start), so
the quietest wait is one seen with little recovered work beside it.

The share never falls below ``RECOVERY_PACE_MIN_SHARE`` of the cap (at least one
job) per ``RECOVERY_PACE_FLOOR_SECONDS``, or per round when rounds are further
apart: under saturation recovery still re-dispatches that much, and the
worker's lane share (``RECOVERY_LANE_EVERY``) bounds how much of it runs in
front of new work. A round per second owes a fraction of a job per round; the
fractions add up, and a round owed none is not run (``RecoveryLoop``) unless a
run is stale. Pacing holds back work that never started: a stale run (most often
a killed worker's job) is looked at whatever the pacer says, since re-running it
gives the workers back the load they carried (``discovery.discover_paced``). When new
work first appears, every domain drops to its floor for ``probe_seconds``
before the quietest wait is taken (``_judge``). It looks at new work of every domain, because domains share
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

from dispatch_app.config.tuning import BASELINE_DRIFT, GROWTH_PER_SECOND, MIN_SAMPLES, QUANTILE, SAMPLE_SECONDS

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
    probing: bool = False  # at the floor while the quietest wait is measured (Pacer.probe_seconds)

    def describe(self) -> str:
        if self.probing:
            return f"paced to {self.limit} (at the floor while new work's quietest start wait is measured)"
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
        floor_seconds: float = 0.0,
        quantile: float = QUANTILE,
        start_share: float | None = None,
        probe_seconds: float = 0.0,
        measure: Callable[[float], Sample] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sample_seconds: float = SAMPLE_SECONDS,
    ):
        self.window = window
        self.tolerance = tolerance
        self.slack_ms = slack_ms
        self.min_share = min_share
        self.floor_seconds = floor_seconds
        self.quantile = quantile
        # A domain's share before its first round: the floor unless told (a slow start, see ``allowance``).
        self.start_share = min_share if start_share is None else start_share
        self._slow_start = start_share is None
        # When new work first appears, every domain drops to its floor this long before the first quietest wait is
        # taken: recovery ran at its cap while there was no new work to judge, and a quietest wait measured beside
        # that storm would let the storm go on (0: the first wait seen is the quietest).
        self.probe_seconds = probe_seconds
        self._probe_until: float | None = None
        self._measure = measure or functools.partial(measure_wait, quantile=quantile)
        self.clock = clock
        self.sample_seconds = sample_seconds
        self._lock = threading.Lock()
        self._sample: Sample | None = None
        self._sampled_at: float | None = None
        self._congested = False
        self.baseline_ms: float | None = None
        # domain -> (share of its cap, when last set, a floor's fraction of a job carried to the next round)
        self._shares: dict[str, tuple[float, float, float]] = {}

    @classmethod
    def from_settings(cls, conf) -> Pacer | None:
        if not conf.RECOVERY_PACING:
            return None
        return cls(
            window=conf.RECOVERY_PACE_WINDOW,
            tolerance=conf.RECOVERY_PACE_TOLERANCE,
            slack_ms=conf.RECOVERY_PACE_SLACK_MS,
            min_share=conf.RECOVERY_PACE_MIN_SHARE,
            floor_seconds=conf.RECOVERY_PACE_FLOOR_SECONDS,
            quantile=conf.RECOVERY_PACE_QUANTILE,
            # A window of waits seen with recovery at its floor, and a look to spare on each side.
            probe_seconds=conf.RECOVERY_PACE_WINDOW + 2 * SAMPLE_SECONDS,
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
            self._congested = self._judge(sample, now)
            return sample, self._congested

    def _probing(self, now: float) -> bool:
        return self.baseline_ms is None and self._probe_until is not None and now < self._probe_until

    def _judge(self, sample: Sample, now: float) -> bool:
        if sample.wait_ms is None or sample.count < MIN_SAMPLES:
            return False
        if self.baseline_ms is None and self.probe_seconds > 0:
            if self._probe_until is None:
                self._probe_until = now + self.probe_seconds
            if self._probing(now):
                return True
        if self.baseline_ms is None:
            self.baseline_ms = sample.wait_ms
        else:
            self.baseline_ms = min(self.baseline_ms * (1 + BASELINE_DRIFT), sample.wait_ms)
        return sample.wait_ms > self.baseline_ms * self.tolerance + self.slack_ms

    def lowest_share(self, cap: int, period: float | None) -> float:
        """The share of a round's cap the floor keeps: ``min_share`` of it (at least one job) per ``floor_seconds``,
        or per round when rounds are further apart. A round per second must not multiply what recovery sends while
        new work is slowed: at 10 % of 25, thirty times the floor of a round every 30 s (issue 30, fast@100)."""
        return max(self.min_share, 1.0 / cap) * self._per_floor(period)

    def regrowth(self, period: float | None, idle: bool = False) -> float:
        """The share of the cap a quiet second gives back. While there is new work to slow, rounds closer than
        ``floor_seconds`` are scaled like the floor: at 5 % of the cap a second, a round per second went from one job
        to four in three seconds, before the 5 s window showed what the first step did, and re-dispatched 49-102 jobs
        a minute per domain beside new work at 100/s (issue 30, fast@100 at 1.26-1.64x p99). ``idle``: no new work to
        judge, nobody to slow: the policy's rate comes back as fast as before."""
        return GROWTH_PER_SECOND * (1.0 if idle else self._per_floor(period))

    def _per_floor(self, period: float | None) -> float:
        if period is not None and 0 < period < self.floor_seconds:
            return period / self.floor_seconds
        return 1.0

    def allowance(self, domain: str, cap: int, period: float | None = None) -> Allowance:
        """How many jobs ``domain``'s round may re-dispatch now, of its per-round ``cap``; ``period``: the seconds
        between its rounds (None: the floor is per round)."""
        sample, congested = self._look()
        wait = None if sample is None else sample.wait_ms
        idle = wait is None or sample.count < MIN_SAMPLES
        if cap <= 0:  # MAX_REDISPATCHES_PER_ROUND = 0: report only, paced or not
            return Allowance(0, congested, wait, self.baseline_ms, self.quantile)
        lowest = self.lowest_share(cap, period)
        with self._lock:
            now = self.clock()
            # A domain's first round starts at the floor (a slow start): the first looks then see new work's wait
            # with little recovered work beside it, so the quietest wait is measured, not assumed, and the share
            # earns its way up. Starting at the whole cap made the quietest a storm's own wait.
            start = lowest if self._slow_start else self.start_share
            share, since, carried = self._shares.get(domain, (start, now, 0.0))
            probing = self._probing(now)
            if probing:
                share = lowest
            elif congested:
                share = max(lowest, share / 2)
            else:
                share = min(1.0, max(lowest, share) + self.regrowth(period, idle) * max(0.0, now - since))
            limit, carried = _jobs(cap, share, lowest, carried)
            self._shares[domain] = (share, now, carried)
        return Allowance(limit, congested, wait, self.baseline_ms, self.quantile, probing)


def _jobs(cap: int, share: float, lowest: float, carried: float) -> tuple[int, float]:
    """Whole jobs for a round at ``share`` of ``cap``, and the fraction carried to the next. A floor of a job or more
    per round is rounded up, as a share above it is down; below a job per round the fractions add up across rounds,
    so a floor of one job per 30 s at a round per second sends one job every 30th round."""
    exact = cap * share
    if exact >= 1 or cap * lowest >= 1 - 1e-9:
        return min(cap, max(math.ceil(cap * lowest - 1e-9), math.floor(exact))), 0.0
    carried += exact
    whole = math.floor(carried + 1e-9)
    return whole, carried - whole
