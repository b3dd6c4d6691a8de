"""Scenario 33: a send outlives its lease; a second dispatcher re-claims and re-sends while the job runs.

Dispatcher A claims the envelope and its send stands still (failpoint
``hold_send``, released by the test) past the lease. Dispatcher B re-claims it
when the lease runs out (database clock), sends it and marks it; a worker starts
the job, which takes a while. Then the test lets A's held send go through while
the job is running: RQ's
create-if-absent script finds the job hash and writes nothing, so

- the running job's RQ hash is untouched (it still says "started", not
  "queued"; before, ``enqueue_many`` rewrote it and recovery read a running job
  as finished or re-queued),
- nothing is queued a second time, and A's mark loses the compare-and-set,
- the work runs once.

Start-up refuses a lease that does not outlast the worst case of a send, so the
2 s lease comes with 0.5 s Redis timeouts (``conf.check_lease``).
"""

import time

import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures
from tests.acceptance.faults.redis_timeouts import short_redis_timeouts
from tests.helpers import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(120)]

LEASE, WORK_SECONDS = 2.0, 8.0


def test_a_resend_after_the_lease_leaves_the_running_job_alone(private_redis_stack, private_redis):
    stack = private_redis_stack
    redis = private_redis.client()
    timeouts = short_redis_timeouts(stack.redis_url, 0.5)
    worker = stack.worker("delivery", DISPATCH_PROVIDER_LATENCY_MS=WORK_SECONDS * 1000)
    [job_id] = stack.submit(1, prefix="s33")
    rq_key = f"rq:job:{stack.rq_job_id(job_id, 1)}"
    release = stack.tmp / "release-held-send"

    held = stack.dispatcher(
        "--lease",
        str(LEASE),
        "--poll-interval",
        "0.2",
        name="dispatcher-held",
        PRODUCTFLOW_FAILPOINTS="hold_send",
        PRODUCTFLOW_FAILPOINT_HOLD_SECONDS=90,  # a safety net: the test releases it
        PRODUCTFLOW_FAILPOINT_RELEASE=release,
        **timeouts,
    )
    wait_until(
        lambda: (
            stack.scalar("SELECT send_attempts FROM dispatch_app_dispatchenvelope WHERE job_id = %s", [job_id]) == 1
        ),
        timeout=30,
        message="dispatcher A's claim",
    )
    claimed_at = time.monotonic()
    lease_end = stack.scalar("SELECT available_at FROM dispatch_app_dispatchenvelope WHERE job_id = %s", [job_id])

    successor = stack.dispatcher(
        "--lease", str(LEASE), "--poll-interval", "0.2", name="dispatcher-successor", **timeouts
    )
    stack.wait_all("running", 1, timeout=30)
    running_after = time.monotonic() - claimed_at
    # The worker's start in PostgreSQL (made while Redis runs the take) can commit before its start in Redis: the take
    # writes the RQ start only when the job's timeout is the one it assumed (rqworker.starts._record_start), else the
    # worker writes it when the job runs. The hash says "started" a moment later; that is what the late send must
    # leave alone.
    wait_until(lambda: redis.hget(rq_key, "status") == b"started", timeout=10, message="the job started in RQ")
    started = redis.hgetall(rq_key)
    assert started[b"status"] == b"started", started

    # A's send goes through now, long after its lease ran out, while the job runs.
    release.touch()
    released_after = time.monotonic() - claimed_at
    wait_until(lambda: "re-claimed by another dispatcher" in held.output(), timeout=30, message="A's late mark")
    assert stack.count_jobs("running") == 1, "the job must still be running when A's late send lands"
    assert redis.hgetall(rq_key) == started, "the late send rewrote the running job's RQ hash"
    assert redis.llen("rq:queue:delivery") == 0, "the late send queued the job a second time"

    stack.wait_all("succeeded", 1, timeout=60)
    assert held.stop() == 0, held.output()
    assert successor.stop() == 0, successor.output()
    worker.stop()

    envelope = stack.sql(
        "SELECT status, send_attempts, dispatched_at >= %s FROM dispatch_app_dispatchenvelope WHERE job_id = %s",
        [lease_end, job_id],
    )
    assert envelope == [("dispatched", 2, True)], "claimed twice, marked once, by the successor after the lease"
    assert stack.scalar("SELECT count(*) FROM dispatch_app_jobevent WHERE kind = 'duplicate_delivery'") == 0
    report = invariants.check_stack(stack, expected_jobs=1)
    assert report.executions == 1
    record_figures(
        "33_send_outlives_lease",
        **report.figures(),
        lease_seconds=LEASE,
        send_held_seconds=round(released_after, 1),
        running_after_claim_seconds=round(running_after, 1),
        rq_hash_untouched=True,
        queued_twice=0,
    )
