"""The stages of ``dispatch_app.timeline.stages`` in SQL: the same definitions over many attempts at once.

The dashboard, ``dispatchstats``, the Prometheus gauges and the demo's table read percentiles and per-minute
series of the stages here; ``stages`` itself holds the definitions for one attempt (Python), which this SQL
must agree with (tests/integration/timeline/test_stages.py checks both on the same rows).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from dispatch_app.store.tables import ATTEMPT, ENVELOPE
from dispatch_app.timeline.stages import STAGES


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

    Windows select on the envelope's ``dispatched_at`` (index envelope_status_dispatched); percentile_cont
    interpolates.
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
