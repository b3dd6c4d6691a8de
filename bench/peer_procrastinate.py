"""procrastinate in its benchmark shapes, in its own database: ``python -m bench.peer_procrastinate '<json>'``.

drain: defer N jobs, then run a worker until the queue is empty (``wait=False``).
latency: a worker running, jobs deferred at a fixed rate; defer -> start from
procrastinate's own event table (``deferred`` and ``started`` at, DB clock).
Prints one ``result <json>`` line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time

LATENCY_SQL = """
SELECT extract(epoch FROM s.at - d.at) * 1000
FROM procrastinate_events d JOIN procrastinate_events s ON s.job_id = d.job_id
WHERE d.type = 'deferred' AND s.type = 'started' AND d.job_id > %s
"""


async def main(spec: dict) -> dict:
    import procrastinate
    import psycopg

    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=spec["conninfo"]))

    @app.task(name="noop", queue="bench")
    async def noop(i: int) -> None:
        return None

    out: dict = {}
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        n = spec["drain_jobs"]
        started = time.monotonic()
        for first in range(0, n, 500):
            await noop.batch_defer_async(*({"i": i} for i in range(first, min(n, first + 500))))
        out["defer_s"] = time.monotonic() - started
        started = time.monotonic()
        await app.run_worker_async(queues=["bench"], wait=False, install_signal_handlers=False)
        out["drain_s"] = time.monotonic() - started
        out["drain_jobs"] = n

        async with await psycopg.AsyncConnection.connect(spec["conninfo"], autocommit=True) as conn:
            cur = await conn.execute("SELECT coalesce(max(id), 0) FROM procrastinate_jobs")
            (last_id,) = await cur.fetchone()
            worker = asyncio.create_task(
                app.run_worker_async(queues=["bench"], wait=True, install_signal_handlers=False)
            )
            await asyncio.sleep(0.5)
            rate, count = spec["latency_rate"], spec["latency_jobs"]
            t0 = time.monotonic()
            for i in range(count):
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await noop.defer_async(i=i)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                cur = await conn.execute(
                    "SELECT count(*) FROM procrastinate_jobs WHERE id > %s AND status = 'succeeded'", [last_id]
                )
                if (await cur.fetchone())[0] >= count:
                    break
                await asyncio.sleep(0.05)
            worker.cancel()
            try:
                await worker
            except (asyncio.CancelledError, Exception):  # noqa: BLE001, S110 - stopping the worker
                pass
            cur = await conn.execute(LATENCY_SQL, [last_id])
            out["latency_ms"] = [float(r[0]) for r in await cur.fetchall()]
    return out


if __name__ == "__main__":
    print("result " + json.dumps(asyncio.run(main(json.loads(sys.argv[1])))), flush=True)
