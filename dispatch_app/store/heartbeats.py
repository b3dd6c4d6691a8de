"""A dispatcher process's row and its loops' heartbeat rows: the writes ``housekeeping.heartbeat`` makes.

Every timestamp is the database clock's; a loop's tick is written as ``clock_timestamp() - <seconds since it>``
(a duration measured on the host, anchored on the database clock).
"""

from __future__ import annotations

PROCESS = "dispatch_app_dispatcherprocess"
HEARTBEAT = "dispatch_app_loopheartbeat"

REGISTER_SQL = (
    f"INSERT INTO {PROCESS} (name, hostname, pid, started_at, last_seen_at, session) "
    "VALUES (%s, %s, %s, clock_timestamp(), clock_timestamp(), %s) RETURNING id"
)
SEEN_SQL = f"UPDATE {PROCESS} SET last_seen_at = clock_timestamp(), session = %s WHERE id = %s"
STOPPED_SQL = f"UPDATE {PROCESS} SET stopped_at = clock_timestamp(), last_seen_at = clock_timestamp() WHERE id = %s"

UPSERT_SQL = f"""
INSERT INTO {HEARTBEAT} (process_id, loop, last_tick_at, last_error_at, last_error, errors)
VALUES (%(process)s, %(loop)s,
        clock_timestamp() - make_interval(secs => %(tick)s),
        clock_timestamp() - make_interval(secs => %(error_at)s), %(error)s, %(errors)s)
ON CONFLICT (process_id, loop) DO UPDATE SET
    last_tick_at = COALESCE(EXCLUDED.last_tick_at, {HEARTBEAT}.last_tick_at),
    last_error_at = COALESCE(EXCLUDED.last_error_at, {HEARTBEAT}.last_error_at),
    last_error = EXCLUDED.last_error,
    errors = EXCLUDED.errors
"""


def register(cursor, name: str, hostname: str, pid: int, session: str) -> int:
    """A new process row; its id."""
    cursor.execute(REGISTER_SQL, [name, hostname, pid, session])
    return cursor.fetchone()[0]


def seen(cursor, process_id: int, session: str) -> bool:
    """The process is alive now; False when its row is gone (pruned while it was silent)."""
    cursor.execute(SEEN_SQL, [session, process_id])
    return cursor.rowcount == 1


def stopped(cursor, process_id: int) -> None:
    cursor.execute(STOPPED_SQL, [process_id])


def loop_beat(cursor, process_id: int, loop: str, tick_ago, error_ago, error: str, errors: int) -> None:
    """One loop's last tick and last error, as seconds ago (None: never)."""
    cursor.execute(
        UPSERT_SQL,
        {
            "process": process_id,
            "loop": loop,
            "tick": tick_ago,
            "error_at": error_ago,
            "error": error,
            "errors": errors,
        },
    )
