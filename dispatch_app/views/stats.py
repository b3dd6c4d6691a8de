"""The operators' numbers, computed in SQL against the database clock.

One module, three readers: the admin dashboard, ``manage.py dispatchstats`` and
the Prometheus collector. Each function takes a cursor and runs one statement
that reads ``clock_timestamp()`` once, so every age in a result is measured
from the same instant of the database's clock, never the host's.

Definitions (docs/operations.md repeats them for operators):

- backlog: unfinished jobs per status (submitted = in the outbox, queued = in
  the RQ queue, running = on a worker).
- oldest recovery-candidate age: the longest time an unfinished job of the
  domain has spent in its current stage (running: since its attempt started;
  queued: since its attempt was dispatched; submitted: since its attempt was
  due), dispatch_app.timeline.stage_sql.STAGE_START_SQL. Not updated_at: recovery touches
  updated_at when it leaves a job alone, which would reset the age.
- oldest pending envelope age: now - created_at of the oldest pending envelope,
  not counting envelopes deliberately scheduled for later and never tried
  (send_attempts = 0 AND available_at in the future). Backoffs and leases count.
- dispatch latency: per attempt (JobAttempt, dispatch_app.timeline.stages), the outbox
  wait due -> dispatched (a retry backoff or a scheduled submit is its own
  stage, "backoff", reported apart), the RQ-queue wait dispatched -> started,
  over attempts dispatched in the window.
- domains: the registered ones, plus any other domain that still has rows
  (a domain no longer registered keeps its dead envelopes visible).
- effective recovery rate: (redispatched + unknown + failed) / scanned over the
  rounds started in the last hour.
"""

from __future__ import annotations

import dispatch_app.db.liveness as liveness
import dispatch_app.timeline.stage_sql as stage_sql
import dispatch_app.views.sections as sections
from dispatch_app.domains import domain_keys
from dispatch_app.models import ACTIVE_STATUSES
from dispatch_app.store.tables import ATTEMPT, ENVELOPE, JOB

ROUND = "dispatch_app_recoveryround"
PROCESS = "dispatch_app_dispatcherprocess"
HEARTBEAT = "dispatch_app_loopheartbeat"

WINDOWS_MINUTES = (5, 60)
PERCENTILES = (0.5, 0.95, 0.99)
EFFECTIVE_KINDS = ("redispatched", "unknown", "failed")
DECISION_KINDS = ("redispatched", "left_alone", "unknown", "failed", "skipped", "errors")
RATE_WINDOW_MINUTES = 60
# stage_sql.WINDOW_STAGES -> the snapshot's keys (kept from before per-attempt stages, for the dashboard and --json).
LATENCY_KEYS = {"outbox": "submitted_to_dispatched", "rq": "dispatched_to_started", "backoff": "backoff"}


def _num(value, digits: int = 6):
    return None if value is None else round(float(value), digits)


def job_summary(cursor) -> dict[str, dict]:
    """Backlog by status and the oldest recovery-candidate age (time in the current stage), per domain."""
    cursor.execute(
        f"""
        WITH t AS (SELECT clock_timestamp() AS now)
        SELECT j.domain, j.status, count(*),
               GREATEST(extract(epoch FROM t.now - min({stage_sql.STAGE_START_SQL})), 0)
        FROM {JOB} j CROSS JOIN t
        LEFT JOIN {ATTEMPT} a ON a.job_id = j.id AND a.attempt = j.attempt
        LEFT JOIN {ENVELOPE} e ON e.job_id = j.id AND e.attempt = j.attempt
        WHERE j.status = ANY(%s) GROUP BY j.domain, j.status, t.now
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


def latency_summary(cursor, windows=WINDOWS_MINUTES, domains=()) -> dict[str, dict]:
    """p50/p95/p99 per window, per domain and for all domains ("all"), of each attempt's stages (timeline.stages).

    Keys: "submitted_to_dispatched" = the outbox stage (due -> dispatched, backoff excluded),
    "dispatched_to_started" = the RQ-queue stage, "backoff" = attempts that had a backoff or a scheduled delay.
    """

    def pcts(count, values):
        names = ("p50", "p95", "p99")
        return {
            "count": count,
            **{n: (_num(v) if count else None) for n, v in zip(names, values or [None] * 3, strict=True)},
        }

    out: dict[str, dict] = {}
    for minutes, domain, stage, count, values in stage_sql.percentiles(cursor, windows, PERCENTILES):
        window = out.setdefault(domain or "all", {}).setdefault(f"{minutes}m", {})
        window[LATENCY_KEYS[stage]] = pcts(count, values)
    for domain in ("all", *domain_keys(), *domains, *out):
        for minutes in windows:
            window = out.setdefault(domain, {}).setdefault(f"{minutes}m", {})
            for key in LATENCY_KEYS.values():
                window.setdefault(key, pcts(0, None))
    return out


def throughput(cursor, minutes: int = 60) -> list[dict]:
    """Attempts dispatched per minute and their p95 outbox wait (backoff excluded), oldest minute first (the chart)."""
    by_minute = stage_sql.per_minute(cursor, minutes)
    series = []
    for ago in range(minutes - 1, -1, -1):
        count, p95 = by_minute.get(ago, (0, None))
        series.append({"minutes_ago": ago, "dispatched": count, "p95": _num(p95)})
    return series


def dispatchers(cursor, stale_seconds: float) -> list[dict]:
    """Running dispatcher processes (not stopped) and each loop's last successful tick; stale ones flagged.

    A process whose PostgreSQL session is gone (``dispatch_app.db.liveness``; killed, host lost) is stale at
    once (``session_alive`` False), whatever its last heartbeat says.
    """
    cursor.execute(
        f"""
        WITH t AS (SELECT clock_timestamp() AS now)
        SELECT p.id, p.name, p.session, p.hostname, p.pid, extract(epoch FROM t.now - p.started_at),
               extract(epoch FROM t.now - p.last_seen_at), extract(epoch FROM p.last_seen_at - p.started_at),
               h.loop, extract(epoch FROM t.now - h.last_tick_at), h.errors, h.last_error,
               extract(epoch FROM t.now - h.last_error_at)
        FROM {PROCESS} p CROSS JOIN t
        LEFT JOIN {HEARTBEAT} h ON h.process_id = p.id
        WHERE p.stopped_at IS NULL
        ORDER BY p.started_at, p.id, h.loop
        """
    )
    rows = cursor.fetchall()
    sessions = liveness.live_tags(cursor, {row[2] for row in rows if row[2]})
    out: dict[int, dict] = {}
    for pid_, name, tag, host, pid, up, seen, lived, loop, tick, errors, last_error, error_age in rows:
        # None: it names no session (not connected yet, an older version): its heartbeat alone tells.
        session = (tag in sessions) if tag else None
        stale = float(seen) > stale_seconds or session is False
        process = out.setdefault(
            pid_,
            {
                "name": name,
                "hostname": host,
                "pid": pid,
                # A dead process was up until its last heartbeat: its uptime stops there, it does not count on.
                "uptime": _num(max(float(lived), 0.0) if stale else up, 3),
                "last_seen_age": _num(seen, 3),
                "session_alive": session,
                "stale": stale,
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


def _clock(cursor):
    cursor.execute("SELECT clock_timestamp()")
    return cursor.fetchone()[0]


# What a section that could not be read leaves in the snapshot: unknown (None, shown "–"), never a zero.
UNKNOWN_BACKLOG = dict.fromkeys(ACTIVE_STATUSES)
UNKNOWN_ENVELOPES = {"pending": None, "due": None, "dead": None, "oldest_pending_age": None}
UNKNOWN_RECOVERY = {"rounds": [], "effective_rate": None, "scanned_last_hour": None}


def _total(values):
    """A sum over domains, or None when any domain's value is unknown."""
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


def snapshot(*, stale_seconds: float | None = None, rounds: int = 5, chart_minutes: int = 60, read=None) -> dict:
    """Everything the dashboard and ``dispatchstats`` show, as JSON-ready data.

    ``read(name, fn, fallback)`` runs each part (``views.sections``: the dashboard bounds each one and notes the
    unreadable ones); by default each runs as it is. A part that could not be read is None (unknown) in the
    result: ``dispatchers`` None is "not read", not "no dispatcher".
    """
    read = read or sections.direct
    if stale_seconds is None:
        from dispatch_app.config.settings import dispatch_settings

        stale_seconds = dispatch_settings().HEARTBEAT_STALE_SECONDS
    generated_at = read("clock", _clock)
    jobs = read("jobs", job_summary)
    envelopes = read("envelopes", envelope_summary)
    # Registered domains first, then any other domain that still has rows (no longer registered).
    seen = set(jobs or {}) | set(envelopes or {})
    known = [*domain_keys(), *sorted(seen - set(domain_keys()))]
    recovery = read("recovery", lambda c: recovery_summary(c, known, rounds=rounds)) or {}
    latency = read("latency", lambda c: latency_summary(c, domains=known)) or {}
    chart = read("throughput", lambda c: throughput(c, chart_minutes), [])
    processes = read("dispatchers", lambda c: dispatchers(c, stale_seconds))
    queue_usage = read("notify_queue", notification_queue_usage)
    no_envelopes = {"pending": 0, "due": 0, "dead": 0, "oldest_pending_age": None}
    no_jobs = {"backlog": {s: 0 for s in ACTIVE_STATUSES}, "oldest_candidate_age": None}
    unknown_jobs = {"backlog": dict(UNKNOWN_BACKLOG), "oldest_candidate_age": None}
    domains = {}
    for domain in known:
        job = (jobs.get(domain, no_jobs)) if jobs is not None else unknown_jobs
        domains[domain] = {
            "backlog": dict(job["backlog"]),
            "oldest_candidate_age": job["oldest_candidate_age"],
            "envelopes": dict(envelopes.get(domain, no_envelopes) if envelopes is not None else UNKNOWN_ENVELOPES),
            "recovery": recovery.get(domain, dict(UNKNOWN_RECOVERY)),
            "latency": latency.get(domain, {}),
            "registered": domain in domain_keys(),
        }
    ages = [d["envelopes"]["oldest_pending_age"] for d in domains.values()]
    ages = [a for a in ages if a is not None]
    totals = {
        "backlog": {s: _total(d["backlog"][s] for d in domains.values()) for s in ACTIVE_STATUSES},
        "envelopes": {k: _total(d["envelopes"][k] for d in domains.values()) for k in ("pending", "due", "dead")},
        "oldest_pending_age": max(ages) if ages else None,
        "latency": latency.get("all", {}),
    }
    return {
        "generated_at": generated_at.isoformat() if generated_at else None,
        "stale_seconds": stale_seconds,
        "domains": domains,
        "totals": totals,
        "dispatchers": processes,
        "notification_queue_usage": queue_usage,
        "throughput": chart,
    }
