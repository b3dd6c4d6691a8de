"""The failure alarm: a domain whose jobs fail (a vendor down, a bad deploy) is a red banner, not a green page.

Business failures finish normally in RQ (the task catches them and records ``failed``), so RQ's own counts
stay green while every job fails; the truth is the attempts' outcomes in PostgreSQL. Per domain, over
``FAILURE_ALARM_WINDOW`` seconds on the database clock: the share of jobs that ended failed or
outcome_unknown. At or above ``FAILURE_ALARM_RATE`` (with at least ``FAILURE_ALARM_MIN_ENDED`` endings) the
banner names the domain, the rate and the top errors grouped by message (the error's first line: the
exception's class and message), each with its count and a link to those jobs.
"""

from __future__ import annotations

from urllib.parse import urlencode

from dispatch_app.store.tables import ATTEMPT

ENDED = ("succeeded", "failed", "outcome_unknown", "cancelled")
BAD = ("failed", "outcome_unknown")
TOP_ERRORS = 3
MESSAGE_CHARS = 200  # the grouping key: the error's first line, cut here (the list filter matches its start)
# The job list's finished_within choices (admin.filters.FinishedWithinFilter), narrowest first.
LIST_WINDOWS = (("5m", 300), ("1h", 3600), ("1d", 86_400))


def failure_rates(cursor, conf) -> dict[str, dict]:
    """{domain: {ended, failed, rate, window, alarm, errors: [{message, count, link}]}} for domains with endings."""
    window = conf.FAILURE_ALARM_WINDOW
    cursor.execute(
        f"""
        SELECT a.domain, count(*) FILTER (WHERE a.outcome = ANY(%(ended)s)),
               count(*) FILTER (WHERE a.outcome = ANY(%(bad)s))
        FROM {ATTEMPT} a
        WHERE a.finished_at >= clock_timestamp() - make_interval(secs => %(window)s)
        GROUP BY a.domain
        """,
        {"ended": list(ENDED), "bad": list(BAD), "window": window},
    )
    out = {}
    for domain, ended, failed in cursor.fetchall():
        rate = failed / ended if ended else 0.0
        alarm = ended >= conf.FAILURE_ALARM_MIN_ENDED and failed > 0 and rate >= conf.FAILURE_ALARM_RATE
        out[domain] = {"ended": ended, "failed": failed, "rate": rate, "window": window, "alarm": alarm, "errors": []}
    alarming = [d for d, v in out.items() if v["alarm"]]
    if alarming:
        for domain, message, count in _top_errors(cursor, alarming, window):
            out[domain]["errors"].append(
                {"message": message, "count": count, "link": error_link(domain, message, window)}
            )
    return out


def _top_errors(cursor, domains: list[str], window: float) -> list[tuple[str, str, int]]:
    cursor.execute(
        f"""
        SELECT domain, message, n FROM (
            SELECT a.domain, left(split_part(a.error, E'\\n', 1), %(chars)s) AS message, count(*) AS n,
                   row_number() OVER (PARTITION BY a.domain ORDER BY count(*) DESC,
                                      left(split_part(a.error, E'\\n', 1), %(chars)s)) AS place
            FROM {ATTEMPT} a
            WHERE a.finished_at >= clock_timestamp() - make_interval(secs => %(window)s)
              AND a.outcome = ANY(%(bad)s) AND a.domain = ANY(%(domains)s)
            GROUP BY a.domain, message
        ) ranked WHERE place <= %(top)s ORDER BY domain, place
        """,
        {"chars": MESSAGE_CHARS, "window": window, "bad": list(BAD), "domains": domains, "top": TOP_ERRORS},
    )
    return cursor.fetchall()


def list_window(seconds: float) -> str:
    """The narrowest finished_within choice of the job list that covers the alarm's window."""
    return next((key for key, span in LIST_WINDOWS if span >= seconds), LIST_WINDOWS[-1][0])


def error_link(domain: str, message: str, window: float) -> str:
    """The job list's query for one error of one domain (the list's own filter parameters)."""
    params = {"domain__exact": domain, "finished_within": list_window(window)}
    if message:
        params["error"] = message
    return urlencode(params)


def banners(rates: dict[str, dict]) -> list[dict]:
    """One red banner per alarming domain, with its top errors and a Pause button (the template adds it)."""
    out = []
    for domain, r in sorted(rates.items()):
        if not r["alarm"]:
            continue
        minutes = r["window"] / 60
        window = f"{minutes:g} min" if minutes >= 1 else f"{r['window']:g} s"
        out.append(
            {
                "level": "error",
                "key": "failure-rate",
                "text": f"{domain}: {r['rate'] * 100:.0f}% of its jobs failed in the last {window} "
                f"({r['failed']} of {r['ended']} ended failed or outcome_unknown).",
                "link": urlencode({"domain__exact": domain, "finished_within": list_window(r["window"])}),
                "domain": domain,
                "errors": r["errors"],
                "pause_domain": domain,
            }
        )
    return out


def worker_outcomes(cursor, minutes: int = 60) -> dict[str, dict]:
    """{worker: {succeeded, failed}}: how the jobs each worker ran ended (PostgreSQL's word, not RQ's: a business
    failure is a job RQ saw finish normally)."""
    cursor.execute(
        f"""
        SELECT a.worker, count(*) FILTER (WHERE a.outcome = 'succeeded'),
               count(*) FILTER (WHERE a.outcome = ANY(%(bad)s))
        FROM {ATTEMPT} a
        WHERE a.finished_at >= clock_timestamp() - make_interval(mins => %(m)s) AND a.worker <> ''
        GROUP BY a.worker
        """,
        {"bad": list(BAD), "m": minutes},
    )
    return {w: {"succeeded": ok, "failed": bad} for w, ok, bad in cursor.fetchall()}
