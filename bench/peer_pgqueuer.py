"""pgqueuer as a peer, in its own database: ``python -m bench.peer_pgqueuer drain '<json>'``.

drain: enqueue `count` jobs, then one QueueManager in ``drain`` mode until the
queue is empty (dequeue batch `batch_size`, default 100: pgqueuer's rate comes
from taking many jobs per round trip). Measured like the other workers: first
job function start -> last job function finish, the process's own CPU and its
PostgreSQL backends' CPU over the drain. Durability: job state in PostgreSQL
(server default ``synchronous_commit``); completions are logged in batches.
Prints one ``result <json>`` line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from datetime import timedelta


async def main(role: str, spec: dict) -> dict:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    from bench.cpu import CpuMeter, pg_backend_pids, self_cpu

    if role != "drain":
        raise ValueError(f"unknown role {role!r}")
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    batch = int(spec.get("batch_size", 100))
    n = int(spec["count"])
    async with await psycopg.AsyncConnection.connect(spec["conninfo"], autocommit=True) as conn:
        queries = Queries(PsycopgDriver(conn))
        await queries.install()
        for first in range(0, n, 1000):
            size = min(1000, n - first)
            await queries.enqueue(["bench"] * size, [None] * size, [0] * size)

    times: dict = {"n": 0}
    with psycopg.connect(spec["conninfo"], autocommit=True) as watch:
        own = watch.execute("SELECT pg_backend_pid()").fetchone()[0]
        async with await psycopg.AsyncConnection.connect(spec["conninfo"], autocommit=True) as conn:
            qm = QueueManager(Queries(PsycopgDriver(conn)))

            @qm.entrypoint("bench")
            async def bench(job) -> None:
                now = time.time()
                times.setdefault("first", now)
                times["n"] += 1
                times["last_end"] = time.time()

            meter = CpuMeter(
                {"postgres": lambda: pg_backend_pids(watch.cursor(), [spec["dbname"]], exclude=[own])},
                children=False,
            )
            meter.snapshot()
            cpu0 = self_cpu()
            await qm.run(batch_size=batch, mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=1))
            worker_cpu = self_cpu() - cpu0
            pg = meter.delta()["postgres"]
    return {
        "jobs": times["n"],
        "seconds": times["last_end"] - times["first"],
        "worker_cpu_s": worker_cpu,
        "postgres_cpu_s": pg,
        "batch_size": batch,
    }


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    print("result " + json.dumps(asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))), flush=True)
