"""procrastinate as a peer, in its own database: ``python -m bench.peer_procrastinate ROLE '<json>'``.

Roles (the same shapes as the project's processes in ``bench.peers``):

- ``setup``: apply procrastinate's schema.
- ``producer``: prints ``ready``; on each ``go <json>`` defers `count` jobs, `group` per
  transaction (``batch_defer_async``), paced at `rate` jobs/s or flat out when 0;
  prints ``result`` with job index -> wall time right after the defer returned
  (committed: procrastinate defers in autocommit) and its own CPU seconds.
- ``worker``: one worker (concurrency 1, LISTEN/NOTIFY on, polling 5 s: the
  defaults); the job function records its own start (``time.time()``); prints
  ``ready`` once running; on ``stop`` prints ``result`` with the start times.
- ``drain``: defer `count` jobs, then one worker with ``wait=False`` until the
  queue is empty; first function start -> last function finish, its own CPU and
  its PostgreSQL backends' CPU over the drain.

Durability: procrastinate's job state lives in PostgreSQL, every status change
its own committed statement (server default ``synchronous_commit``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time


def _app(conninfo: str, times: dict):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="noop", queue="bench")
    async def noop(i: int) -> None:
        times.setdefault("start", {})[i] = time.time()
        times.setdefault("first", time.time())
        times["last_end"] = time.time()

    return app, noop


async def _line() -> str:
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


async def _wait_for(word: str) -> bool:
    while True:
        line = await _line()
        if not line:
            return False
        if line.strip() == word:
            return True


async def _defer(noop, count: int, group: int, rate: float, offset: int = 0) -> dict[int, float]:
    committed: dict[int, float] = {}
    interval = group / rate if rate else 0.0
    start = time.monotonic()
    sent = index = 0
    while sent < count:
        if interval:
            delay = start + index * interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        n = min(group, count - sent)
        if n == 1:
            await noop.defer_async(i=offset + sent)
        else:
            await noop.batch_defer_async(*({"i": offset + sent + k} for k in range(n)))
        now = time.time()
        for k in range(n):
            committed[offset + sent + k] = now
        sent += n
        index += 1
    return committed


async def main(role: str, spec: dict) -> dict | None:
    from bench.cpu import CpuMeter, pg_backend_pids, self_cpu

    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    times: dict = {}
    app, noop = _app(spec["conninfo"], times)
    async with app.open_async():
        if role == "setup":
            await app.schema_manager.apply_schema_async()
            return {}
        if role == "producer":
            print("ready", flush=True)
            while True:
                word, _, rest = (await _line()).strip().partition(" ")
                if word in ("stop", ""):
                    return None
                if word != "go":
                    continue
                phase = dict(spec, **json.loads(rest or "{}"))
                rate = float(phase.get("rate") or 0)
                group = int(phase.get("group") or (max(1, round(rate * 0.005)) if rate else 1))
                cpu0, t0 = self_cpu(), time.time()
                committed = await _defer(noop, int(phase["count"]), group, rate, int(phase.get("offset", 0)))
                out = {"t0": t0, "jobs": len(committed), "cpu_s": self_cpu() - cpu0, "committed": committed}
                print("result " + json.dumps(out), flush=True)
        if role == "worker":
            worker = asyncio.create_task(
                app.run_worker_async(queues=["bench"], concurrency=1, wait=True, install_signal_handlers=False)
            )
            await asyncio.sleep(0.3)
            print("ready", flush=True)
            await _wait_for("stop")
            worker.cancel()
            try:
                await worker
            except (asyncio.CancelledError, Exception):  # noqa: BLE001, S110 - stopping the worker
                pass
            return {"starts": times.get("start", {})}
        if role == "drain":
            await app.schema_manager.apply_schema_async()
            await _defer(noop, int(spec["count"]), 500, 0.0)
            import psycopg

            with psycopg.connect(spec["conninfo"], autocommit=True) as conn:
                own = conn.execute("SELECT pg_backend_pid()").fetchone()[0]

                def backends():
                    return pg_backend_pids(conn.cursor(), [spec["dbname"]], exclude=[own])

                meter = CpuMeter({"postgres": backends}, children=False)
                meter.snapshot()
                cpu0 = self_cpu()
                await app.run_worker_async(queues=["bench"], concurrency=1, wait=False, install_signal_handlers=False)
                worker_cpu = self_cpu() - cpu0
                pg = meter.delta()["postgres"]
            return {
                "jobs": len(times.get("start", {})),
                "seconds": times["last_end"] - times["first"],
                "worker_cpu_s": worker_cpu,
                "postgres_cpu_s": pg,
            }
    raise ValueError(f"unknown role {role!r}")


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    result = asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
    if result is not None:
        print("result " + json.dumps(result), flush=True)
