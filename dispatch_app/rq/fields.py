"""The fields this project adds to RQ's hashes: written by its worker, read by the operator pages and recovery.

RQ ignores fields it does not know, so these ride in RQ's own job and worker hashes. The job hash's signature field
is ``ids.SIGNATURE_FIELD``; the worker hash's PostgreSQL session is ``db.liveness.WORKER_HASH_FIELD``.
"""

from __future__ import annotations

# A job hash: the worker whose take holds it (the take script writes it; the job list says "taken by ...").
TAKEN_BY = "pf_taken_by"
# A worker hash: its last outcomes, the jobs it could not deserialize, its last error (the health view).
RECENT_FIELD = "pf_recent"
UNDESERIALIZABLE_FIELD = "pf_undeserializable"
LAST_ERROR_FIELD = "pf_last_error"
# The beat thread's period, so the dashboard can call a silent worker dead after ~2 periods (rq.state.queues).
HEARTBEAT_INTERVAL_FIELD = "pf_heartbeat_interval"
