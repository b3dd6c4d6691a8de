"""The operator's envelope moves: make one due now, re-arm a dead one (its columns new again: ``envelope_builder``).

The dispatcher's own statements (claim, mark, fail, release) are in ``store.claim``.
"""

from __future__ import annotations

from functools import cache

import dispatch_app.store.transitions as transitions
from dispatch_app.store.envelope_builder import fresh_params, fresh_set
from dispatch_app.store.tables import ENVELOPE

MAKE_DUE_SQL = f"""
UPDATE {ENVELOPE} SET available_at = clock_timestamp()
WHERE id = %s AND status = 'pending' AND lease_token IS NULL AND available_at > clock_timestamp()
RETURNING job_id, attempt
"""


def make_due_now(cursor, envelope_id: int) -> tuple[int, int] | None:
    """A pending envelope waiting on a backoff or a delay is due now: (job id, attempt); None if it is not one."""
    cursor.execute(MAKE_DUE_SQL, [envelope_id])
    return cursor.fetchone()


@cache
def _rearm_sql() -> str:
    # The error that killed it stays on the envelope (the operator's event quotes it); the rest is new.
    return f"""
WITH env AS (
    UPDATE {ENVELOPE} SET {fresh_set(keep=("last_error",))}, available_at = clock_timestamp()
    WHERE id = %(id)s AND status = 'dead'
    RETURNING id, job_id, attempt, last_error
), job AS (
    -- failed | submitted -> submitted, same attempt (store.transitions owns the job's side)
    {transitions.REARM_CTE}
)
SELECT env.job_id, env.attempt, env.last_error, (SELECT count(*) FROM job) FROM env
"""


def rearm(cursor, envelope_id: int) -> tuple[int, int, str] | None:
    """A dead envelope pending again with a fresh send budget, its job submitted again for the same attempt:
    (job id, attempt, the error that killed it); None if the envelope is not dead."""
    cursor.execute(_rearm_sql(), {"id": envelope_id, **fresh_params()})
    row = cursor.fetchone()
    return None if row is None else row[:3]
