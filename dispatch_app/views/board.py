"""The dashboard's live data: stats.snapshot() plus the RQ side, failures, pauses, per-domain charts and banners.

One function, ``build()``, feeds the dashboard page, its self-refreshing
fragment, its JSON endpoint and ``dispatchstats``. SQL ages read the database
clock; stage times come from ``dispatch_app.timeline.stages`` (one definition).
"""

from __future__ import annotations

import dispatch_app.actions.operator as actions
import dispatch_app.rq.state.queues as rqside
import dispatch_app.rq.state.refusals as refusals
import dispatch_app.timeline.stage_sql as stage_sql
import dispatch_app.views.alarms as alarms
import dispatch_app.views.blockers as blockers
import dispatch_app.views.coverage as coverage
import dispatch_app.views.outbox_alarm as outbox_alarm
import dispatch_app.views.sections as sections
import dispatch_app.views.stats as stats
from dispatch_app.domains import domain_keys
from dispatch_app.store.tables import ATTEMPT, JOB

WINDOWS = (5, 60)  # minutes: failure counts and rates
RATE_MINUTES = 5  # jobs per minute started / finished, averaged over this many minutes
CHART_MINUTES = 60
BAD_OUTCOMES = ("failed", "outcome_unknown")
# What the dispatch loop's heartbeat says while its Redis breaker holds dispatch (housekeeping.heartbeat.PAUSED).
DISPATCH_PAUSED = "dispatch paused: "
RECOVERY_PROCESS = "recovery-process"  # runtime.recovery_process.NAME: the supervised recovery child
ENDED = ("succeeded", "failed", "outcome_unknown", "cancelled")


def failures(cursor) -> dict[str, dict]:
    """{domain: {"5m": {ended, failed, outcome_unknown, rate}, "60m": ...}} over attempts that ended in the window.

    Attempts a later attempt replaced (``superseded``: a retry after a vendor failure, a recovery
    re-dispatch) are not endings; a job counts once, when its last attempt ends.
    """
    cursor.execute(
        f"""
        WITH t AS (SELECT clock_timestamp() AS now)
        SELECT w.minutes, a.domain,
               count(*) FILTER (WHERE a.outcome = ANY(%(ended)s)),
               count(*) FILTER (WHERE a.outcome = 'failed'),
               count(*) FILTER (WHERE a.outcome = 'outcome_unknown')
        FROM {ATTEMPT} a CROSS JOIN t CROSS JOIN unnest(%(windows)s::int[]) AS w(minutes)
        WHERE a.finished_at >= t.now - make_interval(mins => %(widest)s)
          AND a.finished_at >= t.now - make_interval(mins => w.minutes)
        GROUP BY w.minutes, a.domain
        """,
        {"ended": list(ENDED), "windows": list(WINDOWS), "widest": max(WINDOWS)},
    )
    out = {d: {f"{m}m": _fail_entry(0, 0, 0) for m in WINDOWS} for d in domain_keys()}
    for minutes, domain, ended, failed, unknown in cursor.fetchall():
        out.setdefault(domain, {f"{m}m": _fail_entry(0, 0, 0) for m in WINDOWS})[f"{minutes}m"] = _fail_entry(
            ended, failed, unknown
        )
    return out


def _fail_entry(ended: int, failed: int, unknown: int) -> dict:
    return {
        "ended": ended,
        "failed": failed,
        "outcome_unknown": unknown,
        "rate": round((failed + unknown) / ended, 4) if ended else None,
    }


def activity(cursor, minutes: int = RATE_MINUTES) -> dict[str, dict]:
    """Jobs per minute started and finished by workers, per domain, averaged over the last ``minutes``.

    Started in the window = attempts that ended in it after starting in it (index on finished_at) plus jobs
    running now that started in it (index on status): no scan of the whole history.
    """
    cursor.execute(
        f"""
        WITH t AS (SELECT clock_timestamp() - make_interval(mins => %(m)s) AS since),
        ended AS (
            SELECT a.domain, count(*) FILTER (WHERE a.started_at >= t.since) AS started,
                   count(*) FILTER (WHERE a.started_at IS NOT NULL) AS finished
            FROM {ATTEMPT} a CROSS JOIN t WHERE a.finished_at >= t.since GROUP BY a.domain
        ), running AS (
            SELECT j.domain, count(*) AS started
            FROM {JOB} j CROSS JOIN t WHERE j.status = 'running' AND j.started_at >= t.since GROUP BY j.domain
        )
        SELECT COALESCE(e.domain, r.domain), COALESCE(e.started, 0) + COALESCE(r.started, 0), COALESCE(e.finished, 0)
        FROM ended e FULL JOIN running r ON r.domain = e.domain
        """,
        {"m": minutes},
    )
    out = {d: {"started_per_min": 0.0, "finished_per_min": 0.0} for d in domain_keys()}
    for domain, started, finished in cursor.fetchall():
        out[domain] = {"started_per_min": round(started / minutes, 2), "finished_per_min": round(finished / minutes, 2)}
    return out


def charts(cursor, minutes: int = CHART_MINUTES) -> dict[str, list[dict]]:
    """Per domain, one point per minute (oldest first): dispatched, p95 outbox and RQ waits (by dispatch
    minute), finished and failed (by finish minute)."""
    # Attempts still waiting in RQ have no dispatch in their history row yet: stages reads their envelopes.
    dispatched = stage_sql.per_minute_by_domain(cursor, minutes)
    cursor.execute(
        f"""
        WITH t AS (SELECT clock_timestamp() AS now)
        SELECT a.domain, floor(extract(epoch FROM t.now - a.finished_at) / 60)::int AS ago,
               count(*) FILTER (WHERE a.started_at IS NOT NULL OR a.outcome <> 'superseded'),
               count(*) FILTER (WHERE a.outcome = ANY(%s))
        FROM {ATTEMPT} a CROSS JOIN t
        WHERE a.finished_at >= t.now - make_interval(mins => %s)
        GROUP BY a.domain, ago
        """,
        [list(BAD_OUTCOMES), minutes],
    )
    finished = {(d, ago): (n, bad) for d, ago, n, bad in cursor.fetchall()}
    out = {}
    for domain in domain_keys():
        series = []
        for ago in range(minutes - 1, -1, -1):
            n, outbox, rq = dispatched.get((domain, ago), (0, None, None))
            done, bad = finished.get((domain, ago), (0, 0))
            series.append(
                {
                    "minutes_ago": ago,
                    "dispatched": n,
                    "outbox_p95": stats._num(outbox),
                    "rq_p95": stats._num(rq),
                    "finished": done,
                    "failed": bad,
                }
            )
        out[domain] = series
    return out


def banners(data: dict) -> list[dict]:
    """Red (``error``) and amber (``warning``) lines for the top of the dashboard, most urgent first."""
    out = _dispatcher_banners(data)
    rq = data["rq"]
    if rq["error"]:
        out.append(_banner("error", "redis", f"Redis cannot be read: {rq['error']}."))
    out.extend(outbox_alarm.banners(data.get("outbox_alarms") or {}, _dur))
    out.extend(_domain_banners(data))
    out.extend(alarms.banners(data.get("failure_alarms") or {}))
    out.extend(blockers.dead_worker_banners(data.get("running_workers") or [], rq))
    out.extend(data.get("prefetched_by_dead") or [])
    out.extend(_worker_banners(data))
    out.extend(_paused_banners(data))
    return out


def _banner(level: str, key: str, text: str, link: str = "") -> dict:
    # A link's query uses the list filters' own parameters (domain__exact, status__exact, stage), so the list it
    # opens shows those filters selected, not "All" over a list that is filtered all the same.
    return {"level": level, "key": key, "text": text, "link": link}


def _dispatcher_banners(data: dict) -> list[dict]:
    """No live dispatcher; a stale process or loop; a paused dispatch; a failing recovery child."""
    out: list[dict] = []
    # None: not read (a "cannot be read" banner says so), which is not "no dispatcher".
    processes = data["dispatchers"] if data["dispatchers"] is not None else []
    live = [p for p in processes if not p["stale"]]
    if not live and data["dispatchers"] is not None:
        out.append(
            _banner("error", "no-dispatcher", "No live dispatcher: nothing moves envelopes from the outbox to RQ.")
        )
    coverage.mark(processes)
    for p in processes:
        if p["stale"]:
            # A process gone silent (killed, host lost) stays listed until retention forgets it, but its banner
            # only while some loop it ran runs nowhere live (views.coverage): amber, since "no live dispatcher"
            # above is the red one when nothing replaced it.
            if p["uncovered"]:
                takeover = (
                    f"no live dispatcher runs: {', '.join(p['uncovered'])}." if live else "none is live to take over."
                )
                out.append(
                    _banner(
                        "warning",
                        "stale-process",
                        f"Dispatcher {p['name']} is STALE: last seen {_ago(p['last_seen_age'])} (stopped without "
                        f"notice?); {takeover}",
                    )
                )
            continue
        for loop in p["loops"]:
            out.extend(_loop_banners(p["name"], loop))
    return out


def _loop_banners(process: str, loop: dict) -> list[dict]:
    out: list[dict] = []
    if loop["stale"]:
        out.append(
            _banner(
                "error",
                "stale-loop",
                f"Loop {loop['loop']} of {process} is STALE: last successful tick {_ago(loop['last_tick_age'])}"
                + (f" (last error: {loop['last_error']})" if loop["last_error"] else "")
                + ".",
            )
        )
    error = loop.get("last_error") or ""
    if error.startswith(DISPATCH_PAUSED):
        # The dispatch loop's breaker (Redis as a whole refuses sends): it ticks, but sends nothing.
        out.append(_banner("error", "dispatch-paused", f"{process}: {error}."))
    elif loop["loop"] == RECOVERY_PROCESS and error and _newer(loop["last_error_age"], loop["last_tick_age"]):
        out.append(_banner("error", "recovery-process", f"Recovery child process of {process}: {error}."))
    return out


def _domain_banners(data: dict) -> list[dict]:
    """Per domain: jobs waiting in RQ with no live worker; dead envelopes."""
    out: list[dict] = []
    rq = data["rq"]
    for domain, d in data["domains"].items():
        r = d.get("rq") or {}
        queued = d["backlog"].get("queued") or 0
        if (r.get("depth") or queued) and r.get("live_workers") == 0 and not rq["error"]:
            out.append(
                _banner(
                    "error",
                    "no-worker",
                    f"{domain}: {r.get('depth', 0)} job(s) waiting in RQ queue {r.get('queue', domain)} "
                    f"({queued} queued in PostgreSQL) and no live worker listens on it"
                    + (f"; the oldest has waited {_dur(r.get('oldest_wait'))}" if r.get("oldest_wait") else "")
                    + ".",
                    f"stage=rq&domain__exact={domain}",
                )
            )
        dead = d["envelopes"]["dead"]
        if dead:
            out.append(
                _banner(
                    "error",
                    "dead-envelopes",
                    f"{domain}{'' if d.get('registered', True) else ' (not a registered domain)'}: {dead} dead "
                    "envelope(s): their jobs will not be sent until re-armed.",
                    f"envelopes:status__exact=dead&domain__exact={domain}",
                )
            )
    return out


def _worker_banners(data: dict) -> list[dict]:
    """A worker failing every job; jobs the workers refused (forged or foreign: rq.worker.admission)."""
    out = [
        _banner(
            "error",
            "failing-worker",
            f"Worker {w['name']} on {w['hostname']} fails every job ({w['failed']} failed, {w['successful']} "
            "succeeded; a misconfigured worker: serializer, import path?)"
            + (f": {w['last_error']}" if w.get("last_error") else "")
            + ".",
        )
        for w in data["rq"]["workers"]
        if w["failing_every_job"]
    ]
    refused = data.get("refused") or {}
    if refused.get("count"):
        last = refused["last_func"] or refused["last_kind"]
        out.append(
            _banner("error", "refused-jobs", f"{refused['count']} jobs refused: not the project's work, last: {last}")
        )
    return out


def _paused_banners(data: dict) -> list[dict]:
    alarms_by_domain = data.get("outbox_alarms") or {}
    return [
        _banner(
            "warning",
            "paused",
            f"{domain}: dispatch paused {_ago(p['age'])} by {p['paused_by']}"
            + (f" ({p['reason']})" if p["reason"] else "")
            + "; its envelopes stay pending"
            + outbox_alarm.paused_note(alarms_by_domain.get(domain), _dur)
            + ".",
        )
        for domain, p in data["paused"].items()
    ]


def _newer(age, than) -> bool:
    """An event ``age`` seconds ago happened after one ``than`` seconds ago (None = never)."""
    return age is not None and (than is None or age < than)


def _dur(seconds) -> str:
    from dispatch_app.views.timeline import format_duration

    return format_duration(seconds)


def _ago(seconds) -> str:
    return "never" if seconds is None else f"{_dur(seconds)} ago"


RQ_NOT_READ = {"error": "", "queues": {}, "workers": [], "domains": {}}


def build(*, redis_conn=None) -> dict:
    """Everything the dashboard shows, JSON-ready. Each PostgreSQL read is a bounded section (views.sections):
    one that fails or runs out of time is unknown on the page and named in a banner, and the rest still reads."""
    from dispatch_app.config.settings import dispatch_settings
    from dispatch_app.domains.policy import resolve_all

    conf = dispatch_settings()
    parts = sections.Sections(conf.DASHBOARD_STATEMENT_TIMEOUT)
    read = parts.read
    snap = stats.snapshot(read=read)
    rq = read("rq", lambda _: rqside.snapshot(redis_conn), dict(RQ_NOT_READ))
    fails = read("failures", failures, {})
    rates = read("activity", activity, {})
    series = read("charts", charts, {})
    paused = read("paused", actions.paused_domains, {})
    failure_alarms = read("failure_alarms", lambda c: alarms.failure_rates(c, conf), {})
    by_worker = read("worker_outcomes", alarms.worker_outcomes, {})
    running = read("running_workers", blockers.running_workers, [])
    waits = read("waits", blockers.domain_waits, {})
    oldest_due = read("outbox_due", outbox_alarm.oldest_due, {})
    due_waits = outbox_alarm.judge(oldest_due, paused, conf.OUTBOX_AGE_ALARM_SECONDS)

    policies = resolve_all(conf.RECOVERY)
    for domain, d in snap["domains"].items():
        d["registered"] = domain in policies
        d["retry_safe"] = policies[domain].retry_safe if domain in policies else None
        d["rq"] = rq["domains"].get(domain, {})
        d["failures"] = fails.get(domain)
        d["activity"] = rates.get(domain)
        d["chart"] = series.get(domain, [])
        d["paused"] = paused.get(domain)
        d["waits"] = waits.get(domain, {"not_due": 0, "leased": 0, "next_due_in": None})
        d["outbox_due"] = due_waits.get(domain)
    for w in rq["workers"]:
        # The jobs it ran, as PostgreSQL recorded their end (RQ counts a business failure as a success).
        w["jobs_1h"] = by_worker.get(w["name"], {"succeeded": 0, "failed": 0})
    snap["rq"] = rq
    snap["paused"] = paused
    snap["failure_alarms"] = failure_alarms
    snap["outbox_alarms"] = due_waits
    snap["running_workers"] = running
    snap["prefetched_by_dead"] = read("prefetched", lambda _: blockers.prefetched_by_dead(snap["domains"], rq), [])
    snap["refused"] = refusals.totals(redis_conn)
    snap["unreadable"] = parts.unreadable
    snap["banners"] = sections.banners(parts.unreadable, conf.DASHBOARD_STATEMENT_TIMEOUT) + banners(snap)
    return snap
