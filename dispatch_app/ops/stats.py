"""The operators' numbers, computed in SQL against the database clock.

One module, three readers: the admin dashboard, ``manage.py dispatchstats`` and
the Prometheus collector. Each function takes a cursor and runs one statement
that reads ``clock_timestamp()`` once, so every age in a result is measured
from the same instant of the database's clock, never the host's.

Definitions (docs/operations.md repeats them for operators):

- backlog: unfinished jobs per status (submitted = in the outbox, queued = in
  the RQ queue, running = on a worker).
- oldest recovery-candidate age: now - min(updated_at) over a domain's
  unfinished jobs, the row recovery's discovery (ORDER BY updated_at, id)
  reaches first.
- oldest pending envelope age: now - created_at of the oldest pending envelope,
  not counting envelopes deliberately scheduled for later and never tried
  (send_attempts = 0 AND available_at in the future). Backoffs and leases count.
- dispatch latency: per envelope attempt, created_at -> dispatched_at (the
  outbox wait; for attempt 1 created_at is the submit) and dispatched_at ->
  the job's started_at (the RQ queue wait), over attempts dispatched in the window.
- effective recovery rate: (redispatched + unknown + failed) / scanned over the
  rounds started in the last hour.
"""

from __future__ import annotations

from django.db import connection

from dispatch_app.domains import DOMAIN_KEYS
from dispatch_app.models import ACTIVE_STATUSES

ENVELOPE = "dispatch_app_dispatchenvelope"
JOB = "dispatch_app_job"
ROUND = "dispatch_app_recoveryround"
PROCESS = "dispatch_app_dispatcherprocess"
HEARTBEAT = "dispatch_app_loopheartbeat"

WINDOWS_MINUTES = (5, 60)
PERCENTILES = (0.5, 0.95, 0.99)
EFFECTIVE_KINDS = ("redispatched", "unknown", "failed")
DECISION_KINDS = ("redispatched", "left_alone", "unknown", "failed", "skipped", "errors")
RATE_WINDOW_MINUTES = 60


def _num(value, digits: int = 6):
    return None if value is None else round(float(value), digits)


def job_summary(cursor) -> dict[str, dict]:
    """Backlog by status and the oldest recovery-candidate age, per domain (partial index job_recovery_candidates)."""
    cursor.execute(
        f"""
        SELECT domain, status, count(*), extract(epoch FROM clock_timestamp() - min(updated_at))
        FROM {JOB} WHERE status = ANY(%s) GROUP BY domain, status
        """,
        [list(ACTIVE_STATUSES)],
    )
    out: dict[str, dict] = {}
    for domain, status, count, age in cursor.fetchall():
        entry = out.setdefault(domain, {"backlog": {s: 0 for s in ACTIVE_STATUSES}, "oldest_candidate_age": None})
        entry["backlog"][status] = count
        previous = entry["oldest_candidate_age"]
        entry["oldest_candidate_age"] = _num(age if previous is None else max(previous, float(age)), 3)
    return out


def envelope_summary(cursor) -> dict[str, dict]:
    """Pending / due / dead envelopes and the oldest pending envelope's age, per domain."""
    cursor.execute(
        f"""
        WITH t AS (SELECT clock_timestamp() AS now)
        SELECT e.domain,
               count(*) FILTER (WHERE e.status = 'pending'),
               count(*) FILTER (WHERE e.status = 'pending' AND e.available_at <= t.now),
               count(*) FILTER (WHERE e.status = 'dead'),
               extract(epoch FROM t.now - min(e.created_at) FILTER (
                   WHERE e.status = 'pending' AND NOT (e.send_attempts = 0 AND e.available_at > t.now)))
        FROM {ENVELOPE} e CROSS JOIN t
        WHERE e.status IN ('pending', 'dead')
        GROUP BY e.domain, t.now
        """
    )
    return {
        domain: {"pending": pending, "due": due, "dead": dead, "oldest_pending_age": _num(age, 3)}
        for domain, pending, due, dead, age in cursor.fetchall()
    }


def recovery_summary(cursor, domains, *, rounds: int = 5) -> dict[str, dict]:
    """The last rounds per domain (index recoveryround_domain_started) and the effective rate over the last hour."""
    effective = " + ".join(f"r.{k}" for k in EFFECTIVE_KINDS)
    cursor.execute(
        f"""
        WITH t AS (SELECT clock_timestamp() AS now)
        SELECT d.domain, r.id, extract(epoch FROM t.now - r.started_at),
               extract(epoch FROM r.finished_at - r.started_at), r.scanned, {effective},
               {", ".join(f"r.{k}" for k in DECISION_KINDS)}, r.has_more, r.oldest_candidate_age, r.error
        FROM unnest(%s::text[]) AS d(domain) CROSS JOIN t
        CROSS JOIN LATERAL (
            SELECT * FROM {ROUND} x WHERE x.domain = d.domain ORDER BY x.started_at DESC, x.id DESC LIMIT %s
        ) r
        ORDER BY d.domain, r.started_at DESC, r.id DESC
        """,
        [list(domains), rounds],
    )
    out = {domain: {"rounds": [], "effective_rate": None, "scanned_last_hour": 0} for domain in domains}
    for row in cursor.fetchall():
        domain, round_id, age, duration, scanned, effective_n, *kinds, has_more, oldest, error = row
        out[domain]["rounds"].append(
            {
                "id": round_id,
                "age": _num(age, 3),
                "duration": _num(duration, 3),
                "scanned": scanned,
                "effective": effective_n,
                **dict(zip(DECISION_KINDS, kinds, strict=True)),
                "has_more": has_more,
                "oldest_candidate_age": _num(oldest, 3),
                "error": error,
            }
        )
    cursor.execute(
        f"""
        SELECT domain, sum(scanned), sum({effective.replace("r.", "")})
        FROM {ROUND} WHERE started_at >= clock_timestamp() - make_interval(mins => %s) AND domain = ANY(%s)
        GROUP BY domain
        """,
        [RATE_WINDOW_MINUTES, list(domains)],
    )
    for domain, scanned, effective_n in cursor.fetchall():
        out[domain]["scanned_last_hour"] = int(scanned)
        out[domain]["effective_last_hour"] = int(effective_n)
        out[domain]["effective_rate"] = _num(effective_n / scanned, 4) if scanned else None
    return out


def latency_summary(cursor, windows=WINDOWS_MINUTES) -> dict[str, dict]:
    """p50/p95/p99 of the outbox and RQ-queue waits per window, per domain and for all domains ("all")."""
    cursor.execute(
        f"""
        WITH t AS (SELECT clock_timestamp() AS now),
        e AS (
            SELECT e.domain, e.dispatched_at,
                   extract(epoch FROM e.dispatched_at - e.created_at)::float8 AS outbox,
                   extract(epoch FROM j.started_at - e.dispatched_at)::float8 AS queue
            FROM {ENVELOPE} e CROSS JOIN t
            LEFT JOIN {JOB} j ON j.id = e.job_id AND j.attempt = e.attempt
            WHERE e.status = 'dispatched' AND e.dispatched_at >= t.now - make_interval(mins => %(widest)s)
        )
        SELECT w.minutes, COALESCE(e.domain, 'all'),
               count(e.outbox), percentile_cont(%(p)s::float8[]) WITHIN GROUP (ORDER BY e.outbox),
               count(e.queue), percentile_cont(%(p)s::float8[]) WITHIN GROUP (ORDER BY e.queue)
        FROM e CROSS JOIN t CROSS JOIN unnest(%(windows)s::int[]) AS w(minutes)
        WHERE e.dispatched_at >= t.now - make_interval(mins => w.minutes)
        GROUP BY GROUPING SETS ((w.minutes, e.domain), (w.minutes))
        """,
        {"widest": max(windows), "windows": list(windows), "p": list(PERCENTILES)},
    )

    def pcts(count, values):
        names = ("p50", "p95", "p99")
        return {
            "count": count,
            **{n: (_num(v) if count else None) for n, v in zip(names, values or [None] * 3, strict=True)},
        }

    out: dict[str, dict] = {}
    for minutes, domain, n_outbox, outbox, n_queue, queue in cursor.fetchall():
        out.setdefault(domain, {})[f"{minutes}m"] = {
            "submitted_to_dispatched": pcts(n_outbox, outbox),
            "dispatched_to_started": pcts(n_queue, queue),
        }
    empty = {"submitted_to_dispatched": pcts(0, None), "dispatched_to_started": pcts(0, None)}
    for domain in ("all", *DOMAIN_KEYS):
        for minutes in windows:
            out.setdefault(domain, {}).setdefault(f"{minutes}m", dict(empty))
    return out


def throughput(cursor, minutes: int = 60) -> list[dict]:
    """Envelopes dispatched per minute and their p95 outbox wait, oldest minute first (the dashboard chart)."""
    cursor.execute(
        f"""
        WITH t AS (SELECT clock_timestamp() AS now)
        SELECT floor(extract(epoch FROM t.now - e.dispatched_at) / 60)::int AS ago, count(*),
               percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM e.dispatched_at - e.created_at))
        FROM {ENVELOPE} e CROSS JOIN t
        WHERE e.status = 'dispatched' AND e.dispatched_at >= t.now - make_interval(mins => %s)
        GROUP BY ago
        """,
        [minutes],
    )
    by_minute = {ago: (count, p95) for ago, count, p95 in cursor.fetchall()}
    series = []
    for ago in range(minutes - 1, -1, -1):
        count, p95 = by_minute.get(ago, (0, None))
        series.append({"minutes_ago": ago, "dispatched": count, "p95": _num(p95)})
    return series


def dispatchers(cursor, stale_seconds: float) -> list[dict]:
    """Running dispatcher processes (not stopped) and each loop's last successful tick; stale ones flagged."""
    cursor.execute(
        f"""
        WITH t AS (SELECT clock_timestamp() AS now)
        SELECT p.id, p.name, p.hostname, p.pid, extract(epoch FROM t.now - p.started_at),
               extract(epoch FROM t.now - p.last_seen_at),
               h.loop, extract(epoch FROM t.now - h.last_tick_at), h.errors, h.last_error,
               extract(epoch FROM t.now - h.last_error_at)
        FROM {PROCESS} p CROSS JOIN t
        LEFT JOIN {HEARTBEAT} h ON h.process_id = p.id
        WHERE p.stopped_at IS NULL
        ORDER BY p.started_at, p.id, h.loop
        """
    )
    out: dict[int, dict] = {}
    for pid_, name, host, pid, up, seen, loop, tick, errors, last_error, error_age in cursor.fetchall():
        process = out.setdefault(
            pid_,
            {
                "name": name,
                "hostname": host,
                "pid": pid,
                "uptime": _num(up, 3),
                "last_seen_age": _num(seen, 3),
                "stale": float(seen) > stale_seconds,
                "loops": [],
            },
        )
        if loop is not None:
            process["loops"].append(
                {
                    "loop": loop,
                    "last_tick_age": _num(tick, 3),
                    "stale": tick is None or float(tick) > stale_seconds,
                    "errors": errors,
                    "last_error": last_error,
                    "last_error_age": _num(error_age, 3),
                }
            )
    return list(out.values())


def recovery_rounds_after(cursor, last_id: int) -> list[tuple]:
    """Finished rounds with id > last_id, for the metrics' decision counters: (id, domain, *DECISION_KINDS)."""
    cursor.execute(
        f"SELECT id, domain, {', '.join(DECISION_KINDS)} FROM {ROUND} "
        "WHERE id > %s AND finished_at IS NOT NULL ORDER BY id LIMIT 10000",
        [last_id],
    )
    return cursor.fetchall()


def notification_queue_usage(cursor) -> float:
    cursor.execute("SELECT pg_notification_queue_usage()")
    return float(cursor.fetchone()[0])


def snapshot(*, stale_seconds: float | None = None, rounds: int = 5, chart_minutes: int = 60) -> dict:
    """Everything the dashboard and ``dispatchstats`` show, as JSON-ready data."""
    if stale_seconds is None:
        from dispatch_app.conf import dispatch_settings

        stale_seconds = dispatch_settings().HEARTBEAT_STALE_SECONDS
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        generated_at = cursor.fetchone()[0]
        jobs = job_summary(cursor)
        envelopes = envelope_summary(cursor)
        recovery = recovery_summary(cursor, DOMAIN_KEYS, rounds=rounds)
        latency = latency_summary(cursor)
        chart = throughput(cursor, chart_minutes)
        processes = dispatchers(cursor, stale_seconds)
        queue_usage = notification_queue_usage(cursor)
    no_envelopes = {"pending": 0, "due": 0, "dead": 0, "oldest_pending_age": None}
    domains = {}
    for domain in DOMAIN_KEYS:
        job = jobs.get(domain, {"backlog": {s: 0 for s in ACTIVE_STATUSES}, "oldest_candidate_age": None})
        domains[domain] = {
            "backlog": job["backlog"],
            "oldest_candidate_age": job["oldest_candidate_age"],
            "envelopes": envelopes.get(domain, dict(no_envelopes)),
            "recovery": recovery[domain],
            "latency": latency[domain],
        }
    ages = [d["envelopes"]["oldest_pending_age"] for d in domains.values()]
    ages = [a for a in ages if a is not None]
    totals = {
        "backlog": {s: sum(d["backlog"][s] for d in domains.values()) for s in ACTIVE_STATUSES},
        "envelopes": {k: sum(d["envelopes"][k] for d in domains.values()) for k in ("pending", "due", "dead")},
        "oldest_pending_age": max(ages) if ages else None,
        "latency": latency["all"],
    }
    return {
        "generated_at": generated_at.isoformat(),
        "stale_seconds": stale_seconds,
        "domains": domains,
        "totals": totals,
        "dispatchers": processes,
        "notification_queue_usage": queue_usage,
        "throughput": chart,
    }
