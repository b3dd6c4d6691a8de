"""Giving envelopes back during a Redis outage: the attempt is not counted, nothing is dead-lettered.

Separate from ``claim`` (the claim's own SQL), one statement in its own short
transaction, a compare-and-set on the lease token like every other result write.
"""

from __future__ import annotations

import uuid

from django.db import connection

from dispatch_app.dispatch.claim import ENVELOPE

# The claim counted an attempt (send_attempts + 1): an outage takes it back. The
# envelope waits as long as the dispatcher's pause, so other dispatchers (each
# with its own breaker) do not hammer the same refusing server meanwhile.
GIVE_BACK_SQL = f"""
UPDATE {ENVELOPE}
SET lease_token = NULL,
    send_attempts = GREATEST(send_attempts - 1, 0),
    available_at = clock_timestamp() + make_interval(secs => %(delay)s),
    last_error = left(%(error)s, 2000)
WHERE id = ANY(%(ids)s) AND lease_token = %(token)s AND status = 'pending'
"""


def give_back(envelope_ids: list[int], token: uuid.UUID, error: str, delay: float) -> int:
    """Release envelopes whose send failed for a server-wide reason; returns how many this lease still held."""
    if not envelope_ids:
        return 0
    with connection.cursor() as cursor:  # one statement in autocommit, like the claim's (dispatch.claim)
        cursor.execute(GIVE_BACK_SQL, {"ids": envelope_ids, "token": token, "error": error, "delay": delay})
        return cursor.rowcount
