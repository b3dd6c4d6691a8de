"""Scenario 50: no value in Redis ends a worker or a dispatcher (issue 56.3).

The replay: ``HSET productflow:refused count x``, then any forged job: the refusal's HINCRBY raised a
ResponseError the worker loop did not catch, and each forged job ended one worker process.

Two project workers (``runworkers --processes 1``: the worker is the process) and a dispatcher run
throughout. The refusal counter is made junk of one type after another: a string, a list, a hash whose
count is ``x``, a count past 64 bits, a sorted set; after each, a forged ``os.system`` job goes into every
lane of every domain and real jobs are submitted. Then each worker's own counters in its RQ hash
(``successful_job_count``, ``failed_job_count``, ``total_working_time``) are made junk while it runs, and
more real jobs are submitted.

At the end: both workers and the dispatcher are the processes they were (alive, no traceback in their
logs); every real job succeeded and ran once (the execution ledger); nothing forged ran (the canary file);
every forged job is in its lane's failed registry; after each junk, the counter counts that round's
refusals and says it was reset (``resets``, logged as ``refused_counter_reset``).
"""

from __future__ import annotations

import time

import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from dispatch_app.domains import lanes
from dispatch_app.rq import internals as rq_internals
from dispatch_app.rq.worker import admission
from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures
from tests.acceptance.faults.test_47_hostile_redis_writer import DOMAINS, PAYLOADS
from tests.helpers import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(180)]

JUNK = {
    "string": lambda conn, key: conn.set(key, "x"),
    "list": lambda conn, key: conn.rpush(key, "count", "x"),
    "count x": lambda conn, key: conn.hset(key, "count", "x"),  # the replay
    "past 64 bits": lambda conn, key: conn.hset(key, mapping={"count": "9" * 25, "kind:not_an_entry_point": "-1"}),
    "sorted set": lambda conn, key: conn.zadd(key, {"count": 1}),
}
WORKER_COUNTERS = {"successful_job_count": "x", "failed_job_count": "9" * 25, "total_working_time": "nan"}


def test_junk_in_the_counters_ends_no_worker_and_no_dispatcher(shared_stack):
    stack = shared_stack
    started = time.monotonic()
    canary = stack.tmp / "canary"
    conn = redis.Redis.from_url(stack.redis_url)
    dispatcher = stack.dispatcher("--poll-interval", "1")
    workers = [stack.worker(*DOMAINS, name=f"worker{i}") for i in range(2)]
    hashes = worker_hashes(stack, conn, workers)
    lane_names = [lane for domain in DOMAINS for lane in lanes.queues(domain)]

    real: list[int] = []
    forged: list[tuple[str, str]] = []
    for n, (label, make_junk) in enumerate(JUNK.items()):
        conn.delete(admission.refused_key())
        make_junk(conn, admission.refused_key())
        this_round = [
            (lane, Queue(lane, connection=conn, serializer=JSONSerializer).enqueue("os.system", f"touch {canary}").id)
            for lane in lane_names
        ]
        for domain in DOMAINS:
            real += stack.submit(1, domain=domain, payloads=[PAYLOADS[domain](n)])
        wait_until(
            lambda round_=this_round: stack.check_alive() or all(refused(conn, *f) for f in round_),
            timeout=30,
            message=f"the workers refused every forged job after the counter was made junk ({label})",
        )
        totals = admission.totals(conn)
        assert totals["count"] == len(this_round) and totals["resets"] >= 1, (label, totals)
        forged += this_round

    for key in hashes:  # the workers' own counters, while they run
        conn.hset(key, mapping=WORKER_COUNTERS)
    for n in range(3):
        for domain in DOMAINS:
            real += stack.submit(1, domain=domain, payloads=[PAYLOADS[domain](100 + n)])
    stack.wait_all("succeeded", len(real), timeout=60)

    assert not canary.exists(), canary.read_text()
    report = invariants.check_stack(stack, expected_jobs=len(real))
    assert all(refused(conn, *f) for f in forged)
    for proc in [dispatcher, *workers]:
        assert proc.alive(), proc.output()[-3000:]
        assert "Traceback" not in proc.output(), proc.output()[-6000:]
    logs = "".join(proc.output() for proc in workers)
    assert "action=refused_counter_reset" in logs
    assert worker_hashes(stack, conn, workers) == hashes  # the same workers: none ended and came back
    record_figures(
        "50_redis_values_kill_nothing",
        real_jobs=len(real),
        forged_jobs=len(forged),
        counter_junk=list(JUNK),
        worker_bad_replies=logs.count("action=worker_bad_reply"),
        seconds=round(time.monotonic() - started, 1),
        **report.figures(),
    )


def refused(conn: redis.Redis, lane: str, rq_id: str) -> bool:
    return conn.zscore(f"rq:failed:{lane}", rq_id) is not None


def worker_hashes(stack, conn: redis.Redis, workers) -> list[str]:
    """The RQ hash key of each worker process, by the pid in its name (runworkers: pf.<host>.<pid>.<suffix>)."""
    prefix = rq_internals.worker_key_prefix()

    def keys() -> list[str]:
        registered = [k.decode() for k in conn.smembers("rq:workers")]
        return sorted(k for k in registered for w in workers if k.startswith(prefix) and f".{w.pid}." in k)

    wait_until(
        lambda: stack.check_alive() or len(keys()) == len(workers), timeout=30, message="both workers registered"
    )
    return keys()
