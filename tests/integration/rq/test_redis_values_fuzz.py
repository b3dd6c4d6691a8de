"""Property: junk in any Redis key the project owns or reads ends no worker, dispatcher or reader; the job runs once.

Hypothesis writes wrong types (a string, a list, a set, a sorted set, a hash, a stream) and junk values (not
numbers, not UTF-8, NUL bytes, 18+ digits, 100 KB) into the keys a worker, the dispatcher and the operator's
pages read or write: the refusal counter, both lanes' queue and intermediate lists, their RQ registries and worker
sets, RQ's worker and queue registries, the deployments registry, the worker's own hash and executions set (while
its job runs), the real job's executions, dependents and results keys (while it runs), a forged job id queued
ahead of the real job, and a forged worker registered on the queue (its liveness claim included). Then, on real
PostgreSQL and real Redis: the dispatcher sends a real envelope (``DispatchLoop.run_once``), a ``PipelineWorker``
burst runs what is queued, and with every junk value written again, the dashboard (``board.build``), the job list's
RQ side and queue order, the workers' health, ``dispatchstats``, ``admission.totals`` and a whole metrics scrape
read them. Nothing raises; the real job succeeds and its vendor call is made once. A send the junk refused (a
queue key of another type) is retried once after the worker, which resets the keys it writes, has run.

And, each on its own: the replay (junk refusal counter, then a forged job), a liveness claim that is no session
name beside a real one, and a heartbeat refused by a worker hash made a string.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from rq import Queue
from rq.serializers import JSONSerializer

from dispatch_app import submit
from dispatch_app.db import liveness
from dispatch_app.domains import lanes
from dispatch_app.domains.providers import set_provider
from dispatch_app.housekeeping.metrics import DispatchMetrics
from dispatch_app.models import DispatchEnvelope, Job
from dispatch_app.rq import internals as rq_internals
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.rq.state import health
from dispatch_app.rq.state import jobs as rqjobs
from dispatch_app.rq.state import order as queue_order
from dispatch_app.rq.state import queues as rqside
from dispatch_app.rq.worker import PipelineWorker, admission
from dispatch_app.rq.worker.beat import Heartbeat
from dispatch_app.views import board
from tests.factories import PAYLOADS
from tests.integration import provider_kit
from tests.integration.db.test_liveness import beacon  # noqa: F401 - the fixture: a real session
from tests.integration.recovery_helpers import dispatch_now

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "fuzz-values"
FORGED_ID = "fuzz-junk-1"  # queued ahead of the real job; its key gets the junk
FORGED_WORKER = "forged-worker"  # registered on the queue; its hash gets the junk
BEFORE, DURING = "before", "during"
REGISTRIES = ("wip", "finished", "failed", "deferred", "scheduled", "canceled")


def targets(rq_id: str, refused: str | None = None) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (key, when junk may be written: before the send, or while the real job runs)."""
    both = (BEFORE, DURING)
    out = {
        "refused": (refused or admission.refused_key(), both),
        "workers": ("rq:workers", both),
        "queues": ("rq:queues", both),
        "deployments": ("productflow:deployments", both),
        "forged job": (rq_internals.job_key(FORGED_ID), both),
        "forged worker": (rq_internals.worker_key_prefix() + FORGED_WORKER, both),
        "forged executions": (f"{rq_internals.worker_key_prefix()}{FORGED_WORKER}:executions", both),
        # A worker's name is unguessable (runworkers: a uuid suffix): its own keys are junked while it runs.
        "worker": (rq_internals.worker_key_prefix() + WORKER, (DURING,)),
        "worker executions": (f"{rq_internals.worker_key_prefix()}{WORKER}:executions", (DURING,)),
        "job": (rq_internals.job_key(rq_id), (DURING,)),
        "job executions": (f"rq:executions:{rq_id}", both),
        "job dependents": (f"{rq_internals.job_key(rq_id)}:dependents", both),
        "job results": (f"rq:results:{rq_id}", both),
    }
    for lane in lanes.queues("delivery"):
        out[f"{lane} queue"] = (rq_internals.queue_key(lane), both)
        out[f"{lane} intermediate"] = (f"{rq_internals.queue_key(lane)}:intermediate", both)
        out[f"{lane} workers"] = (rq_internals.workers_of_queue_key(lane), both)
        for registry in REGISTRIES:
            out[f"{lane} {registry}"] = (f"rq:{registry}:{lane}", both)
    return out


NAMES = sorted(targets("pf-x-1-1", refused="(read from the database in a test)"))
TEXT = st.one_of(
    st.sampled_from(
        [b"", b"x", b"-1", b"nan", b"inf", b"1e400", b"9" * 30, b"\x00pf-worker:x \x00", b"\xff\xfe", b"pf-1-1"]
    ),
    st.just(b"7" * 100_000),
    st.binary(max_size=12),
)
FIELDS = st.sampled_from(
    [
        "count", "resets", "kind:bad_id", "last_at", "last_func", "successful_job_count", "failed_job_count",
        "total_working_time", "status", "last_heartbeat", "pid", "queues", "state", "pf_pg_session",
        "pf_heartbeat_interval", "death", "hostname", "data", "origin", "timeout", "pf_taken_by",
    ]
)  # fmt: skip
JUNK = st.one_of(
    st.tuples(st.just("string"), TEXT),
    st.tuples(st.just("list"), st.lists(TEXT, min_size=1, max_size=3)),
    st.tuples(st.just("set"), st.lists(TEXT, min_size=1, max_size=3)),
    st.tuples(st.just("zset"), st.dictionaries(TEXT, st.floats(-1e12, 1e12), min_size=1, max_size=3)),
    st.tuples(st.just("hash"), st.dictionaries(FIELDS, TEXT, min_size=1, max_size=4)),
    st.tuples(st.just("stream"), st.dictionaries(FIELDS, TEXT, min_size=1, max_size=2)),
)
PLANS = st.lists(st.tuples(st.sampled_from(NAMES), JUNK, st.sampled_from([BEFORE, DURING])), min_size=1, max_size=6)


def write(conn, key: str, junk) -> None:
    kind, value = junk
    conn.delete(key)
    if kind == "string":
        conn.set(key, value)
    elif kind == "list":
        conn.rpush(key, *value)
    elif kind == "set":
        conn.sadd(key, *value)
    elif kind == "zset":
        conn.zadd(key, value)
    elif kind == "hash":
        conn.hset(key, mapping=value)
    else:
        conn.xadd(key, value)


class JunkDuringTheJob(provider_kit.CountingProvider):
    """The real vendor stand-in, which writes the plan's ``during`` junk while the real job runs (once)."""

    during = None

    def deliver(self, asset: str, target: str) -> dict:
        if self.during is not None:
            self.during, during = None, self.during
            during()
        return super().deliver(asset, target)


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    installed = JunkDuringTheJob(tmp_path_factory.mktemp("provider"))
    set_provider(installed)
    yield installed
    set_provider(None)


def run_worker(conn) -> None:
    queues = [Queue(lane, connection=conn, serializer=JSONSerializer) for lane in lanes.queues("delivery")]
    PipelineWorker(queues, connection=conn, name=WORKER).work(burst=True)


def read_everything(conn, job) -> None:
    """What the dashboard, the job list, the timeline, dispatchstats and a metrics scrape read: none may raise."""
    snap = board.build()
    assert "delivery" in snap["domains"]
    rqjobs.states([job], statuses=("submitted", "queued", "running", "succeeded"))
    queue_order.positions(["delivery"], conn=conn)
    rqside.snapshot(conn)
    health.snapshot(conn)
    admission.totals(conn)
    call_command("dispatchstats", "--json", stdout=io.StringIO())
    assert b"productflow_rq_jobs_refused" in generate_latest(DispatchMetrics().registry)


def real_job_runs(conn, provider, plan) -> Job:
    keys = None

    def junk(phase: str) -> None:
        for name, value, when in plan:
            key, phases = keys[name]
            if when == phase and phase in phases:
                write(conn, key, value)

    real = submit("delivery", PAYLOADS["delivery"])
    keys = targets(rq_job_id(real.pk, 1))
    conn.rpush(rq_internals.queue_key("delivery"), FORGED_ID)  # ahead of the real job, unless its key is junked
    for name in ("workers", "delivery workers"):
        conn.sadd(keys[name][0], rq_internals.worker_key_prefix() + FORGED_WORKER)
    junk(BEFORE)
    provider.during = lambda: junk(DURING)
    deliveries = provider.deliveries
    dispatch_now()
    run_worker(conn)
    real.refresh_from_db()
    if real.status != "succeeded":  # its send met a key of the wrong type, which the worker has reset since
        DispatchEnvelope.objects.filter(job=real).update(available_at="2000-01-01T00:00:00Z")
        dispatch_now()
        run_worker(conn)
        real.refresh_from_db()
    provider.during = None
    assert real.status == "succeeded", (real.status, plan)
    assert provider.deliveries - deliveries == 1
    junk(BEFORE)
    junk(DURING)
    read_everything(conn, real)
    return real


# A worker run per example: 50 in CI, 1,000 with HYPOTHESIS_PROFILE=thorough.
@settings(max_examples=max(10, settings().max_examples // 3 if settings().max_examples < 1000 else 1000))
@given(plan=PLANS)
def test_junk_in_any_key_ends_nothing_and_the_real_job_runs_once(provider, redis_conn, plan):
    redis_conn.flushdb()
    real_job_runs(redis_conn, provider, plan)


@pytest.mark.parametrize(
    "junk",
    [
        ("string", b"x"),
        ("list", [b"1", b"2"]),
        ("hash", {"count": b"x", "kind:not_an_entry_point": b"9" * 30}),
        ("hash", {"count": b"9223372036854775807"}),
        ("zset", {b"count": 1.0}),
    ],
    ids=["string", "list", "not-a-count", "at-the-overflow", "zset"],
)
def test_a_junk_refusal_counter_is_reset_and_the_refusal_still_made(provider, redis_conn, junk):
    """``HSET productflow:refused count x`` then a forged job: the refusal's HINCRBY raised and ended the worker."""
    write(redis_conn, admission.refused_key(), junk)
    queue = Queue("delivery", connection=redis_conn, serializer=JSONSerializer)
    forged = queue.enqueue("os.system", "true")

    real = real_job_runs(redis_conn, provider, [])

    assert forged.id.encode() in redis_conn.zrange("rq:failed:delivery", 0, -1)  # refused, into the failed registry
    write(redis_conn, admission.refused_key(), junk)  # junk again: the next refusal resets it and counts on it
    queue.enqueue("os.system", "true")
    run_worker(redis_conn)
    totals = admission.totals(redis_conn)
    assert (totals["count"], totals["kinds"], totals["resets"]) == (1, {"not_an_entry_point": 1}, 1), totals
    assert Job.objects.get(pk=real.pk).status == "succeeded"


def test_a_liveness_claim_that_is_no_session_name_leaves_the_others_judged(redis_conn, beacon):  # noqa: F811
    """A NUL byte in one worker's claim, sent as a query parameter, failed the query: no worker was judged."""
    live = beacon(liveness.tag(liveness.WORKER, "w-live"))
    where = live.claim.split(" ", 1)[1]
    claims = {"w-live": live.claim, "w-forged": f"{liveness.WORKER}\x00x {where}", "w-long": f"{'x' * 99} {where}"}

    assert liveness.judged(claims) == {"w-live": True, "w-forged": None, "w-long": None}


def test_a_heartbeat_refused_by_junk_resets_the_keys_and_registers_the_worker_again(redis_conn):
    worker = PipelineWorker([Queue("delivery", connection=redis_conn, serializer=JSONSerializer)], name="beat-junk")
    worker.register_birth()
    by_queue = rq_internals.workers_of_queue_key("delivery")
    redis_conn.delete(worker.key, by_queue)
    redis_conn.set(worker.key, "x")  # its hash made a string: every beat's HSET fails
    redis_conn.set(by_queue, "x")
    beat = Heartbeat(worker, 10)

    assert beat.run_once() is False  # refused, reset, registered again
    assert redis_conn.type(worker.key) == b"hash" and redis_conn.hget(worker.key, "queues")
    assert worker.key.encode() in redis_conn.smembers(by_queue) and worker.key.encode() in redis_conn.smembers(
        "rq:workers"
    )
    assert beat.run_once() is True
