"""Backlogs written in bulk SQL, for the scenarios that start from one.

- ``seed_pending``: submitted jobs with an envelope each, claimable now (or already dispatched).
- ``seed_stale``: queued jobs last updated an hour or more ago: recovery's candidates.
"""

from __future__ import annotations

import json

from bench.load import domain_keys


def _domain_arrays(domains: list[str] | None) -> tuple[list[str], list[str]]:
    from dispatch_app.domains import get_domain

    keys = domain_keys(domains)
    return keys, [get_domain(k).queue for k in keys]


def seed_pending(count: int, *, domains: list[str] | None = None, envelope_status: str = "pending") -> tuple[int, int]:
    """`count` submitted jobs with one envelope each, claimable now; returns (first, last) job id."""
    from django.db import connection

    keys, queues = _domain_arrays(domains)
    job_status = "submitted" if envelope_status == "pending" else "queued"
    dispatched = "clock_timestamp()" if envelope_status != "pending" else "NULL"
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = 0")
        cursor.execute(
            f"""
            WITH j AS (
                INSERT INTO dispatch_app_job (domain, status, attempt, payload, error, vendor_request_id,
                                              submitted_at, updated_at, dispatched_at)
                SELECT (%(keys)s::text[])[1 + g %% %(n)s], %(job_status)s, 1,
                       (%(payloads)s::jsonb[])[1 + g %% %(n)s], '', '',
                       clock_timestamp(), clock_timestamp(), {dispatched}
                FROM generate_series(0, %(count)s - 1) g
                RETURNING id, domain
            )
            INSERT INTO dispatch_app_dispatchenvelope (job_id, attempt, domain, queue, status, available_at,
                                                       send_attempts, last_error, created_at, dispatched_at)
            SELECT j.id, 1, j.domain, (%(queues)s::text[])[array_position(%(keys)s::text[], j.domain)],
                   %(env_status)s, clock_timestamp() - interval '1 second', 0, '', clock_timestamp(), {dispatched}
            FROM j ORDER BY j.id
            RETURNING job_id
            """,
            {
                "keys": keys,
                "queues": queues,
                # Each domain's own valid payload: a worker that runs these jobs runs the work, not a refusal.
                "payloads": [json.dumps(_payload(k)) for k in keys],
                "n": len(keys),
                "count": count,
                "job_status": job_status,
                "env_status": envelope_status,
            },
        )
        ids = [row[0] for row in cursor.fetchall()]
        cursor.execute("RESET statement_timeout")
        cursor.execute("ANALYZE dispatch_app_dispatchenvelope")
        cursor.execute("ANALYZE dispatch_app_job")
    return (min(ids), max(ids)) if ids else (0, 0)


def seed_stale(per_domain: int, domains: list[str], *, oldest_hours: float = 2.0) -> None:
    """`per_domain` queued jobs per domain whose last update lies between 1 h and `oldest_hours` ago."""
    from django.db import connection

    spread = (oldest_hours - 1.0) * 3600.0
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = 0")
        for domain in domains:
            cursor.execute(
                """
                INSERT INTO dispatch_app_job (domain, status, attempt, payload, error, vendor_request_id,
                                              submitted_at, updated_at, dispatched_at)
                SELECT %(domain)s, 'queued', 1, %(payload)s::jsonb, '', '', ts, ts, ts
                FROM (SELECT clock_timestamp() - interval '1 hour'
                             - make_interval(secs => %(spread)s * g / %(n)s) AS ts
                      FROM generate_series(1, %(n)s) g) s
                """,
                {"domain": domain, "payload": json.dumps(_payload(domain)), "spread": spread, "n": per_domain},
            )
        cursor.execute("RESET statement_timeout")
        cursor.execute("ANALYZE dispatch_app_job")


def _payload(domain: str) -> dict:
    from dispatch_app.domains.demo_payloads import demo_payload

    return demo_payload(domain, 0)
