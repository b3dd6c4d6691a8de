"""Stage times per attempt: the one place that defines them, in Python (one job) and in SQL (aggregates).

Readers: the job timeline (``views.timeline``), the job list's columns (``admin.JobAdmin``), the dashboard,
``dispatchstats`` and the Prometheus gauges (``views.stats``), the demo's table (``latency``). Every time is a
database timestamp of one attempt: its ``JobAttempt`` row (``dispatch_app.store.triggers.history``) and its envelope,
which carries the dispatch until the attempt starts or ends (the dispatcher's mark writes no history), so a
re-dispatch never stretches a stage across attempts.

Instants of one attempt:
  created     attempt 1: the submit; attempt N: the re-dispatch (recovery, retry after a failure, an operator)
  due         when its envelope first became claimable: ``created``, or later when the envelope was created with
              a delay (``due_at``: a scheduled submit, or a retry backoff); an operator's "due now" or the
              attempt's end cut it short
  dispatched  the job entered RQ: its send's start, dated on the database clock by the mark that follows it
              (store.claim: the mark's clock less the send's age), never after the worker's start
  started     the worker's start
  finished    its outcome saved, or the moment a later attempt superseded it, or a cancel

Stages (``STAGES``, in order):
  backoff   created → due         a deliberate wait, not the dispatcher's: a retry backoff or a recovery
                                  round's spread (attempt > 1), or a scheduled submit (attempt 1). Absent when
                                  the envelope was due at once.
  outbox    due → dispatched      the dispatcher's part: wake-up, claim, send, send-failure backoffs, leases
                                  (its aggregates leave out the time the domain was paused: its own wait)
  rq        dispatched → started  time in RQ (clamped at 0 as a safety net; the mark never dates the dispatch
                                  after a start it can see); without a recorded dispatch the worker's start
                                  stands in for it
  worker    started → finished

A stage whose end has not happened is ``ongoing`` (measured up to the database clock) while the attempt goes on,
or ``cut_short`` at ``finished`` when the attempt ended first (superseded or cancelled while waiting there); the
stages after it did not happen. The aggregates (percentiles, per-minute chart, the demo's table) count completed
stages only: outbox needs ``dispatched``, rq needs ``started``, worker needs ``started`` and ``finished``.

Python API:
  ``Attempt``, ``Stage``; ``Attempt.stages(now)``, ``Attempt.waiting_in(now)``, ``Attempt.error_parts()``
  ``job_attempts(job)``: a job's attempts, oldest first (history rows; the current one rebuilt from the job
  row when it has none yet: an attempt-1 envelope still in the outbox)
  ``current_attempt(job_values)``: the current attempt from ``annotate_current`` values (the job list)
  ``annotate_current(queryset)``: Job queryset + the current attempt's instants and the database clock
SQL API (each takes a cursor; one statement; ages from one ``clock_timestamp()``):
  ``percentiles(cursor, windows, qs)``: per window and domain (and "all"), count and percentiles of the
  backoff, outbox and rq stages of attempts dispatched in the window
  ``per_minute(cursor, minutes)``: attempts dispatched per minute and their p95 outbox wait
  ``per_minute_by_domain(cursor, minutes)``: the same per domain, with the p95 RQ-queue wait (the charts)
  ``summary(min_job_id, max_job_id)``: count, p50/p95/p99/max per stage for a range of jobs (the demo's table)
  ``STAGE_START_SQL``: the start of an unfinished job's current stage (``j`` = job, ``a`` = its current
  attempt), the basis of "oldest recovery candidate" (recovery's touch of ``updated_at`` does not reset it)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import F, FilteredRelation, Q

from dispatch_app.db.clock import ClockTimestamp

STAGES = ("backoff", "outbox", "rq", "worker")
LABELS = {
    "backoff": "backoff (created → due)",
    "outbox": "outbox (due → dispatched)",
    "rq": "RQ queue (dispatched → started)",
    "worker": "worker (started → finished)",
}
# Outcomes a worker writes itself; any other end of a started attempt cut its worker stage short.
WORKER_OUTCOMES = ("succeeded", "failed", "")
SHORT = {"backoff": "backoff", "outbox": "outbox", "rq": "RQ queue", "worker": "worker"}


@dataclass(frozen=True)
class Stage:
    key: str
    name: str
    start: datetime | None
    end: datetime | None
    duration: timedelta | None
    ongoing: bool = False
    cut_short: bool = False  # the attempt ended (superseded, cancelled) while waiting here


@dataclass
class Attempt:
    attempt: int
    created_at: datetime
    due_at: datetime | None = None
    dispatched_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    outcome: str = ""
    error: str = ""
    worker: str = ""
    recorded: bool = True  # False: rebuilt from the job row, no history row yet

    def due(self) -> datetime:
        """``created`` or the delayed due time, never after the dispatch or the end (they cut a backoff short)."""
        due = max(self.created_at, self.due_at) if self.due_at is not None else self.created_at
        for cut in (self.dispatched_at, self.started_at, self.finished_at):
            if cut is not None and cut < due:
                due = max(self.created_at, cut)
        return due

    def _boundaries(self) -> list[tuple[str, datetime | None, datetime | None]]:
        due = self.due()
        dispatched = self.dispatched_at or self.started_at
        out = []
        if self.due_at is not None and due > self.created_at:
            out.append(("backoff", self.created_at, due))
        else:
            out.append(("backoff", None, None))  # due at once: no backoff, the outbox starts at created
        out.append(("outbox", due, dispatched))
        out.append(("rq", dispatched, self.started_at))
        out.append(("worker", self.started_at, self.finished_at))
        return out

    def stages(self, now: datetime) -> list[Stage]:
        """Every stage of this attempt; an ongoing one measured up to ``now`` (database clock)."""
        stages: list[Stage] = []
        stopped = False  # an earlier stage is ongoing or was cut short: the later ones did not happen
        for key, start, end in self._boundaries():
            if stopped or start is None:
                stages.append(Stage(key, LABELS[key], None, None, None))
                continue
            if key == "worker" and end is not None and self.outcome not in WORKER_OUTCOMES:
                # Ended by someone else (superseded, cancelled, recovery's verdict), not by the worker's finish.
                stages.append(Stage(key, LABELS[key], start, end, max(end - start, timedelta(0)), cut_short=True))
                continue
            if key == "backoff" and end is not None and end > now and self.finished_at is None:
                stages.append(Stage(key, LABELS[key], start, end, now - start, ongoing=True))
                stopped = True
                continue
            if key == "backoff" and self.dispatched_at is None and self.started_at is None and self.finished_at:
                # Ended (cancelled, superseded) before it was ever due or sent: the later stages never began.
                stages.append(Stage(key, LABELS[key], start, end, max(end - start, timedelta(0)), cut_short=True))
                stopped = True
                continue
            if end is not None:
                stages.append(Stage(key, LABELS[key], start, end, max(end - start, timedelta(0))))
                continue
            stopped = True
            if self.finished_at is not None:
                stages.append(
                    Stage(
                        key,
                        LABELS[key],
                        start,
                        self.finished_at,
                        max(self.finished_at - start, timedelta(0)),
                        cut_short=True,
                    )
                )
            else:
                stages.append(Stage(key, LABELS[key], start, None, max(now - start, timedelta(0)), ongoing=True))
        return stages

    def waiting_in(self, now: datetime) -> str:
        """The stage key the attempt waits in now, or "finished"."""
        for stage in self.stages(now):
            if stage.ongoing:
                return stage.key
        return "finished"

    def stage(self, key: str, now: datetime) -> Stage | None:
        return next((s for s in self.stages(now) if s.key == key), None)

    def error_parts(self) -> tuple[str, str, str]:
        """(exception class, message, traceback) from the worker's "<module.Class>: message\\n\\ntraceback"."""
        return split_error(self.error)


# "ValueError", "dispatch_app.domains.providers.ProviderError": a dotted name whose last part is capitalised.
_CLASS = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Z]\w*): ")


def split_error(error: str) -> tuple[str, str, str]:
    """(class, message, traceback); the class is "" when the headline names none (e.g. "dispatch failed: ...")."""
    if not error:
        return "", "", ""
    head, _, trace = error.partition("\n\n")
    match = _CLASS.match(head)
    if match:
        return match.group(1), head[match.end() :], trace
    return "", head, trace


def _from_row(row) -> Attempt:
    return Attempt(
        attempt=row.attempt,
        created_at=row.created_at,
        due_at=row.due_at,
        dispatched_at=row.dispatched_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        outcome=row.outcome,
        error=row.error,
        worker=row.worker,
    )


def _rebuilt(job, env=None) -> Attempt:
    """The current attempt from the job row and its envelope (no history row yet: in the outbox or the RQ queue)."""
    terminal = job.status in ("succeeded", "failed", "outcome_unknown", "cancelled")
    return Attempt(
        attempt=job.attempt,
        created_at=env.created_at if env is not None and job.attempt > 1 else job.submitted_at,
        dispatched_at=env.dispatched_at if env is not None else (job.dispatched_at if job.attempt == 1 else None),
        started_at=job.started_at,
        finished_at=job.finished_at if terminal else None,
        outcome=job.status if terminal else "",
        error=job.error,
        recorded=False,
    )


def job_attempts(job, envelopes=None) -> list[Attempt]:
    """All attempts of ``job``, oldest first. The envelopes (any order) carry the dispatch times that the history
    row gets only when its attempt starts or ends, and stand in for a current attempt without a row."""
    from dispatch_app.models import JobAttempt

    by_attempt = {e.attempt: e for e in envelopes or ()}
    rows = {r.attempt: _from_row(r) for r in JobAttempt.objects.filter(job_id=job.pk).order_by("attempt")}
    for n, row in rows.items():
        env = by_attempt.get(n)
        if row.dispatched_at is None and env is not None:
            row.dispatched_at = env.dispatched_at
    if job.attempt not in rows:
        rows[job.attempt] = _rebuilt(job, by_attempt.get(job.attempt))
    return [rows[k] for k in sorted(rows)]


# --- the job list: the current attempt's instants, fetched with the page (one query) ---------------------------

_CURRENT_FIELDS = ("created_at", "due_at", "dispatched_at", "started_at", "finished_at")


def annotate_current(queryset):
    """Adds ``_a_<instant>`` of the job's current attempt and ``_e_<instant>`` of its envelope (LEFT JOINs on the
    unique (job, attempt) of each) and ``_now``, the database clock."""
    return queryset.annotate(
        _cur=FilteredRelation("attempts", condition=Q(attempts__attempt=F("attempt"))),
        _env=FilteredRelation("envelopes", condition=Q(envelopes__attempt=F("attempt"))),
        _now=ClockTimestamp(),
        _e_created_at=F("_env__created_at"),
        _e_dispatched_at=F("_env__dispatched_at"),
        **{f"_a_{name}": F(f"_cur__{name}") for name in _CURRENT_FIELDS},
    )


def current_attempt(job) -> Attempt:
    """The current attempt of a job fetched through ``annotate_current``."""
    terminal = job.status in ("succeeded", "failed", "outcome_unknown", "cancelled")
    recorded = getattr(job, "_a_created_at", None) is not None
    if recorded:
        created = job._a_created_at
    else:
        created = job._e_created_at if job.attempt > 1 and job._e_created_at is not None else job.submitted_at
    dispatched = (job._a_dispatched_at if recorded else None) or job._e_dispatched_at
    if dispatched is None and job.attempt == 1:
        dispatched = job.dispatched_at
    return Attempt(
        attempt=job.attempt,
        created_at=created,
        due_at=job._a_due_at if recorded else None,
        dispatched_at=dispatched,
        started_at=(job._a_started_at if recorded else None) or job.started_at,
        finished_at=job.finished_at if terminal else None,
        outcome=job.status if terminal else "",
        recorded=recorded,
    )
