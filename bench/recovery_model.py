"""A per-domain recovery round as the design describes it, for the isolation and storm scenarios.

Real SQL against real stale jobs: one short discovery transaction
(``ORDER BY updated_at, id LIMIT B+1 FOR UPDATE SKIP LOCKED``), then per
candidate a short transaction that re-reads it and re-dispatches it through the
outbox (retry-safe domains) or finishes it as ``outcome_unknown``. ``block``
adds a ``pg_sleep`` inside the discovery transaction: a round that blocks in
the database while holding its candidates' locks (the isolation scenario).

The bench uses this model rather than ``dispatch_app.recovery`` so that the
round's cost is known and settable; the loop shape (own thread, own connection,
own period) is the one the supervisor gives every recovery loop.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from django.db import connection, transaction

DISCOVER_SQL = """
SELECT id, attempt FROM dispatch_app_job
WHERE domain = %s AND status IN ('submitted', 'queued', 'running')
  AND updated_at < clock_timestamp() - make_interval(secs => %s)
ORDER BY updated_at, id
LIMIT %s
FOR UPDATE SKIP LOCKED
"""

REREAD_SQL = """
SELECT status, attempt FROM dispatch_app_job
WHERE id = %s AND updated_at < clock_timestamp() - make_interval(secs => %s)
FOR UPDATE SKIP LOCKED
"""

UNKNOWN_SQL = """
UPDATE dispatch_app_job SET status = 'outcome_unknown', finished_at = clock_timestamp(),
    error = 'bench recovery: outcome cannot be checked'
WHERE id = %s AND attempt = %s AND status IN ('submitted', 'queued', 'running')
"""


@dataclass
class RoundStats:
    rounds: int = 0
    scanned: int = 0
    redispatched: int = 0
    unknown: int = 0
    left_alone: int = 0
    round_seconds: list[float] = field(default_factory=list)
    connect_seconds: float = 0.0

    def as_dict(self) -> dict:
        return {
            "rounds": self.rounds,
            "scanned": self.scanned,
            "redispatched": self.redispatched,
            "unknown": self.unknown,
            "left_alone": self.left_alone,
            "round_seconds_max": max(self.round_seconds, default=0.0),
            "round_seconds_total": sum(self.round_seconds),
            "connect_seconds": self.connect_seconds,
        }


class ModeledRecovery:
    """One domain's recovery loop: ``wait()`` for its period, ``run_once()`` one round."""

    def __init__(
        self,
        domain: str,
        *,
        period: float,
        batch_size: int = 25,
        stale_seconds: float = 60.0,
        block_seconds: float = 0.0,
        stop: threading.Event | None = None,
    ):
        from dispatch_app.domains import get_domain

        self.domain = domain
        self.name = f"recovery-{domain}"
        self.period = period
        self.batch_size = batch_size
        self.stale_seconds = stale_seconds
        self.block_seconds = block_seconds
        self.retry_safe = get_domain(domain).recovery.retry_safe
        self.stop = stop or threading.Event()
        self.stats = RoundStats()
        self._next = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def wait(self) -> str:
        self.stop.wait(max(0.0, self._next - time.monotonic()))
        return "tick"

    def run_once(self, trigger: str = "tick") -> dict:
        from dispatch_app.store.transitions import redispatch

        started = time.monotonic()
        self._next = started + self.period
        if connection.connection is None:
            connection.ensure_connection()
            self.stats.connect_seconds += time.monotonic() - started
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(DISCOVER_SQL, [self.domain, self.stale_seconds, self.batch_size + 1])
            candidates = cursor.fetchall()[: self.batch_size]
            if self.block_seconds:
                cursor.execute("SELECT pg_sleep(%s)", [self.block_seconds])
        for job_id, attempt in candidates:
            if self.stop.is_set():
                break
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(REREAD_SQL, [job_id, self.stale_seconds])
                row = cursor.fetchone()
                if row is None or row[1] != attempt:
                    self.stats.left_alone += 1
                    continue
                if self.retry_safe:
                    redispatch(job_id, attempt, kind="recovered", reason="bench recovery: stale")
                    self.stats.redispatched += 1
                else:
                    cursor.execute(UNKNOWN_SQL, [job_id, attempt])
                    self.stats.unknown += 1
        self.stats.rounds += 1
        self.stats.scanned += len(candidates)
        self.stats.round_seconds.append(time.monotonic() - started)
        return {"scanned": len(candidates)}
