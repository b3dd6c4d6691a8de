"""A recovery round's actions: what was decided for each candidate, done under its row lock.

The round (``recovery.round``) looks and decides with no transaction open; this
part takes the row locks, checks each job is unchanged since the round re-read
it, and acts: the re-dispatches of a batch in two statements
(``store.redispatch_many``), the rarer actions one by one, all in one
transaction. If any action raises, the batch is rolled back and each candidate
acts again in its own transaction, so only the one that raised counts as an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis
from django.db import InterfaceError, OperationalError, connection, transaction

import dispatch_app.recovery.decide as decisions
import dispatch_app.recovery.discovery as discovery
import dispatch_app.recovery.evidence as evidence
import dispatch_app.store.api as store
from dispatch_app.recovery.decide import Decision, JobState
from dispatch_app.recovery.event_kinds import EVENT_KINDS

if TYPE_CHECKING:
    from dispatch_app.recovery.result import CandidateReport, RoundResult

log = logging.getLogger("dispatch_app.recovery")

# The database or Redis itself is gone: every next candidate would fail the same way
# (each after a socket timeout), so the round ends and the runner backs off.
ROUND_FATAL = (OperationalError, InterfaceError, redis.ConnectionError, redis.TimeoutError)


@dataclass
class Planned:
    """A candidate looked at and decided on, its action not taken yet."""

    candidate: discovery.Candidate
    report: CandidateReport
    state: JobState
    seen: evidence.Evidence
    decision: Decision


# RoundResult's counters that actions move (restored when a batch of actions is rolled back).
COUNTS = ("redispatched", "left_alone", "unknown", "failed", "skipped", "errors")


class Actions:
    """The action phase of a recovery round (``Round`` holds one): take what was decided, in one transaction.

    ``failed(candidate, report, result, exc)``: the round's handling of a candidate whose action raised.
    """

    def __init__(self, domain: str, failed: Callable[..., None], *, spread_seconds: float = 0.0):
        self.domain = domain
        self._failed = failed
        # Seconds a batch's re-dispatches are spread over (store.redispatch_many); 0: all due now. The
        # recovery loop passes its policy's round_spread; ``recover --once`` and a round run by hand send at once.
        self.spread_seconds = spread_seconds

    def act_all(self, planned: list[Planned], result: RoundResult) -> None:
        """The round's actions in one transaction: one statement locks every row, one commit ends it.

        The re-dispatches (a storm's bulk) are two statements for the whole batch
        (``store.redispatch_many``); the rarer actions run one by one inside the
        transaction. A recovered job cost ~10 round trips before this, each parsed and
        planned anew; a storm's round of 25 now costs ~7. If any action raises, the
        whole batch is rolled back and each is done again on its own, so only the
        candidate that raises is counted as an error, as before.
        """
        if not planned:
            return
        counts = {kind: getattr(result, kind) for kind in COUNTS}
        try:
            with transaction.atomic():
                seen = discovery.lock_unchanged_many([step.state for step in planned])
                redispatches: list[Planned] = []
                for step in planned:
                    self._act_locked(step, seen[step.state.job_id], result, redispatches)
                self._redispatch_all(redispatches, result)
        except ROUND_FATAL:
            raise
        except Exception:
            for kind, value in counts.items():
                setattr(result, kind, value)
            log.warning(
                "%s: an action of the round's batch failed; doing them one by one",
                self.domain,
                exc_info=True,
                extra={"action": "recovery_batch_retry", "domain": self.domain},
            )
            for step in planned:
                self._act_one(step, result)
            return
        for step in planned:
            self._log_action(step)

    def _act_one(self, step: Planned, result: RoundResult) -> None:
        """One candidate's action in its own transaction; an error is that candidate's alone."""
        try:
            with transaction.atomic():
                self._act_locked(step, discovery.lock_unchanged(step.state), result)
        except ROUND_FATAL:
            raise
        except Exception as exc:
            self._failed(step.candidate, step.report, result, exc)
            return
        self._log_action(step)

    def act_before_leaving(self, planned: list[Planned], result: RoundResult) -> None:
        """The round is ending on a fatal error (Redis or the database gone): what was decided is still done."""
        try:
            self.act_all(planned, result)
        except ROUND_FATAL:
            pass  # the database is gone too: the round's error says so, and the candidates are found again

    def _redispatch_all(self, steps: list[Planned], result: RoundResult) -> None:
        """The batch's re-dispatches in two statements (jobs and envelopes, then their events)."""
        jobs = [
            (
                step.state.job_id,
                step.state.attempt,
                step.state.status,
                step.decision.reason,
                {"evidence": step.seen.as_dict(), "round": result.round_id},
            )
            for step in steps
        ]
        moved = store.redispatch_many(
            self.domain, jobs, kind=EVENT_KINDS[decisions.REDISPATCH], spread_seconds=self.spread_seconds
        )
        for step in steps:
            if step.state.job_id in moved:
                result.redispatched += 1
            else:  # locked and unchanged a moment ago, so this is not expected; said as it is if it happens
                result.skipped += 1
                step.report.outcome = "moved"
                step.report.reason = f"moved before its re-dispatch ({step.decision.reason})"

    def _act_locked(
        self, step: Planned, seen_now: str, result: RoundResult, redispatches: list[Planned] | None = None
    ) -> None:
        report, decision = step.report, step.decision
        if seen_now != "ok":
            result.skipped += 1
            report.outcome = seen_now
            report.reason = (
                "row locked by another transaction"
                if seen_now == "locked"
                else "moved while its evidence was gathered (a worker or a user got there first)"
            ) + f"; would have been: {decision.kind} ({decision.reason})"
            return
        if redispatches is not None and decision.kind == decisions.REDISPATCH:
            self._settle(step.state, decision)
            redispatches.append(step)  # done with the batch's others in _redispatch_all
        else:
            self._act(step.state, decision, step.seen, result)
        report.outcome = "done"

    def _log_action(self, step: Planned) -> None:
        if step.report.outcome == "done" and step.decision.kind != decisions.LEAVE_ALONE:
            state, decision = step.state, step.decision
            log.info(
                "%s job %s attempt %s: %s (%s)",
                self.domain,
                state.job_id,
                state.attempt,
                decision.kind,
                decision.reason,
                extra={"action": f"recovery_{decision.kind}", "domain": self.domain},
            )

    @staticmethod
    def _settle(state: JobState, decision: Decision) -> None:
        if decision.settle:
            with connection.cursor() as cursor:
                for call_id, status, note in decision.settle:
                    store.settle_in_doubt(cursor, call_id, status, note)

    def _act(self, state: JobState, decision: Decision, seen: evidence.Evidence, result: RoundResult) -> None:
        kind = decision.kind
        self._settle(state, decision)
        if kind == decisions.REDISPATCH:
            # Through the outbox: a new envelope for the next attempt, whose NOTIFY wakes dispatch on commit.
            store.redispatch(
                state.job_id,
                state.attempt,
                kind=EVENT_KINDS[kind],
                reason=decision.reason,
                allowed_statuses=(state.status,),
                data={"round": result.round_id},
            )
            result.redispatched += 1
            return
        with connection.cursor() as cursor:
            if kind == decisions.LEAVE_ALONE:
                # To the back of the discovery order, looked at again only after its threshold: otherwise B
                # long-running jobs with live workers would take every slot of every round.
                store.touch(cursor, state.job_id, state.attempt)
                result.left_alone += 1
            else:
                status = "outcome_unknown" if kind == decisions.OUTCOME_UNKNOWN else "failed"
                store.conclude(cursor, state.job_id, state.attempt, state.status, status, decision.reason[:4000])
                if kind == decisions.OUTCOME_UNKNOWN:
                    result.unknown += 1
                else:
                    result.failed += 1
        store.record_event(
            state.job_id,
            state.attempt,
            EVENT_KINDS[kind],
            reason=decision.reason,
            data={
                "evidence": seen.as_dict(),
                "round": result.round_id,
                "calls_in_doubt": [call.as_dict() for call in state.in_doubt],
            },
        )
