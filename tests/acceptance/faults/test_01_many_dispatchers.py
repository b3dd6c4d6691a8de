"""Scenario 1: three dispatcher processes share one outbox; 5,000 jobs.

Each job's work runs exactly once, and each envelope is claimed (sent) exactly
once: no lease expires here, so SKIP LOCKED alone must keep the three apart.
"""

import time

import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import record_figures

pytestmark = [pytest.mark.acceptance, pytest.mark.slow, pytest.mark.timeout(240)]

JOBS = 5000


def test_three_dispatchers_execute_every_job_exactly_once(shared_stack):
    stack = shared_stack
    dispatchers = [stack.dispatcher("--batch-size", "100", "--lease", "60", name=f"dispatcher-{i}") for i in range(3)]
    workers = [stack.worker("delivery", name=f"worker-{i}") for i in range(2)]

    started = time.monotonic()
    ids = stack.submit(JOBS, prefix="s1")
    assert len(ids) == JOBS
    dispatch_seconds = stack.wait_all("dispatched", JOBS, timeout=120, what="envelopes")
    stack.wait_all("succeeded", JOBS, timeout=150)
    total_seconds = time.monotonic() - started

    for proc in dispatchers + workers:
        assert proc.alive(), f"{proc.name} died:\n{proc.output()[-3000:]}"
        assert proc.stop() == 0 or proc in workers, f"{proc.name} did not exit cleanly:\n{proc.output()[-3000:]}"

    # Each envelope claimed once (send_attempts counts claims) and sent once.
    claims = dict(stack.sql("SELECT send_attempts, count(*) FROM dispatch_app_dispatchenvelope GROUP BY send_attempts"))
    assert claims == {1: JOBS}, f"claims per envelope: {claims}"
    report = invariants.check_stack(stack, expected_jobs=JOBS)
    record_figures(
        "01_many_dispatchers",
        dispatchers=3,
        workers=2,
        **report.figures(),
        envelopes_claimed_more_than_once=JOBS - claims.get(1, 0),
        all_dispatched_seconds=round(dispatch_seconds, 1),
        all_succeeded_seconds=round(total_seconds, 1),
    )
