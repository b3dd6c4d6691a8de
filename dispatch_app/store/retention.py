"""Pruning in bounded batches: dispatched envelopes, recovery rounds, dispatcher processes (``housekeeping.retention``
runs it).

Each batch is its own short transaction deleting at most ``batch_size`` rows picked with FOR UPDATE SKIP LOCKED
(a row a dispatcher or an operator holds is left for next time). Ages are on the database clock.
"""

from __future__ import annotations

from django.db import connection, transaction

from dispatch_app.models import DispatcherProcess, LoopHeartbeat, RecoveryRound
from dispatch_app.store.tables import ATTEMPT, ENVELOPE

# key -> (table, which rows are old, their order, the DISPATCH setting with the age kept)
TABLES = {
    "envelopes": (
        ENVELOPE,
        "status = 'dispatched' AND dispatched_at < clock_timestamp() - make_interval(secs => %(keep)s)",
        "dispatched_at, id",
        "RETENTION_DISPATCHED_ENVELOPES",
    ),
    "recovery_rounds": (
        RecoveryRound._meta.db_table,
        "started_at < clock_timestamp() - make_interval(secs => %(keep)s)",
        "started_at, id",
        "RETENTION_RECOVERY_ROUNDS",
    ),
    "processes": (
        DispatcherProcess._meta.db_table,
        "last_seen_at < clock_timestamp() - make_interval(secs => %(keep)s)",
        "last_seen_at, id",
        "RETENTION_HEARTBEATS",
    ),
}

CHILDREN = {"processes": [(LoopHeartbeat._meta.db_table, "process_id")]}

# What the attempt history still reads from the rows about to go, copied in the same statement. An attempt copies
# its envelope's dispatch time when it starts or ends, and a job that ran before the dispatcher's mark (which may
# wait: DISPATCH["MARK_AHEAD_DELAY"]) did both before there was one to copy; readers join the envelope until then.
KEEP = {
    "envelopes": f"""UPDATE {ATTEMPT} a SET dispatched_at = e.dispatched_at
        FROM {ENVELOPE} e
        WHERE e.id IN (SELECT id FROM doomed) AND a.job_id = e.job_id AND a.attempt = e.attempt
          AND a.dispatched_at IS NULL""",
}


def prune_table(key: str, keep_seconds: float, batch_size: int, max_batches: int) -> tuple[int, int, bool]:
    """Returns (rows deleted, batches run, maybe more left)."""
    table, where, order, _ = TABLES[key]
    # Django's foreign keys cascade in Python, not in the database: delete the children in the same statement.
    children = "".join(
        f", {child}_gone AS (DELETE FROM {child} WHERE {column} IN (SELECT id FROM doomed))"
        for child, column in CHILDREN.get(key, ())
    )
    if key in KEEP:
        children += f", kept AS ({KEEP[key]})"
    sql = (
        f"WITH doomed AS (SELECT id FROM {table} WHERE {where} "
        f"ORDER BY {order} LIMIT %(limit)s FOR UPDATE SKIP LOCKED){children} "
        f"DELETE FROM {table} WHERE id IN (SELECT id FROM doomed)"
    )
    deleted = batches = 0
    for _ in range(max_batches):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, {"keep": keep_seconds, "limit": batch_size})
            count = cursor.rowcount
        batches += 1
        deleted += count
        if count < batch_size:
            return deleted, batches, False
    return deleted, batches, True
