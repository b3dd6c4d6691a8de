"""pgqueuer in its benchmark shapes, in its own database: ``python -m bench.peer_pgqueuer '<json>'``.

drain: enqueue N jobs, then one QueueManager in ``drain`` mode until empty.
throughput: a producer enqueues batches while one QueueManager consumes, for a
fixed time; jobs processed per second. Prints one ``result <json>`` line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from datetime import timedelta


async def main(spec: dict) -> dict:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    out: dict = {}
    batch = spec.get("batch_size", 100)
    async with await psycopg.AsyncConnection.connect(spec["conninfo"], autocommit=True) as conn:
        queries = Queries(PsycopgDriver(conn))
        await queries.install()
        n = spec["drain_jobs"]
        started = time.monotonic()
        for first in range(0, n, 1000):
            size = min(1000, n - first)
            await queries.enqueue(["bench"] * size, [None] * size, [0] * size)
        out["enqueue_s"] = time.monotonic() - started

    async def consume(mode, seconds=None):
        async with await psycopg.AsyncConnection.connect(spec["conninfo"], autocommit=True) as conn:
            qm = QueueManager(Queries(PsycopgDriver(conn)))
            done = {"n": 0}

            @qm.entrypoint("bench")
            async def bench(job) -> None:
                done["n"] += 1

            if seconds is not None:
                asyncio.get_running_loop().call_later(seconds, qm.shutdown.set)
            started = time.monotonic()
            await qm.run(batch_size=batch, mode=mode, dequeue_timeout=timedelta(seconds=1))
            return done["n"], time.monotonic() - started

    jobs, seconds = await consume(QueueExecutionMode.drain)
    out.update(drain_jobs=jobs, drain_s=seconds)

    seconds = spec["throughput_s"]
    stop = asyncio.Event()

    async def produce():
        async with await psycopg.AsyncConnection.connect(spec["conninfo"], autocommit=True) as conn:
            queries = Queries(PsycopgDriver(conn))
            while not stop.is_set():
                await queries.enqueue(["bench"] * 100, [None] * 100, [0] * 100)
                await asyncio.sleep(0)

    producer = asyncio.create_task(produce())
    jobs, elapsed = await consume(QueueExecutionMode.continuous, seconds)
    stop.set()
    await producer
    out.update(throughput_jobs=jobs, throughput_s=elapsed)
    return out


if __name__ == "__main__":
    print("result " + json.dumps(asyncio.run(main(json.loads(sys.argv[1])))), flush=True)
