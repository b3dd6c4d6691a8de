"""Scenario 2: the dispatcher is killed (-9) after the enqueue, before the mark.

The failpoint ``kill_after_send`` (PRODUCTFLOW_FAILPOINTS) kills the process
between the Redis pipeline and the database mark. The envelopes stay pending
under a lease; after it runs out a second dispatcher claims them again:

- while the RQ job hash still exists, the send is a recognised duplicate (no
  second enqueue, nothing reaches a worker twice);
- where the hash is gone (its result TTL expired), the job is enqueued again and
  the worker's start compare-and-set refuses it (a ``duplicate_delivery`` event).

Either way the work runs once per job.
"""

import signal
import time

import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures
from tests.acceptance.faults.redis_timeouts import short_redis_timeouts
from tests.helpers import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(120)]

JOBS = 40
LEASE = 2.0


def test_redelivery_after_kill_is_a_recognised_duplicate(shared_stack, redis_conn):
    stack = shared_stack
    worker = stack.worker("delivery")
    ids = stack.submit(JOBS, prefix="s2")

    # A lease this short needs Redis timeouts to match: rundispatcher refuses a lease shorter than a send.
    timeouts = short_redis_timeouts(stack.redis_url, 0.5)
    doomed = stack.dispatcher(
        "--lease", str(LEASE), "--batch-size", "100", PRODUCTFLOW_FAILPOINTS="kill_after_send", **timeouts
    )
    assert doomed.wait(timeout=30) == -signal.SIGKILL, doomed.output()
    killed_at = time.monotonic()

    # Sent but never marked: every envelope still pending under the dead process's lease.
    leased = stack.scalar(
        "SELECT count(*) FROM dispatch_app_dispatchenvelope "
        "WHERE status = 'pending' AND lease_token IS NOT NULL AND send_attempts = 1"
    )
    assert leased == JOBS
    lease_end = stack.scalar("SELECT min(available_at) FROM dispatch_app_dispatchenvelope")
    # The worker got them anyway (RQ hands a job over before the mark could commit).
    stack.wait_all("succeeded", JOBS, timeout=60)

    # Half the RQ job hashes expire (as after result_ttl): those get re-enqueued and must be refused.
    expired = ids[: JOBS // 2]
    assert redis_conn.delete(*[f"rq:job:{stack.rq_job_id(job_id, 1)}" for job_id in expired]) == len(expired)

    successor = stack.dispatcher("--lease", str(LEASE), "--batch-size", "100", **timeouts)
    stack.wait_all("dispatched", JOBS, timeout=30, what="envelopes")
    redelivered_after = time.monotonic() - killed_at
    wait_until(
        lambda: (
            stack.scalar("SELECT count(*) FROM dispatch_app_jobevent WHERE kind = 'duplicate_delivery'") >= len(expired)
        ),
        timeout=30,
        message="the worker to refuse the re-enqueued attempts",
    )
    assert successor.stop() == 0, successor.output()
    assert worker.stop() in (0, 1)

    claims = dict(stack.sql("SELECT send_attempts, count(*) FROM dispatch_app_dispatchenvelope GROUP BY 1"))
    assert claims == {2: JOBS}, f"every envelope claimed twice (killed, then after the lease): {claims}"
    refused = sorted(
        r[0] for r in stack.sql("SELECT job_id FROM dispatch_app_jobevent WHERE kind = 'duplicate_delivery'")
    )
    assert refused == sorted(expired), "only the re-enqueued attempts reach the worker a second time"
    # The lease decided when they came back: no envelope was re-claimed before it ran out (database clock).
    first_redispatch = stack.scalar("SELECT min(dispatched_at) FROM dispatch_app_dispatchenvelope")
    assert first_redispatch >= lease_end, (first_redispatch, lease_end)
    report = invariants.check_stack(stack, expected_jobs=JOBS)
    record_figures(
        "02_kill_between_enqueue_and_mark",
        **report.figures(),
        lease_seconds=LEASE,
        redelivered_after_kill_seconds=round(redelivered_after, 1),
        duplicates_refused_by_publisher=JOBS - len(expired),
        duplicates_refused_by_worker=len(refused),
    )
