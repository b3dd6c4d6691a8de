"""pipeline-cpu: CPU per job across the whole pipeline, split by component, and the cost of ``submit``.

Pipeline variants, at `cpu_rate` jobs/s (100) for `cpu_seconds` (10 s), one
transaction per job, one worker process, the ``delivery`` task:

- ``productflow`` / ``productflow-simpleworker``: producer process (``submit``) ->
  dispatcher process -> the project's worker / RQ's SimpleWorker, on a private
  redis-server (``bench.private_redis``) so Redis's CPU is this pipeline's alone;
- ``productflow-writer``: as ``productflow``, the producer sending its own envelopes after each commit
  (``DISPATCH['SUBMIT_SENDS']``): the dispatcher is running but has nothing on the job's path;
- ``procrastinate``: producer process (``defer``) -> one worker (concurrency 1).

CPU = user + system seconds from the window's start (everything started and
idle) to the last job finished: the producer's own (it reports
``getrusage``), every other process of ours from /proc (with children), the
PostgreSQL client backends of the pipeline's database (the bench's own
excluded), the private Redis. Divided by the jobs done: ms per job.

Submit variants: ``submit`` (``outbox.submit_many`` of one job) against
``two-inserts`` (the job and envelope rows as two plain INSERTs in one
transaction, the floor), `cpu_submit_jobs` (2,000) flat out, nothing else
running; producer + PostgreSQL backend CPU per job.
"""

from __future__ import annotations

import json

from bench import Context, record, side_by_side
from bench.cpu import CpuMeter, per_job_ms, pg_backend_pids
from bench.private_redis import private_redis
from bench.procs import Proc, one_shot
from bench.profile import Profiler
from bench.stats import rate, ratio
from bench.workers import Workers

NAME = "pipeline-cpu"
VARIANTS = ["productflow", "productflow-writer", "productflow-simpleworker", "procrastinate", "submit", "two-inserts"]
KINDS = {"productflow": "pipeline", "productflow-writer": "pipeline", "productflow-simpleworker": "simple"}
# The variant whose submits send their own envelopes (DISPATCH['SUBMIT_SENDS'], dispatch_app.dispatch.writer_send).
WRITER = {"productflow-writer": {"SUBMIT_SENDS": True}}


def _wait(predicate, timeout: float) -> bool:
    from bench.load import wait_until

    return wait_until(predicate, timeout=timeout, interval=0.05)


def _own_backend(cursor) -> int:
    cursor.execute("SELECT pg_backend_pid()")
    return cursor.fetchone()[0]


def _django_backends(dbname: str):
    from django.db import connection

    with connection.cursor() as cursor:
        own = _own_backend(cursor)

    def pids():
        with connection.cursor() as cursor:
            return pg_backend_pids(cursor, [dbname], exclude=[own])

    return pids


def _finished(ids: list[int]) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM dispatch_app_job WHERE id = ANY(%s) AND finished_at IS NOT NULL", [ids])
        return cursor.fetchone()[0]


def _result(cpu: dict, producer: dict, jobs: int, done: int, seconds: float) -> dict:
    cpu = dict(cpu, producer=producer["cpu_s"])
    metrics = {"jobs": jobs, "done": done, "achieved_rate": rate(jobs, producer.get("elapsed") or seconds)}
    metrics.update({f"cpu_{k}_ms_per_job": v for k, v in per_job_ms(cpu, done).items()})
    return metrics


class _Statements:
    """Counts the bench's own statements (each one an autocommit transaction) to take them off the commits."""

    def __init__(self):
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def _ours(ctx: Context, kind: str, count: int, per_s: float) -> dict:
    from django.db import connection

    from bench import pg_work
    from bench.load import Child

    env = ctx.env
    own = _Statements()
    with private_redis(env) as redis_pid:
        env.reset()
        with connection.cursor() as cursor:
            pg_work.enable_function_stats(cursor, env.settings_dict["NAME"])
        child = Child(env, {"kind": "dispatch", "listen": True})
        try:
            with Workers(env, kind, ["delivery"], 1) as workers:
                producer = Proc(["bench.producer", json.dumps({"domain": "delivery"})], env.child_env())
                try:
                    components = {
                        "dispatcher": lambda: [child.proc.pid],
                        "worker": lambda: workers.pids,
                        "postgres": _django_backends(env.settings_dict["NAME"]),
                    }
                    if redis_pid:
                        components["redis"] = lambda: [redis_pid]
                    meter = CpuMeter(components)
                    meter.snapshot()
                    with connection.cursor() as cursor:
                        work_before = pg_work.read(cursor)
                    pids = {"producer": producer.pid, "dispatcher": child.proc.pid, "worker": workers.pids[0]}
                    profilers = [Profiler(pid, f"cpu-{kind}-{name}") for name, pid in pids.items()]
                    with connection.execute_wrapper(own):
                        out = producer.run(60 + count / 20, count=count, rate=per_s)
                        ids = [int(k) for k in out["committed"]]
                        _wait(lambda: _finished(ids) >= len(ids), 30 + count / 20)
                        cpu = meter.delta()
                    for profiler in profilers:
                        profiler.stop()
                    done = _finished(ids)
                finally:
                    producer.stop()
        finally:
            child.stop()
        # Every process of the pipeline has exited, so every backend has flushed its counters.
        with connection.cursor() as cursor:
            pg_work.wait_backends_gone(cursor)
            work_after = pg_work.read(cursor)
    metrics = _result(cpu, out, count, done, out["elapsed"])
    # +1: the statement after the first reading's commit count (its functions read); the waits' polls come after.
    metrics.update(pg_work.per_job(work_before, work_after, done, own_commits=own.count + 1))
    return metrics


def _procrastinate(ctx: Context, count: int, per_s: float) -> dict:
    import psycopg

    from bench import pg_work

    env = ctx.env
    url, info = env.side_database("procrastinate")
    try:
        spec = json.dumps({"conninfo": " ".join(f"{k}={v}" for k, v in info.items()), "dbname": info["dbname"]})
        penv = env.child_env()
        one_shot(["bench.peer_procrastinate", "setup", spec], penv, timeout=120)
        with psycopg.connect(autocommit=True, **info) as conn:
            own = _own_backend(conn.cursor())
            pg_work.enable_function_stats(conn.cursor(), info["dbname"])
            polls = [0]
            worker = Proc(["bench.peer_procrastinate", "worker", spec], penv)
            try:
                producer = Proc(["bench.peer_procrastinate", "producer", spec], penv)
                try:
                    meter = CpuMeter(
                        {
                            "worker": lambda: [worker.pid],
                            "postgres": lambda: pg_backend_pids(conn.cursor(), [info["dbname"]], exclude=[own]),
                        }
                    )
                    meter.snapshot()
                    work_before = pg_work.read(conn.cursor())
                    out = producer.run(60 + count / 20, count=count, rate=per_s)

                    def done() -> int:
                        polls[0] += 1
                        return conn.execute(
                            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
                        ).fetchone()[0]

                    _wait(lambda: done() >= count, 30 + count / 20)
                    cpu = meter.delta()
                    finished = done()
                finally:
                    producer.stop()
            finally:
                worker.stop(expect_result=True)
            pg_work.wait_backends_gone(conn.cursor())
            work_after = pg_work.read(conn.cursor())
    finally:
        env.drop_side_database(url)
    out.setdefault("elapsed", count / per_s)
    metrics = _result(cpu, out, count, finished, out["elapsed"])
    # The meter's backend lookups and the done() polls are this process's own transactions.
    metrics.update(pg_work.per_job(work_before, work_after, finished, own_commits=polls[0] + 2))
    return metrics


def _submit(ctx: Context, mode: str, count: int) -> dict:
    env = ctx.env
    env.reset()
    producer = Proc(["bench.producer", json.dumps({"domain": "delivery", "mode": mode})], env.child_env())
    try:
        meter = CpuMeter({"postgres": _django_backends(env.settings_dict["NAME"])})
        meter.snapshot()
        with Profiler(producer.pid, f"cpu-{mode}"):
            out = producer.run(60 + count / 20, count=count, rate=0, group=1)
        cpu = meter.delta()
    finally:
        producer.stop()
    metrics = {"jobs": out["jobs"], "per_s": rate(out["jobs"], out["elapsed"])}
    metrics.update(
        {f"cpu_{k}_ms_per_job": v for k, v in per_job_ms(dict(cpu, producer=out["cpu_s"]), out["jobs"]).items()}
    )
    return metrics


def run(ctx: Context) -> list[dict]:
    per_s = ctx.size("cpu_rate", 100.0, 100.0)
    count = int(per_s * ctx.size("cpu_seconds", 10.0, 0.2))
    submit_jobs = int(ctx.size("cpu_submit_jobs", 2000, 20))

    def run_one(variant: str, index: int):
        if variant in KINDS:
            ctx.env.dispatch_env = WRITER.get(variant, {})
            try:
                return _ours(ctx, KINDS[variant], count, per_s), {}
            finally:
                ctx.env.dispatch_env = {}
        if variant == "procrastinate":
            return _procrastinate(ctx, count, per_s), {}
        return _submit(ctx, "submit" if variant == "submit" else "inserts", submit_jobs), {}

    out = side_by_side(ctx, NAME, VARIANTS, run_one)
    pipeline = {"rate": per_s, "jobs": count, "worker_processes": 1, "task": "delivery (ours), async no-op (peer)"}
    params = {
        "productflow": dict(pipeline, processes="producer, rundispatcher, runworkers --processes 1, private Redis"),
        "productflow-writer": dict(
            pipeline, processes="producer (SUBMIT_SENDS: it sends its own), rundispatcher, runworkers --processes 1"
        ),
        "productflow-simpleworker": dict(pipeline, processes="producer, rundispatcher, plain_rqworker SimpleWorker"),
        "procrastinate": dict(pipeline, processes="producer (defer), 1 worker, concurrency 1"),
        "submit": {"jobs": submit_jobs, "how": "outbox.submit_many([one job]) per transaction, flat out"},
        "two-inserts": {"jobs": submit_jobs, "how": "INSERT job; INSERT envelope; COMMIT, flat out"},
    }
    records = [
        record(NAME, v, params[v], out["runs"][v], out["series"][v], error=out["errors"].get(v)) for v in VARIANTS
    ]
    by = {r["variant"]: r["metrics"] for r in records}
    for name in KINDS:
        if by[name]:
            by[name]["cpu_x_procrastinate"] = ratio(
                by[name].get("cpu_total_ms_per_job"), by["procrastinate"].get("cpu_total_ms_per_job")
            )
    if by["submit"]:
        by["submit"]["cpu_x_two_inserts"] = ratio(
            by["submit"].get("cpu_total_ms_per_job"), by["two-inserts"].get("cpu_total_ms_per_job")
        )
        by["submit"]["producer_x_two_inserts"] = ratio(
            by["submit"].get("cpu_producer_ms_per_job"), by["two-inserts"].get("cpu_producer_ms_per_job")
        )
    return records
