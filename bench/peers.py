"""peers: the project and procrastinate doing the same work, measured the same way, in the same run.

Every system: a producer process submits jobs (the project: ``outbox.submit_many``;
procrastinate: ``defer``), W worker processes run them (W = 1 and 2, concurrency 1
each), on the same PostgreSQL server (the peer in a fresh database of its own).
The project's path also has its dispatcher process (outbox -> RQ) and Redis.

- e2e: `peers_e2e_jobs` jobs submitted flat out, 100 per transaction, workers idle
  and ready; the clock starts right before the producer's first submit (its wall
  time) and stops at the last job recorded finished in PostgreSQL (ours:
  ``finished_at``; procrastinate: its ``succeeded`` event). Reported per worker
  process: jobs/s divided by W.
- latency at 100, 200 and 400 jobs/s for `peers_latency_s` seconds each, one
  transaction per 5 ms: commit (wall time right after the producer's commit
  returned) -> job start: the job function's first line for every system (ours: the
  domain's ``work``, after the start compare-and-set, stamped by the fault suite's ledger hook;
  procrastinate: the job function). Same host, same clock. Jobs not started within
  the wait are counted as missing. Ours is also split hop by hop (``_ours_hops``):
  commit -> claimed -> in RQ -> started in RQ -> started in PostgreSQL -> work begins.

Variants: ``productflow`` (the project's worker, ``manage.py runworkers``),
``productflow-writer`` (the same, the producer sending its own envelopes: ``SUBMIT_SENDS``),
``productflow-simpleworker`` (RQ's SimpleWorker, what the README ran before),
``procrastinate``. pgqueuer is in ``worker-ceiling``.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC

from bench import Context, record, side_by_side
from bench.procs import Proc, one_shot
from bench.stats import cdf_points, rate, ratio, summarize
from bench.workers import Workers

NAME = "peers"
# The dispatcher's lease, passed to it: the claim sets available_at = its clock + the lease (claim.CLAIM_SQL) and
# nothing later moves it for a dispatched envelope, so available_at - lease is when the claim ran.
LEASE_SECONDS = 30.0
# (metric name, from, to) of _ours_hops; each point is already stamped by the step itself.
HOPS = (
    # NOTIFY, the wake, the send's pipeline built (job hash enqueued_at); an envelope the NOTIFY named is sent
    # before its claim (dispatch.announced), others after it
    ("commit_to_in_rq", "commit", "in_rq"),
    ("in_rq_to_rq_start", "in_rq", "rq_start"),  # the send's round trip, the worker's blocking pop (RQ started_at)
    ("rq_start_to_start", "rq_start", "start"),  # the take script sent, the CAS sent (prestart: both in flight)
    ("start_to_run", "start", "run"),  # the CAS's commit, the take's reply, the job restored, the work's first line
)
# Beside the path: when the claim ran (DB clock), after the send for an announced envelope.
CLAIM = ("commit_to_claimed", "commit", "claimed")
VARIANTS = ["productflow", "productflow-writer", "productflow-simpleworker", "procrastinate"]
KINDS = {"productflow": "pipeline", "productflow-writer": "pipeline", "productflow-simpleworker": "simple"}
# The variant whose submits send their own envelopes (DISPATCH['SUBMIT_SENDS'], dispatch_app.dispatch.writer_send):
# a transaction of at most 8 jobs (the latency phases) skips the dispatcher; the e2e phase's 100 do not.
WRITER = {"productflow-writer": {"SUBMIT_SENDS": True}}


def _wait(predicate, timeout: float, interval: float = 0.05) -> bool:
    from bench.load import wait_until

    return wait_until(predicate, timeout=timeout, interval=interval)


def _phases(ctx: Context) -> tuple[list[int], int, list[float], float]:
    processes = [1, 2] if not ctx.quick else [1]
    e2e = int(ctx.size("peers_e2e_jobs", 2000, 30))
    rates = [100.0, 200.0, 400.0] if not ctx.quick else [200.0]
    seconds = ctx.size("peers_latency_s", 3.0, 0.1)
    return processes, e2e, rates, seconds


def _latency_metrics(metrics: dict, w: int, r: float, lat: list[float], count: int) -> None:
    if w == 1 and r == 200:
        metrics.setdefault("_cdf", cdf_points(lat))
    s = summarize(lat)
    metrics[f"w{w}_start_p50_ms_at{int(r)}"] = s["p50"]
    metrics[f"w{w}_start_p99_ms_at{int(r)}"] = s["p99"]
    metrics[f"w{w}_missing_at{int(r)}"] = count - len(lat)


# --- the project ---------------------------------------------------------------
def _ours_finished(ids: list[int]) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM dispatch_app_job WHERE id = ANY(%s) AND finished_at IS NOT NULL", [ids])
        return cursor.fetchone()[0]


def _ours_marked(ids: list[int]) -> int:
    """Of these jobs, how many first attempts' envelopes are marked dispatched: a mark may wait
    (DISPATCH["MARK_AHEAD_DELAY"]) past the job's end, and the sends per attempt must count the same envelopes."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s) AND attempt = 1 "
            "AND status = 'dispatched'",
            [ids],
        )
        return cursor.fetchone()[0]


def _ours_times(ids: list[int], column: str) -> dict[int, float]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, extract(epoch FROM {column}) FROM dispatch_app_job "
            f"WHERE id = ANY(%s) AND {column} IS NOT NULL",
            [ids],
        )
        return {row[0]: float(row[1]) for row in cursor.fetchall()}


def _ours_rq_times(env, ids: list[int], field: str) -> dict[int, float]:
    """job id -> a time from its job hash: ``enqueued_at`` (the dispatcher put it in RQ, set right before the
    send) or ``started_at`` (the worker's start writes, after its blocking pop returned)."""
    from datetime import datetime

    from dispatch_app.rq.ids import rq_job_id

    pipe = env.redis().pipeline(transaction=False)
    for i in ids:
        pipe.hget(f"rq:job:{rq_job_id(i, 1)}", field)
    out = {}
    for i, raw in zip(ids, pipe.execute(), strict=True):
        if raw:
            at = datetime.strptime(raw.decode(), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            out[i] = at.timestamp()
    return out


def _ours_runs(path: str, ids: list[int]) -> dict[int, float]:
    """job id -> when its work began (the fault suite's ledger lines, bench.workers; a job's first)."""
    wanted, out = set(ids), {}
    with open(path) as stamps:
        for line in stamps:
            _domain, job_id, _attempt, _pid, at = line.split()
            if int(job_id) in wanted:
                out.setdefault(int(job_id), float(at))
    return out


def _ours_claimed(ids: list[int]) -> dict[int, float]:
    """job id -> when its first claim ran: the claim sets available_at = its clock + the lease (DB clock).

    Only jobs whose envelope was claimed: one sent ahead of its claim (dispatch.announced) is marked without a
    lease, its available_at still its creation, and has no claim to date (it would read 30 s before its commit).
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT job_id, extract(epoch FROM available_at) - %s FROM dispatch_app_dispatchenvelope "
            "WHERE job_id = ANY(%s) AND attempt = 1 AND status = 'dispatched' AND send_attempts = 1 "
            "AND available_at > created_at + make_interval(secs => %s)",
            [LEASE_SECONDS, ids, LEASE_SECONDS / 2],
        )
        return {row[0]: float(row[1]) for row in cursor.fetchall()}


def _ours_hops(points: dict[str, dict[int, float]], metrics: dict, w: int, r: float) -> None:
    """Commit -> start, hop by hop (HOPS), from ``points``: point name -> job id -> time. Each point is the
    record its step itself writes, none added for the bench; one host here, so one clock."""
    for name, start, end in (*HOPS, CLAIM):
        first, then = points[start], points[end]
        hop = summarize([(then[i] - first[i]) * 1000 for i in first if i in then])
        metrics[f"w{w}_{name}_p50_ms_at{int(r)}"] = hop["p50"]
        metrics[f"w{w}_{name}_p99_ms_at{int(r)}"] = hop["p99"]
    # The share of jobs that went through a claim; the others were sent ahead of it (no claim on their path).
    metrics[f"w{w}_claimed_share_at{int(r)}"] = ratio(len(points["claimed"]), len(points["commit"]))


def _sends_per_attempt(metrics: dict, w: int, r: float, before: dict, after: dict) -> None:
    """Envelopes Redis answered a send for, per envelope marked dispatched, in this rate's window (1.0: no waste)."""
    if not before or not after:
        return
    sends = after.get("sends", 0) - before.get("sends", 0)
    dispatched = after.get("dispatched", 0) - before.get("dispatched", 0)
    metrics[f"w{w}_sends_per_attempt_at{int(r)}"] = ratio(sends, dispatched)
    metrics[f"w{w}_dispatcher_sends_at{int(r)}"] = sends  # a writer's own sends are not the dispatcher's
    metrics[f"w{w}_send_duplicates_at{int(r)}"] = after.get("duplicates", 0) - before.get("duplicates", 0)


def _ours(ctx: Context, kind: str) -> dict:
    metrics: dict = {}
    stamps = tempfile.NamedTemporaryFile(prefix="pf-run-stamps-", delete=False)
    stamps.close()
    try:
        _ours_phases(ctx, kind, stamps.name, metrics)
    finally:
        os.unlink(stamps.name)
    return metrics


def _ours_phases(ctx: Context, kind: str, stamps: str, metrics: dict) -> None:
    from bench.load import Child

    env = ctx.env
    processes, e2e, rates, seconds = _phases(ctx)
    for w in processes:
        env.reset()
        # The reset starts job ids from 1 again: the previous W's stamps would be read as this one's.
        open(stamps, "w").close()
        child = Child(env, {"kind": "dispatch", "listen": True, "lease": LEASE_SECONDS})
        try:
            with Workers(env, kind, ["delivery"], w, run_stamps=stamps):
                producer = Proc(["bench.producer", json.dumps({"domain": "delivery"})], env.child_env())
                try:
                    out = producer.run(60 + e2e / 20, count=e2e, rate=0, group=100)
                    ids = [int(k) for k in out["committed"]]
                    _wait(lambda ids=ids: _ours_finished(ids) >= len(ids), 60 + e2e / 20)
                    finished = _ours_times(ids, "finished_at")
                    if len(finished) == len(ids):
                        e2e_rate = rate(len(ids), max(finished.values()) - out["t0"])
                        metrics[f"w{w}_e2e_per_s"] = e2e_rate
                        metrics[f"w{w}_e2e_per_process_per_s"] = e2e_rate / w if e2e_rate else None
                    for r in rates:
                        count = max(5, int(r * seconds))
                        before = child.counts()
                        out = producer.run(60 + count / 20, count=count, rate=r)
                        committed = {int(k): v for k, v in out["committed"].items()}
                        ids = list(committed)
                        _wait(lambda ids=ids: _ours_finished(ids) >= len(ids), 30 + count / 20)
                        _wait(lambda ids=ids: _ours_marked(ids) >= len(ids), 10)
                        _sends_per_attempt(metrics, w, r, before, child.counts())
                        started = _ours_times(ids, "started_at")
                        runs = _ours_runs(stamps, ids)
                        lat = [(runs[i] - committed[i]) * 1000 for i in ids if i in runs]
                        _latency_metrics(metrics, w, r, lat, count)
                        # Where the wait is: commit -> marked dispatched (outbox hop), the rest is the worker hop.
                        dispatched = _ours_times(ids, "dispatched_at")
                        hop = summarize([(dispatched[i] - committed[i]) * 1000 for i in ids if i in dispatched])
                        metrics[f"w{w}_dispatched_p50_ms_at{int(r)}"] = hop["p50"]
                        metrics[f"w{w}_dispatched_p99_ms_at{int(r)}"] = hop["p99"]
                        # dispatched_at is stamped by the mark, after the send and on the marker thread; the
                        # job hash's enqueued_at is when the send began: commit -> in RQ, the hop itself.
                        in_rq = _ours_rq_times(env, ids, "enqueued_at")
                        hop = summarize([(in_rq[i] - committed[i]) * 1000 for i in ids if i in in_rq])
                        metrics[f"w{w}_in_rq_p50_ms_at{int(r)}"] = hop["p50"]
                        metrics[f"w{w}_in_rq_p99_ms_at{int(r)}"] = hop["p99"]
                        rq_wait = summarize(
                            [(started[i] - in_rq[i]) * 1000 for i in ids if i in in_rq and i in started]
                        )
                        metrics[f"w{w}_rq_to_start_p50_ms_at{int(r)}"] = rq_wait["p50"]
                        metrics[f"w{w}_rq_to_start_p99_ms_at{int(r)}"] = rq_wait["p99"]
                        points = {"commit": committed, "claimed": _ours_claimed(ids), "in_rq": in_rq}
                        points.update(rq_start=_ours_rq_times(env, ids, "started_at"), start=started, run=runs)
                        _ours_hops(points, metrics, w, r)
                finally:
                    producer.stop()
        finally:
            child.stop()


# --- procrastinate ----------------------------------------------------------------
def _procrastinate(ctx: Context) -> dict:
    env = ctx.env
    processes, e2e, rates, seconds = _phases(ctx)
    url, info = env.side_database("procrastinate")
    metrics: dict = {}
    try:
        import psycopg

        spec = json.dumps({"conninfo": " ".join(f"{k}={v}" for k, v in info.items()), "dbname": info["dbname"]})
        penv = env.child_env()
        one_shot(["bench.peer_procrastinate", "setup", spec], penv, timeout=120)
        offset = 0
        with psycopg.connect(autocommit=True, **info) as conn:

            def succeeded(first: int, last: int) -> dict[int, float]:
                rows = conn.execute(
                    "SELECT (j.args->>'i')::int, extract(epoch FROM e.at) FROM procrastinate_jobs j "
                    "JOIN procrastinate_events e ON e.job_id = j.id AND e.type = 'succeeded' "
                    "WHERE (j.args->>'i')::int BETWEEN %s AND %s",
                    [first, last],
                ).fetchall()
                return {r[0]: float(r[1]) for r in rows}

            def done(first: int, last: int) -> int:
                return conn.execute(
                    "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded' "
                    "AND (args->>'i')::int BETWEEN %s AND %s",
                    [first, last],
                ).fetchone()[0]

            for w in processes:
                workers = [Proc(["bench.peer_procrastinate", "worker", spec], penv) for _ in range(w)]
                phases = []
                try:
                    producer = Proc(["bench.peer_procrastinate", "producer", spec], penv)
                    try:
                        out = producer.run(60 + e2e / 20, count=e2e, rate=0, group=100, offset=offset)
                        first, last = offset, offset + e2e - 1
                        offset += e2e
                        _wait(lambda f=first, la=last: done(f, la) >= e2e, 60 + e2e / 20)
                        finished = succeeded(first, last)
                        if len(finished) == e2e:
                            e2e_rate = rate(e2e, max(finished.values()) - out["t0"])
                            metrics[f"w{w}_e2e_per_s"] = e2e_rate
                            metrics[f"w{w}_e2e_per_process_per_s"] = e2e_rate / w if e2e_rate else None
                        for r in rates:
                            count = max(5, int(r * seconds))
                            out = producer.run(60 + count / 20, count=count, rate=r, offset=offset)
                            first, last = offset, offset + count - 1
                            offset += count
                            _wait(lambda f=first, la=last, c=count: done(f, la) >= c, 30 + count / 20)
                            phases.append((r, count, {int(k): v for k, v in out["committed"].items()}))
                    finally:
                        producer.stop()
                finally:
                    starts: dict[int, float] = {}
                    for proc in workers:
                        res = proc.stop(expect_result=True) or {}
                        starts.update({int(k): v for k, v in res.get("starts", {}).items()})
                for r, count, committed in phases:
                    lat = [(starts[i] - t) * 1000 for i, t in committed.items() if i in starts]
                    _latency_metrics(metrics, w, r, lat, count)
    finally:
        env.drop_side_database(url)
    return metrics


def run(ctx: Context) -> list[dict]:
    processes, e2e, rates, seconds = _phases(ctx)

    def run_one(variant: str, index: int):
        ctx.env.dispatch_env = WRITER.get(variant, {})
        try:
            metrics = _procrastinate(ctx) if variant == "procrastinate" else _ours(ctx, KINDS[variant])
        finally:
            ctx.env.dispatch_env = {}
        cdf = metrics.pop("_cdf", [])
        return metrics, {"db_cdf": cdf} if cdf else {}

    out = side_by_side(ctx, NAME, VARIANTS, run_one)
    common = {
        "worker_processes": processes,
        "e2e": f"{e2e} jobs, 100 per transaction, flat out; first submit -> last finish recorded",
        "latency": f"{', '.join(f'{r:g}' for r in rates)} jobs/s for {seconds:g} s each, one transaction per 5 ms; "
        "commit returned -> job start",
        "task": "the project: the delivery task (start compare-and-set, provider call with 0 ms latency, finish); "
        "procrastinate: an async no-op",
    }
    params = {
        "productflow": dict(
            common,
            workers="manage.py runworkers --processes W (PipelineWorker), 1 job at a time per process",
            durability="job state in PostgreSQL (start and finish committed), RQ job hashes in Redis (no persistence)",
            dispatcher="one rundispatcher process (LISTEN/NOTIFY, defaults)",
        ),
        "productflow-writer": dict(
            common,
            workers="as productflow",
            durability="as productflow",
            dispatcher="one rundispatcher process; the producer sends its own envelopes after each commit "
            "(SUBMIT_SENDS), its commit stamped when its send began",
        ),
        "productflow-simpleworker": dict(
            common,
            workers="W x manage.py plain_rqworker --worker-class rq.worker.SimpleWorker (JSON serializer), "
            "1 job at a time",
            durability="as productflow",
            dispatcher="one rundispatcher process (LISTEN/NOTIFY, defaults)",
        ),
        "procrastinate": dict(
            common,
            workers="W processes, each one procrastinate worker, concurrency 1, LISTEN/NOTIFY, polling 5 s",
            durability="job state in PostgreSQL, each status change committed",
        ),
    }
    records = [
        record(NAME, v, params[v], out["runs"][v], out["series"][v], error=out["errors"].get(v)) for v in VARIANTS
    ]
    peer = records[VARIANTS.index("procrastinate")]["metrics"]
    for rec in records[:2]:
        m = rec["metrics"]
        if not m:
            continue
        for w in processes:
            key = f"w{w}_e2e_per_process_per_s"
            m[f"w{w}_e2e_x_procrastinate"] = ratio(m.get(key), peer.get(key))
            for r in rates:
                for p in ("p50", "p99"):
                    key = f"w{w}_start_{p}_ms_at{int(r)}"
                    m[f"w{w}_start_{p}_x_procrastinate_at{int(r)}"] = ratio(m.get(key), peer.get(key))
    return records
