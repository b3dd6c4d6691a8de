"""recovery-storm's stage split, read on the database's clock: where a new job's wait went, and what ran beside it.

Per new delivery job (first attempt): its envelope's creation -> its send (the dispatcher's hop; the envelope's
``dispatched_at`` is dated at the send) and the send -> its attempt's start (Redis and the worker). Per recovered
attempt (attempt > 1) that started in the window: its run time, per domain. And the slowest 1 % of new jobs by
creation -> start against the rest: the share that had another domain's recovered attempt running at some point of
their wait, and the share that had a recovered delivery attempt start on their worker after their send. When the
slowest 1 % were committed (seconds after the first new job: first, median, last, and how many distinct seconds),
so a tail bunched in a few seconds reads apart from one spread over the run; and the tables PostgreSQL's autovacuum
vacuumed or analyzed during the window (a backlog seeded just before the run is due for both).
"""

from __future__ import annotations

NEW_SQL = """
    SELECT e.job_id, e.created_at AS created, e.dispatched_at AS sent, a.started_at AS started
    FROM dispatch_app_dispatchenvelope e
    JOIN dispatch_app_jobattempt a ON a.job_id = e.job_id AND a.attempt = 1
    WHERE e.job_id = ANY(%(ids)s) AND e.attempt = 1 AND a.started_at IS NOT NULL AND e.dispatched_at IS NOT NULL"""

RECOVERED_SQL = """
    SELECT domain, started_at, COALESCE(finished_at, 'infinity'::timestamptz) AS finished_at
    FROM dispatch_app_jobattempt
    WHERE attempt > 1 AND started_at BETWEEN to_timestamp(%(t0)s) AND to_timestamp(%(t1)s)"""

STAGES_SQL = f"""
    WITH new AS ({NEW_SQL})
    SELECT percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM sent - created) * 1000),
           percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM started - sent) * 1000)
    FROM new"""

RUN_TIME_SQL = f"""
    SELECT domain, count(*),
           percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at) * 1000)
    FROM ({RECOVERED_SQL}) r WHERE finished_at < 'infinity' GROUP BY domain ORDER BY domain"""

BESIDE_SQL = f"""
    WITH new AS ({NEW_SQL}),
    recovered AS MATERIALIZED ({RECOVERED_SQL}),
    ranked AS (SELECT *, ntile(100) OVER (ORDER BY started - created DESC) AS hundredth FROM new)
    SELECT hundredth = 1 AS slowest, count(*),
           avg((EXISTS (SELECT 1 FROM recovered o WHERE o.domain <> 'delivery'
                        AND o.started_at < r.started AND o.finished_at > r.created))::int) * 100,
           avg((EXISTS (SELECT 1 FROM recovered d WHERE d.domain = 'delivery'
                        AND d.started_at BETWEEN r.sent AND r.started))::int) * 100
    FROM ranked r GROUP BY 1"""

WHEN_SQL = f"""
    WITH new AS ({NEW_SQL}),
    ranked AS (SELECT *, ntile(100) OVER (ORDER BY started - created DESC) AS hundredth,
                      extract(epoch FROM created - min(created) OVER ()) AS at FROM new)
    SELECT min(at), percentile_cont(0.5) WITHIN GROUP (ORDER BY at), max(at), count(DISTINCT floor(at))
    FROM ranked WHERE hundredth = 1"""

AUTOVACUUM_SQL = """
    SELECT count(*) FILTER (WHERE last_autovacuum BETWEEN to_timestamp(%(t0)s) AND to_timestamp(%(t1)s)),
           count(*) FILTER (WHERE last_autoanalyze BETWEEN to_timestamp(%(t0)s) AND to_timestamp(%(t1)s))
    FROM pg_stat_user_tables WHERE relname LIKE 'dispatch_app_%%'"""


def stage_split(job_ids: list[int], t0: float, t1: float) -> dict[str, float | int | None]:
    """Flat metrics of the split for new jobs ``job_ids`` and recovered attempts started between wall times t0, t1."""
    from django.db import connection

    params = {"ids": list(job_ids), "t0": t0, "t1": t1}
    out: dict[str, float | int | None] = {}
    with connection.cursor() as cursor:
        cursor.execute(STAGES_SQL, params)
        hop, worker = cursor.fetchone()
        for stage, values in (("created_to_sent", hop), ("sent_to_started", worker)):
            for name, value in zip(("p50", "p90", "p99"), values or [None] * 3, strict=True):
                out[f"new_{stage}_{name}_ms"] = value
        cursor.execute(RUN_TIME_SQL, params)
        for domain, count, (p50, p99) in cursor.fetchall():
            out[f"recovered_{domain}_attempts"] = count
            out[f"recovered_{domain}_run_p50_ms"] = p50
            out[f"recovered_{domain}_run_p99_ms"] = p99
        cursor.execute(BESIDE_SQL, params)
        for slowest, count, other_pct, delivery_pct in cursor.fetchall():
            group = "slowest_1pct" if slowest else "rest"
            out[f"{group}_new_jobs"] = count
            out[f"{group}_other_recovered_running_pct"] = float(other_pct)
            out[f"{group}_recovered_delivery_ahead_pct"] = float(delivery_pct)
        cursor.execute(WHEN_SQL, params)
        first, median, last, seconds = cursor.fetchone()
        out.update(slowest_1pct_first_s=first, slowest_1pct_median_s=median, slowest_1pct_last_s=last)
        out["slowest_1pct_distinct_seconds"] = seconds
        cursor.execute(AUTOVACUUM_SQL, params)
        out["autovacuumed_tables"], out["autoanalyzed_tables"] = cursor.fetchone()
    return out
