"""tasks-enqueue: a ``django.tasks`` task (``noop.enqueue``) against the raw ``submit``, enqueue -> start.

One dispatcher child (LISTEN/NOTIFY, as shipped) and one ``runworkers`` process serve both paths for the
whole scenario; each repeat runs the variants interleaved (``side_by_side``), one call at a time, paced:

- ``submit``: ``outbox.submit("delivery", payload)`` -- the outbox write the project's own domains use;
- ``task``: ``noop.enqueue(n)`` on the ``default`` queue through ``OutboxBackend`` (validate_task, JSON
  normalisation, the same one-statement write, a READY TaskResult, the task_enqueued signal).

Reported per variant: the caller's CPU and wall time per call (``time.process_time`` / ``perf_counter``),
and enqueue -> start from the database clock (``started_at - submitted_at`` of each job: dispatch, RQ and
the worker's start compare-and-set). The ``task`` rows carry their ratio to ``submit``.
"""

from __future__ import annotations

import time

from bench import Context, record, side_by_side
from bench.stats import ratio, summarize
from dispatch_app.tasks.compat import task

NAME = "tasks-enqueue"
VARIANTS = ["submit", "task"]


@task()
def noop(n: int) -> int:
    """The benchmark's task: nothing to do, so the row measures the path, not the work."""
    return n


def _callers():
    from dispatch_app.domains.demo_payloads import demo_payload
    from dispatch_app.outbox.submit import submit

    payload = demo_payload("delivery", 0)

    def raw(n: int) -> int:
        return submit("delivery", payload).pk

    def via_task(n: int) -> int:
        return int(noop.enqueue(n).id)

    return {"submit": raw, "task": via_task}


def run(ctx: Context) -> list[dict]:
    from bench.load import Child, db_latencies, wait_until
    from bench.workers import Workers

    env = ctx.env
    count = ctx.size("tasks_jobs", 1000, 100)
    rate = ctx.size("tasks_rate", 100.0, 100.0)
    env.reset()
    callers = _callers()
    child = Child(env, {"kind": "dispatch", "listen": True, "poll": 1.0})
    try:
        with Workers(env, "pipeline", ["delivery", "default"], 1):

            def run_one(variant: str, index: int):
                call = callers[variant]
                for n in range(20):  # warm: imports, statement caches, the first NOTIFY
                    call(n)
                ids, cpu, wall = [], 0.0, 0.0
                start = time.monotonic()
                for n in range(count):
                    delay = start + n / rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    c, w = time.process_time(), time.perf_counter()
                    ids.append(call(n))
                    cpu += time.process_time() - c
                    wall += time.perf_counter() - w
                if not wait_until(lambda: len(db_latencies(ids, "started_at")) == len(ids), timeout=60):
                    raise RuntimeError(f"{len(ids) - len(db_latencies(ids, 'started_at'))} jobs never started")
                started = summarize(list(db_latencies(ids, "started_at").values()))
                return {
                    "cpu_ms_per_call": cpu / count * 1000,
                    "wall_ms_per_call": wall / count * 1000,
                    "start_p50_ms": started["p50"],
                    "start_p95_ms": started["p95"],
                    "start_p99_ms": started["p99"],
                }, {}

            out = side_by_side(ctx, NAME, VARIANTS, run_one)
    finally:
        child.stop()
    params = {"jobs": count, "rate_per_s": rate, "one_at_a_time": True, "workers": "runworkers --processes 1"}
    records = [record(NAME, v, params, out["runs"][v], error=out["errors"].get(v)) for v in VARIANTS]
    base, via = records[0]["metrics"], records[1]["metrics"]
    for key in ("cpu_ms_per_call", "wall_ms_per_call", "start_p50_ms", "start_p95_ms"):
        via[f"{key.removesuffix('_ms').removesuffix('_ms_per_call')}_x_submit"] = ratio(via.get(key), base.get(key))
    return records
