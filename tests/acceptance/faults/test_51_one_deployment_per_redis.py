"""Scenario 51: a second deployment on the same Redis database, and jobs the dispatcher did not write (issue 56.4).

Replayed as an outsider found them: deployment B, started against the Redis database deployment A runs on, used to
take A's jobs and run its own rows of the same numbers (A's jobs never ran, nothing was logged); a hash planted at
the RQ id a job would get made the dispatcher count the job as sent and push nothing until recovery (>= 300 s); an
id pushed with no hash moved a `submitted` job to `queued` with a dispatch that never happened.

Now, on real processes (``rundispatcher``, ``runworkers``, ``recover --once``): each of B's commands refuses to
start, exit code 2, naming both deployments, while A's jobs run once each; a planted hash is replaced by the job's
first send (on its timeline) and the job runs at once; a bare id leaves its job untouched.
"""

from __future__ import annotations

import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from tests.acceptance.faults import invariants
from tests.acceptance.faults.conftest import fresh_database
from tests.acceptance.faults.infra import Stack, record_figures
from tests.helpers import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(180)]

DELIVERY = {"asset": "a-1", "target": "https://target.example.invalid/1"}


def _namespace(stack: Stack) -> str:
    """The deployment's namespace as its processes derive it from their database (dispatch_app.rq.deployment)."""
    return stack.rq_job_id(1, 1).split("-")[1]


@pytest.fixture
def second_db(private_postgres):
    """Deployment B's database: another one on the same PostgreSQL server."""
    yield from fresh_database(private_postgres)


def test_a_second_deployment_on_the_same_redis_database_refuses_to_start(private_stack, second_db, subprocess_env):
    a = private_stack
    b = Stack(db_url=second_db, redis_url=a.redis_url, base_env=subprocess_env, tmp=a.tmp / "b")
    b.tmp.mkdir()
    try:
        a.dispatcher()
        a.worker("delivery")
        ids = a.submit(10)
        a.wait_all("succeeded", 10, timeout=60)
        ours, theirs = _namespace(a), _namespace(b)
        assert ours != theirs
        refusals = {
            "rundispatcher": b.manage("rundispatcher", "--no-recovery", timeout=60),
            "runworkers": b.manage("runworkers", "--queues", "delivery", "--burst", timeout=60),
            "recover": b.manage("recover", "--once", timeout=60),
        }
        for command, done in refusals.items():
            assert done.returncode == 2, (command, done.stdout[-2000:], done.stderr[-2000:])
            said = done.stderr
            assert f"another deployment: {ours} (database" in said and f"This deployment is {theirs}" in said, said
        # A ran on: more work after B's attempts runs once, on A.
        ids += a.submit(10)
        a.wait_all("succeeded", 20, timeout=60)
        report = invariants.check_stack(a, expected_jobs=20, expect_status={"succeeded": 20})
        assert b.scalar("SELECT count(*) FROM dispatch_app_job") == 0
        record_figures("51_second_deployment_refused", refused_commands=len(refusals), **report.figures())
    finally:
        b.close()


def test_a_planted_hash_and_a_bare_id_change_no_job(shared_stack):
    stack = shared_stack
    stack.dispatcher("--poll-interval", "0.2")
    stack.worker("delivery")
    conn = redis.Redis.from_url(stack.redis_url)
    [planted_for] = stack.submit(1, delay=2.0)  # due in 2 s: a hash is planted under its id before it is sent
    [bare_for] = stack.submit(1, delay=3600)  # due in an hour: an id for it is pushed with no hash
    Queue("delivery", connection=conn, serializer=JSONSerializer).create_job(
        "dispatch_app.run.delivery", args=[planted_for, 1], job_id=stack.rq_job_id(planted_for, 1)
    ).save()
    conn.rpush("rq:queue:delivery", stack.rq_job_id(bare_for, 1))

    # Not recovery's 300 s: the first send replaces the planted hash and the job runs.
    stack.wait_all("succeeded", 1, timeout=30)
    [(status, attempt)] = stack.sql("SELECT status, attempt FROM dispatch_app_job WHERE id = %s", [planted_for])
    assert (status, attempt) == ("succeeded", 1)
    kinds = [k for (k,) in stack.sql("SELECT kind FROM dispatch_app_jobevent WHERE job_id = %s", [planted_for])]
    assert "foreign_hash_replaced" in kinds
    wait_until(lambda: conn.llen("rq:queue:delivery") == 0, timeout=15, message="the bare id taken by the worker")
    row = stack.sql("SELECT status, dispatched_at, started_at FROM dispatch_app_job WHERE id = %s", [bare_for])
    assert row == [("submitted", None, None)]
    assert stack.ledger()[(planted_for, 1)] == 1 and stack.ledger()[(bare_for, 1)] == 0
