"""The per-domain recovery loop, run by ``runtime.runner.LoopRunner`` on its own thread.

It waits for its own period plus jitter (a fresh random share each time, so
dispatcher processes drift apart), then runs one round. It never continues on a
full batch: a round that reports ``has_more`` still waits a full period; the
dispatch loop is the one that drains. Clock, random source and the wait itself
are injectable, so tests drive it without sleeping.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from dispatch_app.config.loops import STOP, TICK
from dispatch_app.config.tuning import PACED_OUT_REPORT_EVERY
from dispatch_app.recovery import discovery
from dispatch_app.recovery.round import Round, RoundResult, RoundSignals

log = logging.getLogger("dispatch_app.recovery")


class RecoveryLoop:
    error_action = "recovery_error"  # the action of its failed rounds' log line (LoopRunner, runtime.incident)

    def __init__(
        self,
        policy,
        stop: threading.Event,
        *,
        clock: Callable[[], float] = time.monotonic,
        rand: random.Random | None = None,
        waiter: Callable[[float], bool] | None = None,
        signals: RoundSignals | None = None,
        redis=None,
        provider=None,
        pacer=None,
    ):
        self.policy = policy
        self.domain = policy.domain
        self.name = f"recovery-{policy.domain}"
        self.stop = stop
        self.clock = clock
        self.rand = rand or random.Random()
        # waiter(timeout) -> True when stopped; the default wakes at once on stop.
        self.waiter = waiter or stop.wait
        # A round's re-dispatches reach the workers over most of the period, not as one burst (SPREAD_SECONDS).
        self.round = Round(policy, redis=redis, provider=provider, signals=signals, spread_seconds=policy.round_spread)
        self.pacer = pacer  # recovery.pacing.Pacer, shared by the process's loops; None: the policy's cap alone
        self.round.log_failures = False  # its LoopRunner logs a failed round, once per incident
        self.rounds = 0
        self.busy = 0  # ticks skipped because another session ran this domain
        self.paced_out = 0  # ticks skipped because the pacer allowed no re-dispatch (a floor below a job per round)
        self.last: RoundResult | None = None
        # The current run of paced-out rounds: how many, since when, whether it was reported; the last report (clock()).
        self._held = 0
        self._held_since = 0.0
        self._held_reported: float | None = None
        self._held_told = False
        self.waits: list[float] = []  # the pauses asked for, newest last (tests, debugging)
        # The first round comes after a share of the jitter only: a restarted
        # process recovers at once, but several processes do not start in step.
        self._next_due = self.clock() + self._jitter()

    def _jitter(self) -> float:
        return self.rand.uniform(0, self.policy.jitter_seconds) if self.policy.jitter_seconds else 0.0

    def wait(self) -> str:
        pause = max(0.0, self._next_due - self.clock())
        self.waits.append(pause)
        if self.waiter(pause) or self.stop.is_set():
            return STOP
        return TICK

    def run_once(self, trigger: str = TICK) -> RoundResult:
        try:
            result = self._round()
        finally:
            # Due again one period after this round, full batch or not, paced out or not, error or not.
            self._next_due = self.clock() + self.policy.period_seconds + self._jitter()
        self.last = result
        if result.paced_out:
            self.paced_out += 1
            self._report_held(result)
            return result
        if self._held:
            self._report_resumed(result)
        if result.ran:
            self.rounds += 1
        else:
            self.busy += 1
        return result

    def _report_held(self, result: RoundResult) -> None:
        # A paced-out round writes no round row: without this line an operator reads "no round for minutes". At
        # most one a minute, across runs of held rounds too: a round per second at its floor is held out eleven
        # rounds in twelve, and a line pair per run would be noise.
        now = self.clock()
        if not self._held:
            self._held_since = now
        self._held += 1
        if self._held_reported is not None and now - self._held_reported < PACED_OUT_REPORT_EVERY:
            return
        self._held_reported = now
        self._held_told = True
        log.info(
            "%s: recovery held back, %s%s",
            self.domain,
            result.paced,
            f" ({self._held} rounds held out over {now - self._held_since:.0f} s so far)" if self._held > 1 else "",
            extra={"action": "recovery_paced_out", "domain": self.domain},
        )

    def _report_resumed(self, result: RoundResult) -> None:
        if self._held_told:  # a run of held rounds nobody was told of ends silently too
            # A busy round: this process's pacer let go, but the round was another session's (recover --once, a
            # second dispatcher), so "resumed" would claim a round this process did not run.
            how = "resumed" if result.ran else "no longer held back here (this round ran in another session)"
            log.info(
                "%s: recovery %s after %d round(s) held out over %.0f s",
                self.domain,
                how,
                self._held,
                self.clock() - self._held_since,
                extra={"action": "recovery_resumed", "domain": self.domain},
            )
        self._held = 0
        self._held_told = False

    def _round(self) -> RoundResult:
        if self.pacer is None:
            return self.round.run_once()
        pace = self.pacer.allowance(self.domain, self.policy.redispatch_cap, self.policy.period_seconds)
        self.round.pace = pace
        if pace.limit == 0 < self.policy.redispatch_cap and not discovery.stale_runs(self.policy):
            # New work is slowed and this round's floor is a fraction of a job: not even a look at the candidates
            # (a round's reads and record cost new work CPU too). A stale run is not paced (discover_paced).
            return RoundResult(self.domain, ran=False, paced_out=True, has_more=True, paced=pace.describe())
        return self.round.run_once()
