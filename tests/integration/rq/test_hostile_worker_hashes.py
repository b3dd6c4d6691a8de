"""What the operator's readers make of worker and job hashes anyone on Redis's network may have written.

Real PostgreSQL, real Redis. A forged worker (registered like RQ registers one, on this host) whose
hash holds bytes that are not UTF-8, counters that are not numbers, a pid beyond any pid_max, a
heartbeat that is no timestamp and an infinite heartbeat period, and whose executions set holds
members without a job id; and a real job whose RQ hash has a status that is not UTF-8. The
dashboard, the job's RQ side (timeline), ``dispatchstats``, the job list's queue order and the
workers' health read them: each renders, shows the forged worker with what could be read, and
none raises. (Recovery's evidence raises on such hashes on purpose: the candidate is backed off,
never acted on from a worker hash it cannot read; tests/acceptance/faults/test_23_bad_recovery_candidates.py.)
"""

from __future__ import annotations

import io
import json
import socket

import pytest
from django.core.management import call_command

from dispatch_app.outbox.submit import submit
from dispatch_app.rq import internals as rq_internals
from dispatch_app.rq.fields import HEARTBEAT_INTERVAL_FIELD, RECENT_FIELD
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.rq.state import health
from dispatch_app.rq.state import jobs as rqjobs
from dispatch_app.rq.state import order as queue_order
from dispatch_app.rq.state import queues as rqside
from dispatch_app.views import board
from tests.factories import PAYLOADS

pytestmark = pytest.mark.django_db
NAME = "forged-worker"


@pytest.fixture
def forged_worker(redis_conn):
    key = rq_internals.worker_key_prefix() + NAME
    redis_conn.hset(
        key,
        mapping={
            "pid": "99999999999999999999",
            "hostname": socket.gethostname(),  # this host: the pid is what would be checked
            "queues": b"delivery,\xff\xfe",
            "state": b"\xff\xfe",
            "successful_job_count": "lots",
            "failed_job_count": "inf",
            "last_heartbeat": "yesterday",
            HEARTBEAT_INTERVAL_FIELD: "inf",
            RECENT_FIELD: b"\xc3",
        },
    )
    redis_conn.sadd(f"{key}:executions", b"no-job-id", b"\xff:execution")
    redis_conn.sadd("rq:workers", key)
    redis_conn.sadd(rq_internals.workers_of_queue_key("delivery"), key)
    return key


def test_the_forged_worker_is_read_with_what_can_be_read(redis_conn, forged_worker):
    info = rqside.read_workers(redis_conn, [NAME])[NAME]
    assert (info.pid, info.successful, info.failed, info.heartbeat_interval) == (None, 0, 0, None)
    assert info.last_heartbeat is None and info.queues[0] == "delivery"

    [seen] = [w for w in health.workers(redis_conn) if w.name == NAME]
    assert (seen.successful, seen.failed, seen.last_heartbeat) == (0, 0, None)
    assert seen.current_job is not None  # the executions set was read, its members as text


def test_the_dashboard_dispatchstats_and_a_jobs_rq_side_render(redis_conn, forged_worker):
    job_id = submit("delivery", PAYLOADS["delivery"]).pk
    redis_conn.hset(rq_internals.job_key(rq_job_id(job_id, 1)), mapping={"status": b"\xff", "worker_name": NAME})

    data = board.build()
    assert data["domains"]["delivery"]["rq"] is not None

    state = rqjobs.read_jobs(redis_conn, [(job_id, 1, "delivery")])[(job_id, 1)]
    assert state.in_redis and state.rq_status == "\ufffd" and state.worker == NAME

    out = io.StringIO()
    call_command("dispatchstats", "--json", stdout=out)
    assert NAME in json.dumps(json.loads(out.getvalue()))


def test_the_job_lists_queue_order_reads_past_an_id_that_is_not_utf8(redis_conn):
    redis_conn.rpush("rq:queue:delivery", b"\xff\xfe", b"pf-7-1")

    places, errors = queue_order.positions(["delivery"], conn=redis_conn)

    assert places == {queue_order.key(7, 1): 2} and errors == []
