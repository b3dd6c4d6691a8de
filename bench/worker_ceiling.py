"""worker-ceiling: one worker process draining a backlog, the worker's own ceiling.

`ceiling_jobs` (3,000) jobs wait before the worker is let at them; the rate is
jobs / (first job function start -> last job function finish):

- ``productflow``: the project's worker (``runworkers --processes 1``) on the
  ``delivery`` task; times from ``started_at`` / ``finished_at`` (DB clock);
- ``rq-simpleworker``: RQ's SimpleWorker on the same task;
- ``rq-noop``: RQ's SimpleWorker on a no-op job (RQ's own cost), times from RQ's
  job hashes (``started_at`` / ``ended_at``);
- ``procrastinate``: one worker, concurrency 1, async no-op; ``pgqueuer``: one
  QueueManager, dequeue batch 100, async no-op; times from the job function.

The RQ variants run on a private redis-server (``bench.private_redis``): the
backlog is put in RQ first (our dispatcher for the task, ``enqueue_many`` for the
no-op), renamed aside while the worker starts and registers, and renamed back
(which wakes the worker's blocking pop) once the CPU counters are read. CPU per
job: the worker process, the PostgreSQL backends of the database (not the
bench's own), the private Redis; Redis commands per job from ``INFO``.
"""

from __future__ import annotations

import json

from bench import Context, record, side_by_side
from bench.cpu import CpuMeter, per_job_ms, pg_backend_pids
from bench.private_redis import private_redis
from bench.procs import one_shot
from bench.profile import Profiler
from bench.stats import rate, ratio
from bench.workers import Workers

NAME = "worker-ceiling"
VARIANTS = ["productflow", "rq-simpleworker", "rq-noop", "procrastinate", "pgqueuer"]
HOLD = "bench:hold"


def _own_backend() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _backends(env):
    from django.db import connection

    own = _own_backend()

    def pids():
        with connection.cursor() as cursor:
            return pg_backend_pids(cursor, [env.settings_dict["NAME"]], exclude=[own])

    return pids


def _finished_count(first: int, last: int) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM dispatch_app_job WHERE id BETWEEN %s AND %s AND finished_at IS NOT NULL",
            [first, last],
        )
        return cursor.fetchone()[0]


def _db_span(first: int, last: int) -> float:
    """The drain's span; refused unless every job succeeded (a refused payload is a cheaper path than the work)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at)), "
            "count(*) FILTER (WHERE status <> 'succeeded'), min(error) FILTER (WHERE status <> 'succeeded') "
            "FROM dispatch_app_job WHERE id BETWEEN %s AND %s",
            [first, last],
        )
        span, unsucceeded, error = cursor.fetchone()
    if unsucceeded:
        raise RuntimeError(f"{unsucceeded} of {last - first + 1} jobs did not succeed, e.g. {error[:200]!r}")
    return float(span)


def _rq_span(redis, ids: list[str]) -> float:
    from rq.utils import utcparse

    pipe = redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(f"rq:job:{job_id}", "started_at", "ended_at")
    rows = [r for r in pipe.execute() if r[0] and r[1]]
    if len(rows) < len(ids):
        raise RuntimeError(f"{len(ids) - len(rows)} of {len(ids)} no-op jobs have no start/end in RQ")
    starts = [utcparse(r[0].decode()) for r in rows]
    ends = [utcparse(r[1].decode()) for r in rows]
    return (max(ends) - min(starts)).total_seconds()


def _rq_variant(ctx: Context, variant: str, count: int) -> dict:
    from bench.load import Child, pending_count, wait_until
    from bench.seed import seed_pending

    env = ctx.env
    with private_redis(env) as redis_pid:
        env.reset()
        redis = env.redis()
        if variant == "rq-noop":
            from rq import Queue
            from rq.serializers import JSONSerializer

            # The same queue as the task (django-rq's rqworker, plain_rqworker here, only serves configured queues).
            queue_name = "delivery"
            q = Queue(queue_name, connection=redis, serializer=JSONSerializer)
            ids = []
            for start in range(0, count, 500):
                datas = [
                    Queue.prepare_data("bench.rqjobs.noop", args=(i,), result_ttl=3600)
                    for i in range(start, min(count, start + 500))
                ]
                ids += [job.id for job in q.enqueue_many(datas)]
            first = last = 0
        else:
            queue_name = "delivery"
            first, last = seed_pending(count, domains=["delivery"])
            child = Child(env, {"kind": "dispatch", "listen": False, "batch": 500})
            try:
                wait_until(lambda: pending_count() == 0, timeout=60 + count / 200, interval=0.05)
            finally:
                child.stop()
        key = f"rq:queue:{queue_name}"
        if redis.llen(key) != count:
            raise RuntimeError(f"backlog not in RQ: {redis.llen(key)} of {count}")
        redis.rename(key, HOLD)
        kind = "pipeline" if variant == "productflow" else "simple"
        with Workers(env, kind, [queue_name], 1) as workers:
            components = {"worker": lambda: workers.pids, "postgres": _backends(env)}
            if redis_pid:
                components["redis"] = lambda: [redis_pid]
            meter = CpuMeter(components)
            cmds0 = redis.info("stats")["total_commands_processed"]
            meter.snapshot()
            profilers = [Profiler(pid, f"ceiling-{variant}") for pid in workers.pids]
            redis.rename(HOLD, key)
            if variant == "rq-noop":
                done = _rq_done(redis, queue_name, count)
            else:
                done = lambda: _finished_count(first, last) >= count  # noqa: E731
            if not wait_until(done, timeout=60 + count / 20, interval=0.05):
                raise RuntimeError(f"{variant}: backlog not drained in time")
            cpu = meter.delta()
            for profiler in profilers:
                profiler.stop()
            cmds = redis.info("stats")["total_commands_processed"] - cmds0
        span = _rq_span(redis, ids) if variant == "rq-noop" else _db_span(first, last)
    metrics = {"jobs": count, "seconds": span, "rate_per_s": rate(count, span), "redis_cmds_per_job": cmds / count}
    metrics.update({f"cpu_{k}_ms_per_job": v for k, v in per_job_ms(cpu, count).items()})
    return metrics


def _rq_done(redis, queue_name: str, count: int):
    from rq.registry import FinishedJobRegistry

    registry = FinishedJobRegistry(queue_name, connection=redis)
    return lambda: registry.count >= count


def _peer(ctx: Context, variant: str, count: int) -> dict:
    env = ctx.env
    url, info = env.side_database(variant)
    try:
        spec = {
            "conninfo": " ".join(f"{k}={v}" for k, v in info.items()),
            "dbname": info["dbname"],
            "count": count,
        }
        res = one_shot([f"bench.peer_{variant}", "drain", json.dumps(spec)], env.child_env(), timeout=300)
    finally:
        env.drop_side_database(url)
    cpu = {"worker": res["worker_cpu_s"], "postgres": res["postgres_cpu_s"]}
    metrics = {"jobs": res["jobs"], "seconds": res["seconds"], "rate_per_s": rate(res["jobs"], res["seconds"])}
    metrics.update({f"cpu_{k}_ms_per_job": v for k, v in per_job_ms(cpu, res["jobs"]).items()})
    return metrics


def run(ctx: Context) -> list[dict]:
    count = int(ctx.size("ceiling_jobs", 3000, 40))

    def run_one(variant: str, index: int):
        if variant in ("procrastinate", "pgqueuer"):
            return _peer(ctx, variant, count), {}
        return _rq_variant(ctx, variant, count), {}

    out = side_by_side(ctx, NAME, VARIANTS, run_one)
    params = {
        "productflow": {"worker": "manage.py runworkers --processes 1 (PipelineWorker)", "task": "delivery"},
        "rq-simpleworker": {
            "worker": "manage.py plain_rqworker --worker-class rq.worker.SimpleWorker",
            "task": "delivery",
        },
        "rq-noop": {"worker": "manage.py plain_rqworker --worker-class rq.worker.SimpleWorker", "task": "no-op"},
        "procrastinate": {"worker": "1 worker, concurrency 1, LISTEN/NOTIFY", "task": "async no-op"},
        "pgqueuer": {"worker": "1 QueueManager, drain mode, dequeue batch 100", "task": "async no-op"},
    }
    for p in params.values():
        p["backlog"] = count
    records = [
        record(NAME, v, params[v], out["runs"][v], out["series"][v], error=out["errors"].get(v)) for v in VARIANTS
    ]
    by = {r["variant"]: r["metrics"] for r in records}
    for rec in records:
        m = rec["metrics"]
        if m:
            m["x_rq_simpleworker"] = ratio(m.get("rate_per_s"), by["rq-simpleworker"].get("rate_per_s"))
            m["x_procrastinate"] = ratio(m.get("rate_per_s"), by["procrastinate"].get("rate_per_s"))
    return records
