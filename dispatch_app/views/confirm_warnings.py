"""What an operator should know before confirming a retry: a retry that cannot run, or will fail the same way.

Per domain of a retry plan (``actions.retry_plan``):
  - no live worker on its queue: the retried jobs will wait in RQ (read live from Redis; unreadable says so);
  - its dispatch is paused: the new envelopes stay in the outbox until someone resumes it;
  - every selected job's last error is the same: the cause (a vendor down) may still be there.
"""

from __future__ import annotations

from django.db import connection

import dispatch_app.actions.operator as actions
import dispatch_app.rq.state.queues as rqside
from dispatch_app.store.tables import JOB


def retry_warnings(plans, job_ids) -> dict[str, list[str]]:
    """{domain: [warning, ...]} for the plans' domains (empty lists when nothing to say)."""
    domains = [p.domain for p in plans]
    out: dict[str, list[str]] = {d: [] for d in domains}
    if not domains:
        return out
    rq = rqside.snapshot()
    with connection.cursor() as cursor:
        paused = actions.paused_domains(cursor)
        cursor.execute(
            f"SELECT domain, count(*), count(DISTINCT split_part(error, E'\\n', 1)), "
            f"min(split_part(error, E'\\n', 1)) FROM {JOB} WHERE id = ANY(%s) AND error <> '' GROUP BY domain",
            [[int(i) for i in job_ids]],
        )
        errors = {d: (n, distinct, first) for d, n, distinct, first in cursor.fetchall()}
    for plan in plans:
        domain, warnings = plan.domain, out[plan.domain]
        queue = (rq.get("domains") or {}).get(domain)
        if queue is None:
            if rq.get("error"):
                warnings.append(f"Redis cannot be read ({rq['error']}): whether a worker serves {domain} is unknown.")
        elif not queue.get("live_workers"):
            warnings.append(
                f"No live worker serves queue {queue.get('queue', domain)}: the retried jobs will wait in RQ "
                "until one starts."
            )
        if domain in paused:
            p = paused[domain]
            warnings.append(
                f"Dispatch of {domain} is paused (by {p['paused_by'] or 'someone'}"
                + (f": {p['reason']}" if p["reason"] else "")
                + "): the retried jobs stay in the outbox until it is resumed."
            )
        n, distinct, first = errors.get(domain, (0, 0, ""))
        if n > 1 and distinct == 1 and n == len(plan.job_ids) + len(plan.refused):
            warnings.append(
                f"All {n} selected jobs last failed with the same error: {first[:200]} — if its cause is still "
                "there, the retries will fail the same way."
            )
    return out
