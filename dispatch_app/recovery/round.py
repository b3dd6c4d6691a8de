"""One recovery round of one domain: discover, re-read, then look and decide per candidate, then act.

The round holds a session-level advisory lock for its domain, so at most one
round per domain runs at a time across every dispatcher process (and ``recover
--once``); a round that finds the lock taken does nothing and says so. The
candidates are re-read without a lock (one snapshot for the round), each one's
evidence (Redis, the vendor) gathered outside any transaction, and only the
actions take the jobs' row locks, in one short transaction that first checks
each is unchanged since the re-read: a worker finishing a job never waits behind
a slow vendor or Redis. A round's record (``RecoveryRound``) is written when it
starts and when it ends.

A candidate whose handling raises is counted (``errors``), recorded in its
history (``recovery_error``) and backed off: its ``updated_at`` moves to now, so
it goes to the back of ``ORDER BY updated_at, id`` and is not a candidate again
before its stale threshold. Bad candidates never take every slot of a round.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from django.db import InterfaceError, OperationalError, connection, transaction

import dispatch_app.config.failpoints as failpoints
import dispatch_app.recovery.decide as decisions
import dispatch_app.recovery.discovery as discovery
import dispatch_app.recovery.evidence as evidence
import dispatch_app.store.api as store
from dispatch_app.recovery.apply import ROUND_FATAL, Actions, Planned
from dispatch_app.recovery.event_kinds import ERROR_EVENT
from dispatch_app.recovery.result import CandidateReport, RoundResult

log = logging.getLogger("dispatch_app.recovery")

# Advisory locks are keyed (namespace, hashtext(domain)); the namespace keeps ours apart.
LOCK_NAMESPACE = 0x5046_5231  # "PFR1"


@dataclass
class RoundSignals:
    """Test seams: called on the round's thread (a test can block in them)."""

    after_discovery: Callable[[discovery.Discovery], None] | None = None
    finished: Callable[[RoundResult], None] | None = None


def process_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def try_domain_lock(domain: str) -> bool:
    """Non-blocking: another session's round of this domain means we skip, never wait."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", [LOCK_NAMESPACE, domain])
        return bool(cursor.fetchone()[0])


def release_domain_lock(domain: str) -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", [LOCK_NAMESPACE, domain])
    except (OperationalError, InterfaceError):
        pass  # the session is gone, and its locks with it


class Round:
    def __init__(
        self,
        policy,
        *,
        redis=None,
        provider=None,
        dry_run: bool = False,
        process: str | None = None,
        signals: RoundSignals | None = None,
        spread_seconds: float = 0.0,
    ):
        self.policy = policy
        self.domain = policy.domain
        self._redis = redis
        self._provider = provider
        self.dry_run = dry_run
        self.process = process or process_name()
        self.signals = signals or RoundSignals()
        self.actions = Actions(self.domain, self._failed, spread_seconds=spread_seconds)
        # A loop's runner logs the failure of a round once per incident (runtime.incident); ``recover --once`` has
        # no runner, so by default the round logs its own.
        self.log_failures = True
        # The pacer's word for the next round (recovery.pacing.Allowance): its cap, below the policy's.
        self.pace = None

    @property
    def redis(self):
        if self._redis is None:
            from dispatch_app.rq.servers import domain_connection

            # Evidence is read where the domain's queue lives (its RQ_QUEUES entry).
            self._redis = domain_connection(self.domain)
        return self._redis

    @property
    def provider(self):
        if self._provider is not None:
            return self._provider
        from dispatch_app.domains.providers import get_provider

        return get_provider()

    def run_once(self) -> RoundResult:
        result = RoundResult(self.domain, dry_run=self.dry_run)
        if self.pace is not None:
            result.paced = self.pace.describe()
        if not try_domain_lock(self.domain):
            result.ran = False
            log.debug(
                "%s: another session is running this domain's round; skipping this tick",
                self.domain,
                extra={"action": "recovery_busy", "domain": self.domain},
            )
            return result
        try:
            self._run(result)
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
            if self.log_failures:
                log.exception(
                    "%s: recovery round failed", self.domain, extra={"action": "recovery_error", "domain": self.domain}
                )
            self._record(result, final=True)
            raise
        finally:
            release_domain_lock(self.domain)
            if self.signals.finished is not None:
                self.signals.finished(result)
        return result

    def _run(self, result: RoundResult) -> None:
        self._record(result, final=False)
        failpoints.hit(f"recovery_round_{self.domain}")
        found = self._discover()
        result.has_more = found.has_more
        result.oldest_candidate_age = found.oldest_age
        if self.signals.after_discovery is not None:
            self.signals.after_discovery(found)
        states = self._reread(found)
        planned: list[Planned] = []
        try:
            for candidate in found.candidates:
                report = CandidateReport(candidate.job_id, candidate.status, candidate.attempt, candidate.age_seconds)
                result.candidates.append(report)
                result.scanned += 1
                try:
                    step = self._look(candidate, states, report, result, planned)
                except ROUND_FATAL:
                    raise
                except Exception as exc:
                    self._failed(candidate, report, result, exc)
                    continue
                if step is not None:
                    planned.append(step)
        except ROUND_FATAL:
            self.actions.act_before_leaving(planned, result)
            raise
        self.actions.act_all(planned, result)
        self._record(result, final=True)
        acted = result.redispatched or result.unknown or result.failed or result.errors
        level = logging.INFO if acted else logging.DEBUG
        errors = (f"; first: job {c.job_id}: {c.reason}" for c in result.candidates if c.outcome == "error")
        first_error = next(errors, "")
        log.log(
            level,
            "%s: round scanned %d, re-dispatched %d, left alone %d, unknown %d, failed %d, skipped %d, errors %d%s%s%s",
            self.domain,
            result.scanned,
            result.redispatched,
            result.left_alone,
            result.unknown,
            result.failed,
            result.skipped,
            result.errors,
            ", has more" if result.has_more else "",
            f"; {result.paced}" if result.paced else "",
            first_error,
            extra={"action": "recovery_round", "domain": self.domain},
        )

    def _back_off(self, candidate, report: CandidateReport, result: RoundResult) -> None:
        """To the back of the discovery order, with the error in the job's history (not in a dry run)."""
        if self.dry_run:
            return
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                if store.touch(cursor, candidate.job_id, candidate.attempt, unfinished_only=True):
                    store.record_event(
                        candidate.job_id,
                        candidate.attempt,
                        ERROR_EVENT,
                        reason=f"recovery could not handle this job: {report.reason}; backed off until it is "
                        "stale again",
                        data={"round": result.round_id},
                    )
        except ROUND_FATAL:
            raise
        except Exception:
            log.exception(
                "%s: backing off job %s failed",
                self.domain,
                candidate.job_id,
                extra={"action": "recovery_error", "domain": self.domain},
            )

    def _reread(self, found: discovery.Discovery) -> dict | None:
        """The round's candidates from one snapshot; None: each is re-read on its own (its error stays its own)."""
        try:
            return discovery.reread_many([c.job_id for c in found.candidates])
        except ROUND_FATAL:
            raise
        except Exception:
            log.exception(
                "%s: re-reading the round's candidates together failed; re-reading them one by one",
                self.domain,
                extra={"action": "recovery_error", "domain": self.domain},
            )
            return None

    def _failed(self, candidate, report: CandidateReport, result: RoundResult, exc: Exception) -> None:
        result.errors += 1
        report.outcome, report.reason = "error", f"{type(exc).__name__}: {exc}"
        log.error(
            "%s: recovering job %s failed",
            self.domain,
            candidate.job_id,
            exc_info=exc,
            extra={"action": "recovery_error", "domain": self.domain},
        )
        self._back_off(candidate, report, result)

    def _look(
        self, candidate, states: dict | None, report: CandidateReport, result: RoundResult, planned
    ) -> Planned | None:
        """Re-read (from the round's snapshot), gather the evidence, decide: what to do, not done yet."""
        got = discovery.reread(candidate.job_id) if states is None else states.get(candidate.job_id)
        if got is None:
            result.skipped += 1
            report.outcome, report.reason = "moved", "the job no longer exists"
            return None
        state, now = got
        if discovery.moved(candidate, state):
            # Not an order: a worker or a user moved it since discovery. Not touched.
            result.skipped += 1
            report.outcome = "moved"
            report.reason = f"moved since discovery: now {state.status}, attempt {state.attempt}"
            return None
        # Network calls, no transaction open: nothing waits on us while Redis or the vendor is slow.
        seen = evidence.gather(state, self.policy, self.redis, self.provider)
        decision = decisions.decide(state, seen, self.policy, now)
        report.decision, report.reason, report.evidence = decision.kind, decision.reason, seen.as_dict()
        if state.in_doubt:
            report.evidence["calls_in_doubt"] = [call.as_dict() for call in state.in_doubt]
        if self.dry_run:
            report.outcome = "would"
            return None
        if decision.kind == decisions.REDISPATCH and self._capped(candidate, planned):
            # The rate cap (a recovery herd after Redis loss) or the pacer's: the rest waits for the next round.
            result.skipped += 1
            result.has_more = True
            report.outcome = "deferred"
            return None
        return Planned(candidate, report, state, seen, decision)

    def _capped(self, candidate, planned) -> bool:
        """Whether the round has re-dispatched all it may: the policy's cap for any job, the pacer's for a job that
        never started (a stale run is not paced: ``discovery.discover_paced``)."""
        sent = [step.candidate for step in planned if step.decision.kind == decisions.REDISPATCH]
        if len(sent) >= self.policy.redispatch_cap:
            return True
        if self._paced_batch() is None or candidate.status == "running":
            return False
        return sum(1 for c in sent if c.status != "running") >= self.pace.limit

    def _discover(self) -> discovery.Discovery:
        paced = self._paced_batch()
        return discovery.discover(self.policy) if paced is None else discovery.discover_paced(self.policy, paced)

    def _paced_batch(self) -> int | None:
        """Candidates that never started a paced round looks at: no more than it may re-dispatch, so a round cut to 3
        does not read and gather evidence for 25 only to defer 22 (that work took CPU from new work too). None: the
        policy's batch, not paced."""
        if self.pace is None or self.pace.limit >= self.policy.redispatch_cap:
            return None
        return self.pace.limit

    def _record(self, result: RoundResult, *, final: bool) -> None:
        if self.dry_run:
            return
        try:
            if result.round_id is None:
                result.round_id = store.open_round(self.domain, self.process)
            if final:
                with connection.cursor() as cursor:
                    store.finish_round(cursor, result.round_id, result)
        except (OperationalError, InterfaceError):
            if not result.error:
                raise
            # Recording a failed round on a dead connection: the log already has it.
