"""Real processes (rundispatcher, runworkers) on the test database and Redis: a dispatcher killed between
the caller's commit and the send to Redis loses no task, and a rolled-back enqueue never runs."""

from __future__ import annotations

import signal

import pytest
from django.db import transaction

from dispatch_app.tasks.compat import TaskResultStatus
from tests.acceptance.faults.redis_timeouts import short_redis_timeouts
from tests.helpers import wait_until
from tests.tasks import sample

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(180), pytest.mark.version_dependent]

TASKS = 20
LEASE = 2.0


class Abort(Exception):
    pass


def test_a_dispatcher_killed_between_the_commit_and_the_send_loses_no_task(shared_stack, redis_conn):
    stack = shared_stack
    with transaction.atomic():  # the caller's transaction: both tasks and its own writes commit together
        results = [sample.add.enqueue(n, n) for n in range(TASKS)]
    with pytest.raises(Abort), transaction.atomic():
        rolled_back = sample.add.enqueue(1000, 1)
        raise Abort

    timeouts = short_redis_timeouts(stack.redis_url, 0.5)
    args = ("--lease", str(LEASE), "--batch-size", "100", "--poll-interval", "0.2")
    # Claims the envelopes (committed lease), then stands still before its Redis pipeline: killed there.
    doomed = stack.dispatcher(
        *args,
        name="dispatcher-doomed",
        PRODUCTFLOW_FAILPOINTS="hold_send",
        PRODUCTFLOW_FAILPOINT_HOLD_SECONDS=120,
        **timeouts,
    )
    wait_until(
        lambda: (
            stack.scalar(
                "SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE lease_token IS NOT NULL AND send_attempts = 1"
            )
            == TASKS
        ),
        timeout=60,
        message="the doomed dispatcher to claim every envelope",
    )
    doomed.send(signal.SIGKILL)
    assert doomed.wait(timeout=10) == -signal.SIGKILL
    assert not redis_conn.keys("rq:job:*"), "nothing reached Redis before the kill"
    assert stack.count_envelopes("pending") == TASKS

    worker = stack.worker("default")
    successor = stack.dispatcher(*args, name="dispatcher-successor", **timeouts)
    stack.wait_all("succeeded", TASKS, timeout=90)
    assert successor.stop() == 0, successor.output()
    assert worker.stop() in (0, 1)

    for n, result in enumerate(results):
        result.refresh()
        assert (result.status, result.return_value, result.attempts) == (TaskResultStatus.SUCCESSFUL, 2 * n, 1)
    assert stack.scalar("SELECT count(*) FROM dispatch_app_job") == TASKS
    assert stack.scalar("SELECT count(*) FROM dispatch_app_job WHERE id = %s", [int(rolled_back.id)]) == 0
    # Every task ran exactly once (the fault suite's execution ledger wraps the domain's work).
    assert sorted(stack.ledger().items()) == sorted(((int(r.id), 1), 1) for r in results)
    claims = dict(stack.sql("SELECT send_attempts, count(*) FROM dispatch_app_dispatchenvelope GROUP BY 1"))
    assert claims == {2: TASKS}, f"claimed by the killed dispatcher, then by its successor: {claims}"
