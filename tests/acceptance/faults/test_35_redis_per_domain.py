"""Scenario 35: one Redis per domain group; one server goes down, only its domain waits (two private redis-servers).

``workflow`` lives on its own Redis (``REDIS_URL_WORKFLOW``), every other queue on
``REDIS_URL``. The real processes: one ``rundispatcher``, one ``runworkers`` per
server (a mixed ``--queues`` is refused). With the workflow server down, the
workflow envelopes stay pending (given back uncounted, never dead) while new
delivery jobs are still dispatched and run on the other server; once the server is
back every workflow job is delivered and runs.
"""

import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.redis_timeouts import short_redis_timeouts
from tests.helpers import wait_until
from tests.private_servers import PrivateRedis, make_base_dir, remove_tree

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(240)]


def _jobs(stack, ids, status: str) -> int:
    return stack.scalar("SELECT count(*) FROM dispatch_app_job WHERE id = ANY(%s) AND status = %s", [ids, status])


def test_one_redis_down_pauses_only_the_domain_on_it(private_redis_stack, private_redis):
    stack = private_redis_stack
    base = make_base_dir("pf-redis-workflow-")
    workflow_redis = PrivateRedis(base)
    workflow_redis.start()
    try:
        split = {"REDIS_URL_WORKFLOW": workflow_redis.url}
        refused = stack.manage("runworkers", "--queues", "delivery,workflow", "--burst", **split)
        assert refused.returncode != 0
        assert "--queues workflow (on unix://" in refused.stderr and "--queues delivery (on unix://" in refused.stderr

        dispatcher = stack.dispatcher(
            "--poll-interval",
            "0.5",
            "--lease",
            "10",
            DISPATCH_SEND_BACKOFF_BASE=0.2,
            DISPATCH_SEND_BACKOFF_MAX=1.0,
            DISPATCH_MAX_SEND_ATTEMPTS=1,  # an outage never counts: one counted failure would be dead at once
            **short_redis_timeouts(stack.redis_url, 1.0),
            **split,
        )
        stack.worker("delivery", **split)
        stack.worker("workflow", name="worker-workflow", **split)
        before = stack.submit(10, prefix="d0") + stack.submit(10, domain="workflow", prefix="w0")
        stack.wait_all("succeeded", len(before), timeout=90)
        # Each queue went to its own server.
        assert private_redis.client().smembers("rq:queues") == {b"rq:queue:delivery"}
        assert workflow_redis.client().smembers("rq:queues") == {b"rq:queue:workflow"}

        workflow_redis.stop()
        waiting = stack.submit(30, domain="workflow", prefix="w1")
        wait_until(
            lambda: (
                stack.scalar(
                    "SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s) "
                    "AND last_error LIKE 'dispatch paused: Redis unreachable%%'",
                    [waiting],
                )
                > 0
            ),
            timeout=30,
            message="the workflow server's sends to back off",
        )
        # The other server's domain makes progress meanwhile: dispatched and run to the end.
        going = stack.submit(30, prefix="d1")
        wait_until(
            lambda: _jobs(stack, going, "succeeded") == len(going),
            timeout=60,
            message="delivery jobs to run while the workflow server is down",
        )
        assert _jobs(stack, waiting, "submitted") == len(waiting), "no workflow job was sent while its server was down"
        assert (
            stack.scalar(
                "SELECT count(*) FROM dispatch_app_dispatchenvelope WHERE job_id = ANY(%s) "
                "AND (status <> 'pending' OR (lease_token IS NULL AND send_attempts > 0))",
                [waiting],
            )
            == 0
        ), "the workflow envelopes stay pending, their attempts uncounted"
        assert dispatcher.alive()

        workflow_redis.start()  # back, empty
        wait_until(
            lambda: _jobs(stack, waiting, "succeeded") == len(waiting),
            timeout=90,
            message="the workflow backlog to be delivered and run once its server is back",
        )
        assert dispatcher.stop() == 0, dispatcher.output()
        assert stack.count_envelopes("dead") == 0
        invariants.check_stack(stack, expected_jobs=len(before) + len(waiting) + len(going))
    finally:
        workflow_redis.stop()
        remove_tree(base)
