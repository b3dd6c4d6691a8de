"""A known vendor failure is retried through the outbox until the domain's attempts are used up."""

import pytest

from dispatch_app import submit
from dispatch_app.domains.providers import LocalProvider, set_provider
from dispatch_app.execution import execute
from dispatch_app.models import DispatchEnvelope, Job, JobEvent, JobStatus
from tests.factories import PAYLOADS

pytestmark = pytest.mark.django_db(transaction=True)  # the worker manages its own connection


@pytest.fixture
def failing_provider(tmp_path):
    set_provider(LocalProvider(root=tmp_path, latency_ms=0, failure_rate=1.0))
    yield
    set_provider(None)


def _start(job: Job) -> dict:
    job.refresh_from_db()
    return execute(job.domain, job.pk, job.attempt)


def test_a_failed_vendor_call_becomes_the_next_attempt_through_the_outbox(failing_provider, settings):
    settings.DISPATCH = {"SEND_BACKOFF_BASE": 0}
    job = submit("delivery", PAYLOADS["delivery"])

    assert _start(job) == {"retrying": True}

    job.refresh_from_db()
    assert (job.status, job.attempt) == (JobStatus.SUBMITTED, 2)
    envelope = DispatchEnvelope.objects.get(job=job, attempt=2)
    assert envelope.status == "pending"
    event = JobEvent.objects.get(job=job, kind="retry_after_failure")
    assert "simulated vendor failure" in event.reason


def test_the_last_attempt_fails_the_job(failing_provider, settings):
    settings.DISPATCH = {"SEND_BACKOFF_BASE": 0}
    job = submit("delivery", PAYLOADS["delivery"])  # delivery allows 5 attempts
    for _ in range(4):
        assert _start(job) == {"retrying": True}
    result = _start(job)

    job.refresh_from_db()
    assert "failed" in result
    assert (job.status, job.attempt) == (JobStatus.FAILED, 5)
    assert job.error.startswith("provider failed")
    assert DispatchEnvelope.objects.filter(job=job).count() == 5


def test_the_attempt_budget_follows_the_settings_override(failing_provider, settings):
    settings.DISPATCH = {"SEND_BACKOFF_BASE": 0, "RECOVERY": {"delivery": {"MAX_ATTEMPTS": 1}}}
    job = submit("delivery", PAYLOADS["delivery"])

    assert "failed" in _start(job)

    job.refresh_from_db()
    assert (job.status, job.attempt) == (JobStatus.FAILED, 1)
    assert not DispatchEnvelope.objects.filter(job=job, attempt=2).exists()
