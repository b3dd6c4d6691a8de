"""Scenario 22: recovery asks a slow vendor while the worker finishes the job (issue 11 item 3).

An image_series job is inside its vendor call on a live worker; its RQ job
hash is gone from Redis, so recovery (``recover --once``, stale threshold 0,
trust bound 0: it would call the job ``outcome_unknown``) takes it for
interrupted and asks the vendor about the call in doubt. That status call
takes 10 s. While recovery waits on it, the vendor answers the worker and the
worker saves the outcome: the save does not wait for recovery (recovery holds
no row lock across network calls), the job ends ``succeeded``, and recovery,
whose compare-and-set sees the job moved, stands down without touching it.
"""

import json
import time

import pytest

from tests.acceptance.faults import invariants
from tests.acceptance.faults.gated_vendor import RQWORKER_ARGS
from tests.acceptance.faults.infra import record_figures
from tests.helpers import PYTHON, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(120)]

STATUS_SECONDS = 10
RECOVERY = {"image_series": {"RUNNING_STALE_SECONDS": 0, "VENDOR_EVIDENCE_TRUST_SECONDS": 0}}


def test_a_worker_finishes_while_recovery_waits_on_a_slow_vendor(private_redis_stack, private_redis):
    stack = private_redis_stack
    gates = stack.tmp / "gates"
    gates.mkdir()
    dispatcher = stack.dispatcher("--poll-interval", "0.2")
    worker = stack.spawn(
        "gated-worker",
        [PYTHON, "-m", "tests.acceptance.faults.gated_vendor", "plain_rqworker", "image_series", *RQWORKER_ARGS],
        PF_GATE_DIR=gates,
        PF_GATE_VENDOR=1,
    )
    (job_id,) = stack.submit(1, domain="image_series", prefix="s22")
    wait_until(lambda: (gates / "vendor-entered").exists(), timeout=30, message="the worker inside its vendor call")
    assert stack.scalar("SELECT status FROM dispatch_app_vendorcall WHERE job_id = %s", [job_id]) == "pending"
    assert (
        private_redis.client().delete(f"rq:job:{stack.rq_job_id(job_id, 1)}") == 1
    )  # recovery now takes the worker for gone

    recovery = stack.spawn(
        "recover-slow-vendor",
        [PYTHON, "-m", "tests.acceptance.faults.gated_vendor", "recover", "--once", "--json"],
        PF_GATE_DIR=gates,
        PF_GATE_STATUS=STATUS_SECONDS,
        DISPATCH_RECOVERY=json.dumps(RECOVERY),
    )
    wait_until(lambda: (gates / "status-entered").exists(), timeout=30, message="recovery inside the status call")
    entered_status = time.monotonic()

    (gates / "vendor-release").write_text("")  # the vendor answers the worker
    stack.wait_all("succeeded", 1, timeout=STATUS_SECONDS)
    succeeded_after = time.monotonic() - entered_status
    assert recovery.alive(), "recovery left its status call before the worker finished: the scenario proves nothing"
    # Database clock: from the vendor call's settlement to the job's finish, with recovery mid-call throughout.
    finish_gap = stack.scalar(
        "SELECT EXTRACT(EPOCH FROM j.finished_at - v.finished_at)::float8 FROM dispatch_app_job j "
        "JOIN dispatch_app_vendorcall v ON v.job_id = j.id WHERE j.id = %s",
        [job_id],
    )

    (gates / "status-release").write_text("")
    assert recovery.wait(timeout=60) == 0, recovery.output()
    summary = json.loads(recovery.output().strip().splitlines()[-1])
    (row,) = [r for r in summary["domains"] if r["domain"] == "image_series"]
    (candidate,) = row["candidates"]
    assert (candidate["job_id"], candidate["outcome"]) == (job_id, "moved"), candidate
    assert "would have been: outcome_unknown" in candidate["reason"], candidate
    assert (row["unknown"], row["redispatched"], row["skipped"]) == (0, 0, 1), row

    assert dispatcher.stop() == 0, dispatcher.output()
    worker.stop()
    events = dict(stack.sql("SELECT kind, count(*) FROM dispatch_app_jobevent WHERE job_id = %s GROUP BY 1", [job_id]))
    assert not any(kind.startswith("recovery_") for kind in events), events
    report = invariants.check_stack(stack, expected_jobs=1)
    record_figures(
        "22_slow_vendor_status",
        **report.figures(),
        vendor_status_call_seconds=STATUS_SECONDS,
        job_succeeded_after_recovery_entered_status_call_seconds=round(succeeded_after, 2),
        finish_after_vendor_answer_seconds_db_clock=round(finish_gap, 3),
        recovery_outcome=candidate["outcome"],
        recovery_reason=candidate["reason"],
    )
