"""A recovery round's re-dispatches, many jobs of one domain in two statements, their due times spread.

The same move as ``transitions.redispatch`` (the state diagram's ``<unfinished> -> submitted`` with the next
attempt and its envelope in the recovery lane), made for a whole batch: each job's compare-and-set is its own
row of an unnest, the envelopes are inserted from the rows that moved, the events follow in one statement.
"""

from __future__ import annotations

from functools import cache

from django.db import connection

import dispatch_app.domains.lanes as lanes
import dispatch_app.store.events as events
from dispatch_app.config.tuning import RECOVERY_SPREAD_STEP
from dispatch_app.domains import get_domain
from dispatch_app.store.envelope_builder import fresh_insert, fresh_params
from dispatch_app.store.tables import ENVELOPE, JOB
from dispatch_app.store.transitions import UNFINISHED, IllegalTransition


@cache
def redispatch_many_sql() -> str:
    columns, values = fresh_insert()
    return (
        "WITH seen(id, attempt, status) AS (SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], "
        "%(statuses)s::text[])), "
        f"moved AS (UPDATE {JOB} j SET attempt = j.attempt + 1, status = 'submitted', error = '', "
        "vendor_request_id = '', started_at = NULL, updated_at = clock_timestamp() FROM seen "
        "WHERE j.id = seen.id AND j.attempt = seen.attempt AND j.status = seen.status AND j.domain = %(domain)s "
        "RETURNING j.id, j.attempt), "
        f"envelopes AS (INSERT INTO {ENVELOPE} (job_id, attempt, domain, queue, available_at{columns}) "
        # Step k (the k-th per_step jobs moved, by id) is due k * step seconds on, floored to the grid: every
        # domain's steps fall on the same instants, so one claim of the dispatcher takes them all (spread_steps).
        "SELECT id, attempt, %(domain)s, %(queue)s, CASE WHEN k = 0 THEN clock_timestamp() ELSE "
        "date_bin(make_interval(secs => %(grid)s::float8), clock_timestamp() + make_interval(secs => "
        "k * %(step)s::float8), TIMESTAMPTZ '2000-01-01 00:00:00+00') END"
        f"{values} FROM (SELECT id, attempt, (row_number() OVER (ORDER BY id) - 1) / %(per_step)s::int AS k "
        "FROM moved) steps "
        "RETURNING job_id, greatest(extract(epoch FROM available_at - created_at), 0)::float8 AS delay) "
        "SELECT m.id, m.attempt, e.delay FROM moved m JOIN envelopes e ON e.job_id = m.id"
    )


def spread_steps(count: int, spread_seconds: float, min_step: float) -> tuple[int, float]:
    """(jobs per step, seconds per step): ``count`` due times spread over ``spread_seconds``, the first at once.

    Steps are at least ``min_step`` apart (each is one more claim for the dispatcher), so a short spread has
    fewer, fuller steps; no spread, or one job: one step of everything, due now.
    """
    if count <= 1 or spread_seconds <= 0 or min_step <= 0:
        return max(count, 1), 0.0
    steps = max(1, min(count, int(spread_seconds / min_step + 1e-9)))
    return -(-count // steps), spread_seconds / steps


def redispatch_many(
    domain: str,
    jobs: list[tuple[int, int, str, str, dict]],
    *,
    kind: str,
    spread_seconds: float = 0.0,
    min_step: float = RECOVERY_SPREAD_STEP,
) -> dict[int, int]:
    """``redispatch`` for many jobs of one domain: two statements, whatever their number.

    ``jobs``: (job id, from attempt, the status it was seen in, the event's reason, the event's data).
    Returns {job id: new attempt} for the jobs that moved; a job missing from it had moved
    on since the caller looked (its compare-and-set failed), and is not touched.
    ``spread_seconds``: 0, every new envelope due now; else their due times step through that span
    (``spread_steps``, in job id order; after the first, each on a grid of ``min_step``), so the batch reaches
    the workers a few at a time. Each event's ``delay_seconds`` says its job's. Must run inside a transaction.
    """
    assert connection.in_atomic_block, "redispatch_many must run inside the caller's transaction"
    if not jobs:
        return {}
    for _, _, status, _, _ in jobs:
        if status not in UNFINISHED:
            raise IllegalTransition(f"only an unfinished job is re-dispatched this way, not a {status!r} one")
    params = {
        "ids": [job[0] for job in jobs],
        "attempts": [job[1] for job in jobs],
        "statuses": [job[2] for job in jobs],
        "domain": domain,
        "queue": lanes.queue_name(get_domain(domain).queue, lanes.for_kind(kind)),
    }
    per_step, step = spread_steps(len(jobs), spread_seconds, min_step)
    spread = {"per_step": per_step, "step": step, "grid": max(min_step, 0.001)}
    with connection.cursor() as cursor:
        cursor.execute(redispatch_many_sql(), {**params, **fresh_params(), **spread})
        rows = cursor.fetchall()
    moved = {job_id: attempt for job_id, attempt, _ in rows}
    delays = {job_id: delay for job_id, _, delay in rows}
    events.record_many(
        {
            "job_id": job_id,
            "attempt": attempt,
            "kind": kind,
            "reason": reason,
            "data": {**data, "next_attempt": moved[job_id], "delay_seconds": round(delays[job_id], 3)},
        }
        for job_id, attempt, _, reason, data in jobs
        if job_id in moved
    )
    return moved
