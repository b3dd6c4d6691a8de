"""A second delivery of the same attempt does nothing; the worker may start before the dispatcher's mark."""

import threading

import pytest
from django.db import connection

from dispatch_app import submit
from dispatch_app.execution import execute
from dispatch_app.models import DispatchEnvelope, EnvelopeStatus, Job, JobEvent, JobStatus
from dispatch_app.store.claim import claim_batch, mark_dispatched
from tests.factories import PAYLOADS
from tests.integration import provider_kit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def provider(tmp_path):
    yield from provider_kit.installed(tmp_path)


def test_a_duplicate_delivery_runs_the_work_once(provider):
    job = submit("delivery", PAYLOADS["delivery"])
    assert execute("delivery", job.pk, 1) == {"succeeded": True}
    finished = Job.objects.get(pk=job.pk)
    assert execute("delivery", job.pk, 1) == {"duplicate": True}
    assert provider.deliveries == 1
    again = Job.objects.get(pk=job.pk)
    assert again.status == JobStatus.SUCCEEDED
    assert (again.started_at, again.finished_at) == (finished.started_at, finished.finished_at)
    assert again.result == {"delivered": "asset-1", "target": PAYLOADS["delivery"]["target"]}
    assert list(JobEvent.objects.filter(job=job).values_list("kind", "attempt")) == [("duplicate_delivery", 1)]


def test_two_simultaneous_deliveries_of_one_attempt_run_the_work_once(provider):
    job = submit("delivery", PAYLOADS["delivery"])
    barrier = threading.Barrier(2)
    results, errors = [], []

    def deliver():
        try:
            barrier.wait(10)
            results.append(execute("delivery", job.pk, 1))
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    assert sorted(results, key=str) == sorted([{"succeeded": True}, {"duplicate": True}], key=str)
    assert provider.deliveries == 1


def test_a_delivery_of_a_superseded_attempt_does_nothing(provider):
    job = submit("delivery", PAYLOADS["delivery"])
    Job.objects.filter(pk=job.pk).update(attempt=2)
    assert execute("delivery", job.pk, 1) == {"duplicate": True}
    assert provider.deliveries == 0
    assert Job.objects.get(pk=job.pk).status == JobStatus.SUBMITTED


def test_the_worker_may_start_before_the_mark_and_the_mark_never_moves_the_job_back(provider):
    job = submit("delivery", PAYLOADS["delivery"])
    claim = claim_batch(10, 30)
    # RQ handed the job to a worker before the dispatcher's mark committed.
    assert execute("delivery", job.pk, 1) == {"succeeded": True}
    done = Job.objects.get(pk=job.pk)
    assert mark_dispatched([e.envelope_id for e in claim.envelopes], claim.token) == 1
    after = Job.objects.get(pk=job.pk)
    assert after.status == JobStatus.SUCCEEDED
    assert after.dispatched_at == done.dispatched_at is not None
    # One timeline: a job is never started before it was dispatched.
    assert after.submitted_at <= after.dispatched_at <= after.started_at <= after.finished_at
    assert DispatchEnvelope.objects.get(job=job).status == EnvelopeStatus.DISPATCHED
    assert provider.deliveries == 1
