"""The outbox-age alarm: due work that no dispatcher sends is a red banner, whatever else the page says.

A killed dispatcher, a loop stuck in a hung call, a claim query gone slow: each leaves envelopes due and
pending while the heartbeat may still look fine. What the operator needs to see is the wait itself: per
domain, how long the oldest envelope that is due now (``available_at <= now``) has waited since it became
due. Over ``OUTBOX_AGE_ALARM_SECONDS`` it is a red banner.

"Since it became due" is the attempt's due instant (``JobAttempt.due_at``: a scheduled submit, a retry
backoff), else its creation, but never after ``available_at`` (an operator's "due now" cuts a delay short).
A lease that ran out does not restart the wait: the envelope was due before its claim. A paused domain is
not alarming (an operator holds it on purpose; its amber banner says so, with the wait); its wait counts
again only from its last resume, so a resume does not raise a stale alarm for time it spent paused. All on
the database clock.
"""

from __future__ import annotations

from dispatch_app.store.tables import ATTEMPT, ENVELOPE

PAUSE_EVENT = "dispatch_app_domainpauseevent"

OLDEST_DUE_SQL = f"""
WITH t AS (SELECT clock_timestamp() AS now),
resumed AS (SELECT domain, max(at) AS at FROM {PAUSE_EVENT} WHERE op = 'resume' GROUP BY domain)
SELECT e.domain, count(*),
       GREATEST(extract(epoch FROM t.now - min(GREATEST(
           LEAST(GREATEST(e.created_at, COALESCE(a.due_at, e.created_at)), e.available_at),
           COALESCE(r.at, '-infinity'::timestamptz)))), 0)::float8
FROM {ENVELOPE} e CROSS JOIN t
LEFT JOIN {ATTEMPT} a ON a.job_id = e.job_id AND a.attempt = e.attempt
LEFT JOIN resumed r ON r.domain = e.domain
WHERE e.status = 'pending' AND e.available_at <= t.now
GROUP BY e.domain, t.now
"""


def oldest_due(cursor) -> dict[str, dict]:
    """{domain: {"due": n, "oldest_due_age": seconds}} for domains with due, pending envelopes."""
    cursor.execute(OLDEST_DUE_SQL)
    return {domain: {"due": n, "oldest_due_age": round(age, 3)} for domain, n, age in cursor.fetchall()}


def judge(waits: dict[str, dict], paused: dict, threshold: float) -> dict[str, dict]:
    """Each domain's wait with ``alarm`` (over the threshold, not paused) and ``paused`` set."""
    return {
        domain: {
            **w,
            "threshold": threshold,
            "paused": domain in paused,
            "alarm": domain not in paused and w["oldest_due_age"] > threshold,
        }
        for domain, w in waits.items()
    }


def banners(judged: dict[str, dict], fmt_duration) -> list[dict]:
    """One red banner per alarming domain; a paused domain gets none (its pause banner names the wait)."""
    out = []
    for domain, w in sorted(judged.items()):
        if not w["alarm"]:
            continue
        out.append(
            {
                "level": "error",
                "key": "outbox-age",
                "text": f"{domain}: the oldest due envelope has waited {fmt_duration(w['oldest_due_age'])} in the "
                f"outbox ({w['due']} due, not dispatched; alarm above {w['threshold']:g} s, "
                "OUTBOX_AGE_ALARM_SECONDS).",
                "link": f"envelopes:status__exact=pending&due=now&domain__exact={domain}",
                "domain": domain,
            }
        )
    return out


def paused_note(wait: dict | None, fmt_duration) -> str:
    """What a paused domain's banner adds about its due envelopes ("" when none wait)."""
    if not wait:
        return ""
    return f"; {wait['due']} due envelope(s) held, the oldest for {fmt_duration(wait['oldest_due_age'])}"
