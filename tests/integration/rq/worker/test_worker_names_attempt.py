"""The attempt history names the RQ worker that ran the attempt (set in the start statement, no extra round trip)."""

import pytest

from dispatch_app import submit
from dispatch_app.models import JobAttempt, JobStatus
from dispatch_app.rq.publish import Publisher
from dispatch_app.rq.worker.launch import build_worker
from dispatch_app.store import claim
from tests.factories import PAYLOADS
from tests.integration.loop_kit import loop_settings

pytestmark = pytest.mark.django_db(transaction=True)  # the worker runs in autocommit, as in a worker process


def test_a_job_run_by_the_project_worker_records_that_workers_name(redis_conn):
    job = submit("delivery", PAYLOADS["delivery"])
    assert Publisher(loop_settings(), connection=redis_conn).send(claim.claim_batch(10, 30).envelopes).sent == 1

    worker = build_worker(["delivery"], connection=redis_conn, name="attempt-history-test-worker")
    worker.work(burst=True)

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    attempt = JobAttempt.objects.get(job=job, attempt=1)
    assert (attempt.worker, attempt.outcome) == ("attempt-history-test-worker", "succeeded")


def test_a_direct_call_outside_a_worker_leaves_the_worker_blank():
    from dispatch_app.execution import execute

    job = submit("delivery", PAYLOADS["delivery"])
    assert execute("delivery", job.pk, 1) == {"succeeded": True}
    assert JobAttempt.objects.get(job=job, attempt=1).worker == ""
