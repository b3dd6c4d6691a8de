"""Scenario 48: a writer that sends its own envelopes (SUBMIT_SENDS) is killed (-9) after its commit, before its send.

Its job is committed with the envelope leased to its writer: nothing announced it and nothing sent it. The
dispatcher leaves it alone while ``SUBMIT_SEND_GRACE`` lasts, then claims and sends it: the job runs once, late by
the grace and at most a fallback tick. The writers that live send their own: an envelope no claim took
(``send_attempts`` 0) was marked dispatched by its job's start.
"""

import time

import pytest

from dispatch_app.store.writer_lease import WRITER_TOKEN
from tests.acceptance.faults import invariants
from tests.acceptance.faults.infra import Submitter, record_figures

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(120)]

JOBS = 20
GRACE = 2.0
WRITER = {"DISPATCH_SUBMIT_SENDS": "true"}


def test_a_writer_killed_after_its_commit_loses_nothing_and_the_rest_send_their_own(shared_stack):
    stack = shared_stack
    worker = stack.worker("delivery")
    dispatcher = stack.dispatcher(DISPATCH_SUBMIT_SEND_GRACE=str(GRACE))
    # The worker is up before any writer sends: a job still in RQ after the grace would be claimed too.
    stack.submit(1, prefix="s48-warm")
    stack.wait_all("succeeded", 1, timeout=60)

    doomed = Submitter(stack.env(PRODUCTFLOW_FAILPOINTS="kill_before_writer_send", **WRITER), stack.tmp)
    with pytest.raises(RuntimeError, match="submitter died"):
        doomed.call(count=1, domain="delivery", prefix="s48-killed", group=1)
    doomed.close()
    killed_at = time.monotonic()
    ((orphan, token, status),) = stack.sql(
        "SELECT e.job_id, e.lease_token, e.status FROM dispatch_app_dispatchenvelope e "
        "JOIN dispatch_app_job j ON j.id = e.job_id WHERE j.payload->>'asset' = 's48-killed-0'"
    )
    assert (token, status) == (WRITER_TOKEN, "pending"), "committed, leased to its writer, not sent"

    live = Submitter(stack.env(**WRITER), stack.tmp)
    try:
        ids = live.call(count=JOBS, domain="delivery", prefix="s48", group=1)["ids"]
    finally:
        live.close()
    stack.wait_all("succeeded", JOBS + 2, timeout=60)
    orphan_ran_after = time.monotonic() - killed_at
    assert dispatcher.stop() == 0, dispatcher.output()
    assert worker.stop() in (0, 1)

    rows = {
        job_id: (sends, dispatched_at, started_at, created_at)
        for job_id, sends, dispatched_at, started_at, created_at in stack.sql(
            "SELECT e.job_id, e.send_attempts, e.dispatched_at, j.started_at, e.created_at "
            "FROM dispatch_app_dispatchenvelope e JOIN dispatch_app_job j ON j.id = e.job_id "
            "WHERE e.status = 'dispatched'"
        )
    }
    sends, dispatched_at, _, created_at = rows[orphan]
    assert sends == 1, "the dispatcher claimed the orphan once"
    assert (dispatched_at - created_at).total_seconds() >= GRACE, "and not before its writer's grace was over"
    by_writer = [job_id for job_id in ids if rows[job_id][0] == 0]
    assert by_writer, "the live writer sent its own: no claim took them"
    assert all(rows[j][1] == rows[j][2] for j in by_writer), "each marked dispatched by its job's start"
    report = invariants.check_stack(stack, expected_jobs=JOBS + 2)
    record_figures(
        "48_writer_killed_before_its_send",
        **report.figures(),
        grace_seconds=GRACE,
        orphan_ran_after_kill_seconds=round(orphan_ran_after, 1),
        sent_by_their_writer=len(by_writer),
    )
