"""Stage times per attempt: the one place that defines them, in Python (one job) and in SQL (aggregates).

Readers: the job timeline (``ops.timeline``), the job list's columns (``admin.JobAdmin``), the dashboard,
``dispatchstats`` and the Prometheus gauges (``ops.stats``), the demo's table (``latency``). Every time is a
database timestamp of one attempt: its ``JobAttempt`` row (``dispatch_app.store.history_triggers``) and its envelope,
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
  backoff   created → due         a deliberate wait, not the dispatcher's: a retry backoff (attempt > 1) or a
                                  scheduled submit (attempt 1). Absent when the envelope was due at once.
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

from django.db import connection
from django.db.models import F, FilteredRelation, Q

from dispatch_app.dbtime import ClockTimestamp
from dispatch_app.store.tables import ATTEMPT, ENVELOPE

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


# "ValueError", "dispatch_app.providers.ProviderError": a dotted name whose last part is capitalised.
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


# --- SQL: the same definitions over many attempts ---------------------------------------------------------------


def _due_sql(a: str = "a") -> str:
    return (
        f"LEAST(GREATEST({a}.created_at, COALESCE({a}.due_at, {a}.created_at)), "
        f"COALESCE({a}.dispatched_at, {a}.started_at, {a}.finished_at, 'infinity'::timestamptz))"
    )


def seconds_sql(stage: str, a: str = "a") -> str:
    """SQL: seconds a completed ``stage`` took in attempt row ``a`` (NULL when the stage did not complete)."""
    due = _due_sql(a)
    if stage == "backoff":
        return (
            f"CASE WHEN {a}.due_at > {a}.created_at AND COALESCE({a}.dispatched_at, {a}.started_at) IS NOT NULL "
            f"THEN extract(epoch FROM {due} - {a}.created_at)::float8 END"
        )
    if stage == "outbox":
        return f"extract(epoch FROM {a}.dispatched_at - {due})::float8"
    if stage == "rq":
        # GREATEST ignores NULLs: without the CASE an attempt that never started would count as 0.
        return (
            f"CASE WHEN {a}.started_at IS NOT NULL THEN "
            f"GREATEST(extract(epoch FROM {a}.started_at - COALESCE({a}.dispatched_at, {a}.started_at))::float8, 0) END"
        )
    if stage == "worker":
        return f"extract(epoch FROM {a}.finished_at - {a}.started_at)::float8"
    raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")


# Paused time is its own wait, not the dispatcher's: the outbox percentiles and charts subtract from each attempt's
# outbox stage the time its domain was paused (DomainPauseEvent: each pause until the next event of its domain, a
# resume; a pause still on runs to infinity, cut at the dispatch). The table holds operator actions only: small.
PAUSES_SQL = """pauses AS (
    SELECT domain, s, COALESCE(e, 'infinity'::timestamptz) AS e FROM (
        SELECT domain, op, at AS s, lead(at) OVER (PARTITION BY domain ORDER BY at, id) AS e
        FROM dispatch_app_domainpauseevent) z
    WHERE op = 'pause')"""


def paused_seconds_sql(a: str = "a") -> str:
    """SQL: seconds of attempt row ``a``'s outbox stage (due → dispatched) its domain was paused (needs PAUSES_SQL)."""
    due = _due_sql(a)
    return (
        f"(SELECT COALESCE(sum(GREATEST(extract(epoch FROM LEAST(p.e, {a}.dispatched_at) - GREATEST(p.s, {due})), 0)),"
        f" 0)::float8 FROM pauses p WHERE p.domain = {a}.domain AND p.s < {a}.dispatched_at AND p.e > {due})"
    )


def outbox_unpaused_sql(a: str = "a") -> str:
    """SQL: the outbox stage's seconds without its domain's paused time (never below 0)."""
    return f"GREATEST({seconds_sql('outbox', a)} - {paused_seconds_sql(a)}, 0)"


# Start of an unfinished job's current stage; j = the job, a = its current attempt's history row, e = its
# current envelope (both LEFT JOINs, may be NULL).
STAGE_START_SQL = """CASE j.status
    WHEN 'running' THEN COALESCE(a.started_at, j.started_at)
    WHEN 'queued' THEN COALESCE(a.dispatched_at, e.dispatched_at, CASE WHEN j.attempt = 1 THEN j.dispatched_at END,
                                a.created_at, e.created_at, j.submitted_at)
    ELSE LEAST(COALESCE(GREATEST(a.created_at, a.due_at), CASE WHEN j.attempt > 1 THEN e.created_at END,
                        j.submitted_at), clock_timestamp()) END"""

# Every dispatched attempt, with or without its history row yet: the envelope carries the dispatch (and is
# what the window selects on, index envelope_status_dispatched), the history row the rest.
DISPATCHED_ATTEMPTS_SQL = f"""
    SELECT e.domain, e.job_id, e.attempt, COALESCE(a.created_at, e.created_at) AS created_at, a.due_at,
           e.dispatched_at, a.started_at, a.finished_at
    FROM {ENVELOPE} e LEFT JOIN {ATTEMPT} a ON a.job_id = e.job_id AND a.attempt = e.attempt
    WHERE e.status = 'dispatched'"""

WINDOW_STAGES = ("backoff", "outbox", "rq")


def percentiles(cursor, windows=(5, 60), qs=(0.5, 0.95, 0.99)) -> list[tuple]:
    """Rows (minutes, domain or None for all, stage, count, [percentiles]) over attempts dispatched in the window.

    Windows select on ``dispatched_at`` (index jobattempt_dispatched); percentile_cont interpolates.
    """
    cols = ", ".join(
        f"{outbox_unpaused_sql('d') if s == 'outbox' else seconds_sql(s, 'd')} AS {s}" for s in WINDOW_STAGES
    )
    aggs = ", ".join(
        f"count(x.{s}), percentile_cont(%(q)s::float8[]) WITHIN GROUP (ORDER BY x.{s})" for s in WINDOW_STAGES
    )
    cursor.execute(
        f"""
        WITH t AS (SELECT clock_timestamp() AS now), {PAUSES_SQL},
        x AS (
            SELECT d.domain, d.dispatched_at, {cols}
            FROM ({DISPATCHED_ATTEMPTS_SQL}
                  AND e.dispatched_at >= (SELECT now FROM t) - make_interval(mins => %(widest)s)) d
        )
        SELECT w.minutes, x.domain, {aggs}
        FROM x CROSS JOIN t CROSS JOIN unnest(%(windows)s::int[]) AS w(minutes)
        WHERE x.dispatched_at >= t.now - make_interval(mins => w.minutes)
        GROUP BY GROUPING SETS ((w.minutes, x.domain), (w.minutes))
        """,
        {"widest": max(windows), "windows": list(windows), "q": list(qs)},
    )
    out = []
    for minutes, domain, *values in cursor.fetchall():
        for index, stage in enumerate(WINDOW_STAGES):
            count, pcts = values[2 * index], values[2 * index + 1]
            out.append((minutes, domain, stage, count, pcts if count else None))
    return out


def per_minute(cursor, minutes: int = 60) -> dict[int, tuple[int, float | None]]:
    """{minutes ago: (attempts dispatched that minute, p95 outbox wait in seconds)} for the last ``minutes``."""
    cursor.execute(
        f"""
        WITH t AS (SELECT clock_timestamp() AS now)
        SELECT floor(extract(epoch FROM t.now - d.dispatched_at) / 60)::int AS ago, count(*),
               percentile_cont(0.95) WITHIN GROUP (ORDER BY {seconds_sql("outbox", "d")})
        FROM ({DISPATCHED_ATTEMPTS_SQL} AND e.dispatched_at >= (SELECT now FROM t) - make_interval(mins => %s)) d
        CROSS JOIN t
        GROUP BY ago
        """,
        [minutes],
    )
    return {ago: (count, p95) for ago, count, p95 in cursor.fetchall()}


def per_minute_by_domain(cursor, minutes: int = 60) -> dict[tuple[str, int], tuple[int, float | None, float | None]]:
    """{(domain, minutes ago): (attempts dispatched that minute, p95 outbox wait, p95 RQ-queue wait of those that
    started)} for the last ``minutes``; attempts still waiting in RQ count as dispatched (the envelope says so)."""
    cursor.execute(
        f"""
        WITH t AS (SELECT clock_timestamp() AS now), {PAUSES_SQL}
        SELECT d.domain, floor(extract(epoch FROM t.now - d.dispatched_at) / 60)::int AS ago, count(*),
               percentile_cont(0.95) WITHIN GROUP (ORDER BY {outbox_unpaused_sql("d")}),
               percentile_cont(0.95) WITHIN GROUP (ORDER BY {seconds_sql("rq", "d")})
        FROM ({DISPATCHED_ATTEMPTS_SQL} AND e.dispatched_at >= (SELECT now FROM t) - make_interval(mins => %s)) d
        CROSS JOIN t
        GROUP BY d.domain, ago
        """,
        [minutes],
    )
    return {(domain, ago): (n, outbox, rq) for domain, ago, n, outbox, rq in cursor.fetchall()}


@dataclass(frozen=True)
class StageSummary:
    stage: str
    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None


def summary(min_job_id: int = 0, max_job_id: int | None = None) -> list[StageSummary]:
    """Per stage, over every attempt of the jobs min_job_id <= id <= max_job_id (completed stages only)."""
    cols = ", ".join(f"{seconds_sql(s)} * 1000 AS {s}" for s in STAGES)
    aggs = ", ".join(
        f"count(x.{s}), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY x.{s}), max(x.{s})"
        for s in STAGES
    )
    in_range = "{t}.job_id >= %s AND (%s::bigint IS NULL OR {t}.job_id <= %s)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT {aggs} FROM (
                SELECT {cols} FROM (
                    SELECT a.created_at, a.due_at, COALESCE(a.dispatched_at, e.dispatched_at) AS dispatched_at,
                           a.started_at, a.finished_at
                    FROM {ATTEMPT} a LEFT JOIN {ENVELOPE} e ON e.job_id = a.job_id AND e.attempt = a.attempt
                    WHERE {in_range.format(t="a")}
                    UNION ALL
                    -- Attempts with no history row yet (not started): their envelope alone.
                    SELECT e.created_at, NULL, e.dispatched_at, NULL, NULL FROM {ENVELOPE} e
                    WHERE {in_range.format(t="e")} AND NOT EXISTS (
                        SELECT 1 FROM {ATTEMPT} a WHERE a.job_id = e.job_id AND a.attempt = e.attempt)
                ) a
            ) x
            """,
            [min_job_id, max_job_id, max_job_id] * 2,
        )
        row = cursor.fetchone()
    out = []
    for index, stage in enumerate(STAGES):
        count, pcts, worst = row[3 * index : 3 * index + 3]
        p50, p95, p99 = (None, None, None) if not count else (float(v) for v in pcts)
        out.append(StageSummary(stage, count, p50, p95, p99, None if worst is None else float(worst)))
    return out
