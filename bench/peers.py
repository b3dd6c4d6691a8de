"""peers: procrastinate and pgqueuer in their own benchmark shapes, on the same PostgreSQL, same run.

Each peer runs in a subprocess against a fresh database of its own next to the
bench's (``<bench db>_procrastinate``, ``<bench db>_pgqueuer``); a peer that
cannot be imported or fails is recorded with its error, the run goes on.

- procrastinate: defer N (1,000) then work until empty (drain/s); defer ->
  start latency at 200/s (its own event table, DB clock).
- pgqueuer: enqueue N (50k) then ``drain`` mode (drain/s); ``throughput``:
  producer and consumer together for a fixed time.
- productflow: our equivalents: outbox -> RQ drain of the same N as pgqueuer
  (one dispatcher, B=500); submit -> dispatched and submit -> worker start at
  200/s with two RQ SimpleWorkers; and procrastinate's shape end to end
  (submit N, dispatch + one SimpleWorker until every job finished).
"""

from __future__ import annotations

import json
import subprocess
import tempfile

from bench import Context, record, side_by_side
from bench.env import PYTHON, ROOT
from bench.load import Child, db_latencies, db_now, seed_pending, submit_paced, wait_until
from bench.stats import cdf_points, rate, ratio, summarize

NAME = "peers"
VARIANTS = ["productflow", "procrastinate", "pgqueuer"]


def _peer(module: str, spec: dict, timeout: float) -> dict:
    proc = subprocess.run(
        [PYTHON, "-m", module, json.dumps(spec)], cwd=str(ROOT), capture_output=True, text=True, timeout=timeout
    )
    for line in proc.stdout.splitlines():
        if line.startswith("result "):
            return json.loads(line[7:])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    raise RuntimeError(f"{module} exited {proc.returncode}: {' | '.join(tail)}")


def _conninfo_str(info: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in info.items())


def _finished(first: int, last: int) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM dispatch_app_job WHERE id BETWEEN %s AND %s AND finished_at IS NOT NULL",
            [first, last],
        )
        return cursor.fetchone()[0]


class RQWorker:
    """One ``manage.py rqworker`` SimpleWorker on the workflow queue (JSON serializer)."""

    def __init__(self, env):
        self.env = env
        before = env.redis().scard("rq:workers")
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [
                PYTHON,
                "manage.py",
                "rqworker",
                "workflow",
                "--worker-class",
                "rq.worker.SimpleWorker",
                "--serializer",
                "rq.serializers.JSONSerializer",
            ],
            cwd=str(ROOT),
            env=env.child_env(DISPATCH_PROVIDER_LATENCY_MS="0"),
            # A file, not a pipe: RQ logs every job, and a full pipe would stall the worker.
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        if not wait_until(lambda: env.redis().scard("rq:workers") > before, timeout=60, interval=0.1):
            self.log.seek(0)
            tail = self.log.read()[-1500:].decode(errors="replace")
            self.stop()
            raise RuntimeError(f"rqworker did not register: {tail}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def _ours(ctx: Context, drain_jobs: int, e2e_jobs: int, latency_rate: float, latency_jobs: int):
    env = ctx.env
    metrics: dict = {}
    series: dict = {}
    # Drain: outbox -> RQ, pgqueuer's size.
    env.reset()
    seed_pending(drain_jobs, domains=["workflow"])
    child = Child(env, {"kind": "dispatch", "listen": False, "batch": 500, "wait_go": True})
    t0 = db_now()
    child.go()
    wait_until(lambda: _pending() == 0, timeout=60 + drain_jobs / 2000, interval=0.05)
    child.stop()
    drain_s = _last_dispatch() - t0
    metrics.update(drain_jobs=drain_jobs, drain_s=drain_s, drain_per_s=rate(drain_jobs, drain_s))

    env.reset()
    worker = RQWorker(env)
    try:
        # procrastinate's shape end to end: submit N, then dispatch + one worker until all finished.
        first, last = seed_pending(e2e_jobs, domains=["workflow"])
        child = Child(env, {"kind": "dispatch", "listen": True, "batch": 500, "wait_go": True})
        t0 = db_now()
        child.go()
        wait_until(lambda: _finished(first, last) >= e2e_jobs, timeout=60 + e2e_jobs / 50, interval=0.05)
        e2e_s = _last_finish(first, last) - t0
        metrics.update(e2e_jobs=e2e_jobs, e2e_s=e2e_s, e2e_per_s=rate(e2e_jobs, e2e_s))
        # Latency at the fixed rate, dispatcher and workers idle-ready. One SimpleWorker
        # runs ~200 of our jobs/s here, right at the arrival rate, so a second one
        # keeps the queue from building up (RQ workers scale out; the dispatcher is one).
        second = RQWorker(env)
        try:
            result = submit_paced(latency_rate, latency_jobs, domains=["workflow"])
            ids = list(result["committed"])
            wait_until(lambda: _finished(min(ids), max(ids)) >= len(ids), timeout=30, interval=0.05)
            # The same below the workers' capacity: what is left is our path, not a queue.
            low = submit_paced(latency_rate / 4, max(10, latency_jobs // 4), domains=["workflow"])
            low_ids = list(low["committed"])
            wait_until(lambda: _finished(min(low_ids), max(low_ids)) >= len(low_ids), timeout=30, interval=0.05)
        finally:
            second.stop()
        child.stop()
    finally:
        worker.stop()
    dispatched = list(db_latencies(ids, "dispatched_at").values())
    started = list(db_latencies(ids, "started_at").values())
    low_started = list(db_latencies(low_ids, "started_at").values())
    for prefix, values in (
        ("latency_dispatch", dispatched),
        ("latency_start", started),
        ("latency_start_quarter_rate", low_started),
    ):
        s = summarize(values)
        metrics[f"{prefix}_p50_ms"], metrics[f"{prefix}_p99_ms"] = s["p50"], s["p99"]
    series["db_cdf"] = cdf_points(started)
    return metrics, series


def _pending() -> int:
    from bench.load import pending_count

    return pending_count()


def _last_dispatch() -> float:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM max(dispatched_at)) FROM dispatch_app_dispatchenvelope")
        return float(cursor.fetchone()[0])


def _last_finish(first: int, last: int) -> float:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM max(finished_at)) FROM dispatch_app_job WHERE id BETWEEN %s AND %s",
            [first, last],
        )
        return float(cursor.fetchone()[0])


def run(ctx: Context) -> list[dict]:
    env = ctx.env
    procrastinate_jobs = int(ctx.size("peers_procrastinate_jobs", 1000, 50))
    pgqueuer_jobs = int(ctx.size("peers_pgqueuer_jobs", 50_000, 500))
    latency_rate = ctx.size("peers_latency_rate", 200.0, 200.0)
    latency_jobs = int(ctx.size("peers_latency_jobs", 1000, 40))
    throughput_s = ctx.size("peers_throughput_s", 3.0, 0.5)

    def run_one(variant: str, index: int):
        if variant == "productflow":
            return _ours(ctx, pgqueuer_jobs, procrastinate_jobs, latency_rate, latency_jobs)
        url, info = env.side_database(variant)
        try:
            if variant == "procrastinate":
                res = _peer(
                    "bench.peer_procrastinate",
                    {
                        "conninfo": _conninfo_str(info),
                        "drain_jobs": procrastinate_jobs,
                        "latency_rate": latency_rate,
                        "latency_jobs": latency_jobs,
                    },
                    timeout=300,
                )
                lat = summarize(res["latency_ms"])
                metrics = {
                    "drain_jobs": res["drain_jobs"],
                    "drain_s": res["drain_s"],
                    "drain_per_s": rate(res["drain_jobs"], res["drain_s"]),
                    "latency_start_p50_ms": lat["p50"],
                    "latency_start_p99_ms": lat["p99"],
                    "latency_jobs": lat["n"],
                }
                return metrics, {"db_cdf": cdf_points(res["latency_ms"])}
            res = _peer(
                "bench.peer_pgqueuer",
                {
                    "conninfo": _conninfo_str(info),
                    "drain_jobs": pgqueuer_jobs,
                    "throughput_s": throughput_s,
                },
                timeout=600,
            )
            metrics = {
                "drain_jobs": res["drain_jobs"],
                "drain_s": res["drain_s"],
                "drain_per_s": rate(res["drain_jobs"], res["drain_s"]),
                "throughput_per_s": rate(res["throughput_jobs"], res["throughput_s"]),
            }
            return metrics, {}
        finally:
            env.drop_side_database(url)

    out = side_by_side(ctx, NAME, VARIANTS, run_one)
    params = {
        "productflow": {
            "drain": f"{pgqueuer_jobs} envelopes outbox -> RQ, 1 dispatcher, B=500",
            "e2e": f"{procrastinate_jobs} jobs submit -> finished, 1 RQ SimpleWorker",
            "latency": f"{latency_jobs} at {latency_rate}/s",
        },
        "procrastinate": {
            "drain": f"defer {procrastinate_jobs}, then 1 worker (concurrency 1) until empty",
            "latency": f"{latency_jobs} at {latency_rate}/s, defer -> started",
        },
        "pgqueuer": {
            "drain": f"{pgqueuer_jobs} jobs, QueueManager drain mode, dequeue batch 100",
            "throughput": f"producer + consumer for {throughput_s} s",
        },
    }
    records = [
        record(NAME, v, params[v], out["runs"][v], out["series"][v], error=out["errors"].get(v)) for v in VARIANTS
    ]
    ours = records[0]["metrics"]
    for rec in records[1:]:
        ours[f"drain_x_{rec['variant']}"] = ratio(ours.get("drain_per_s"), rec["metrics"].get("drain_per_s"))
    ours["drain_x_peer"] = min((v for k, v in ours.items() if k.startswith("drain_x_") and v), default=None)
    ours["latency_start_p50_x_procrastinate"] = ratio(
        ours.get("latency_start_p50_ms"), records[1]["metrics"].get("latency_start_p50_ms")
    )
    return records
