"""Retention: prune what no one needs any more, in bounded batches.

Each batch is its own short transaction deleting at most RETENTION_BATCH_SIZE
rows picked with FOR UPDATE SKIP LOCKED (a row a dispatcher or an operator
holds is left for next time); one round runs at most RETENTION_MAX_BATCHES
batches per table, so a huge backlog of old rows is worked off over several
rounds instead of in one long delete. Ages are measured on the database clock.

Pruned: dispatched envelopes (by dispatched_at), recovery rounds (by
started_at) and dispatcher processes not seen for RETENTION_HEARTBEATS (their
loop heartbeats go with them). Jobs, their events, and pending or dead
envelopes are never pruned here. The statement is the store's (store.retention).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from dispatch_app.config.settings import DispatchSettings
from dispatch_app.store.api import RETENTION_TABLES as TABLES
from dispatch_app.store.api import prune_table


@dataclass
class PruneResult:
    envelopes: int = 0
    recovery_rounds: int = 0
    processes: int = 0
    batches: int = 0
    more: bool = False  # some table hit RETENTION_MAX_BATCHES: old rows remain for the next round


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
