"""Retention: prune what no one needs any more, in bounded batches.

Each batch is its own short transaction deleting at most RETENTION_BATCH_SIZE
rows picked with FOR UPDATE SKIP LOCKED (a row a dispatcher or an operator
holds is left for next time); one round runs at most RETENTION_MAX_BATCHES
batches per table, so a huge backlog of old rows is worked off over several
rounds instead of in one long delete. Ages are measured on the database clock.

Pruned: dispatched envelopes (by dispatched_at), recovery rounds (by
started_at) and dispatcher processes not seen for RETENTION_HEARTBEATS (their
loop heartbeats go with them). Jobs, their events, and pending or dead
envelopes are never pruned here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from django.db import connection, transaction

from dispatch_app.conf import DispatchSettings

TABLES = {
    "envelopes": (
        "dispatch_app_dispatchenvelope",
        "status = 'dispatched' AND dispatched_at < clock_timestamp() - make_interval(secs => %(keep)s)",
        "dispatched_at, id",
        "RETENTION_DISPATCHED_ENVELOPES",
    ),
    "recovery_rounds": (
        "dispatch_app_recoveryround",
        "started_at < clock_timestamp() - make_interval(secs => %(keep)s)",
        "started_at, id",
        "RETENTION_RECOVERY_ROUNDS",
    ),
    "processes": (
        "dispatch_app_dispatcherprocess",
        "last_seen_at < clock_timestamp() - make_interval(secs => %(keep)s)",
        "last_seen_at, id",
        "RETENTION_HEARTBEATS",
    ),
}

CHILDREN = {"processes": [("dispatch_app_loopheartbeat", "process_id")]}


@dataclass
class PruneResult:
    envelopes: int = 0
    recovery_rounds: int = 0
    processes: int = 0
    batches: int = 0
    more: bool = False  # some table hit RETENTION_MAX_BATCHES: old rows remain for the next round


def prune_table(key: str, keep_seconds: float, batch_size: int, max_batches: int) -> tuple[int, int, bool]:
    """Returns (rows deleted, batches run, maybe more left)."""
    table, where, order, _ = TABLES[key]
    # Django's foreign keys cascade in Python, not in the database: delete the children in the same statement.
    children = "".join(
        f", {child}_gone AS (DELETE FROM {child} WHERE {column} IN (SELECT id FROM doomed))"
        for child, column in CHILDREN.get(key, ())
    )
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


def prune(conf: DispatchSettings) -> PruneResult:
    result = PruneResult()
    for key, (_, _, _, setting) in TABLES.items():
        deleted, batches, more = prune_table(
            key, getattr(conf, setting), conf.RETENTION_BATCH_SIZE, conf.RETENTION_MAX_BATCHES
        )
        setattr(result, key, deleted)
        result.batches += batches
        result.more = result.more or more
    return result


class RetentionLoop:
    name = "retention"

    def __init__(self, conf: DispatchSettings, stop: threading.Event):
        self.conf = conf
        self.stop = stop

    def wait(self) -> str:
        self.stop.wait(self.conf.RETENTION_INTERVAL)
        return "tick"

    def run_once(self, trigger: str = "tick") -> PruneResult:
        return prune(self.conf)
