"""The start is the last gate (transitions.START_SQL): a job named correctly in Redis still starts only
if PostgreSQL says the dispatcher sent it (or may be sending it), it is due, its domain not paused, and
the entry point that runs it is its domain's.

Real PostgreSQL and Redis, a real PipelineWorker: each forged job passes admission (the dispatcher's
function, call, id, queue and signature: the worst case, a signature copied or a key leaked) and is stopped by
the start, with a JobEvent saying why.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from rq import Queue
from rq.serializers import JSONSerializer

from dispatch_app import submit
from dispatch_app.models import DispatchEnvelope, DomainPause, Job, JobEvent
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.rq.worker import PipelineWorker
from dispatch_app.store import transitions
from dispatch_app.store.claim import claim_batch
from tests.factories import PAYLOADS
from tests.helpers import sign_rq_job
from tests.integration import provider_kit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def provider(tmp_path):
    yield from provider_kit.installed(tmp_path)


def forge_and_run(redis_conn, queue: str, entry: str, job: Job) -> None:
    forged = Queue(queue, connection=redis_conn, serializer=JSONSerializer).enqueue(
        entry, job.pk, job.attempt, job_id=rq_job_id(job.pk, job.attempt)
    )
    sign_rq_job(redis_conn, forged)  # admission passed, as by a copied signature: the start is what stops it
    PipelineWorker([Queue(queue, connection=redis_conn, serializer=JSONSerializer)], connection=redis_conn).work(
        burst=True
    )


def refusal(job: Job) -> str:
    return JobEvent.objects.get(job=job, kind="start_refused").reason


def test_a_job_scheduled_for_later_does_not_start_early(redis_conn, provider):
    job = submit("delivery", PAYLOADS["delivery"], available_at=timedelta(hours=1))
    forge_and_run(redis_conn, "delivery", "dispatch_app.run.delivery", job)
    assert Job.objects.get(pk=job.pk).status == "submitted"
    assert refusal(job).startswith("not due")
    assert provider.deliveries == 0


def test_a_job_of_a_paused_domain_does_not_start(redis_conn, provider):
    job = submit("delivery", PAYLOADS["delivery"])
    DomainPause.objects.create(domain="delivery", reason="maintenance")
    forge_and_run(redis_conn, "delivery", "dispatch_app.run.delivery", job)
    assert Job.objects.get(pk=job.pk).status == "submitted"
    assert refusal(job) == "domain 'delivery' is paused"


def test_a_job_does_not_start_through_another_domains_entry_point(redis_conn, provider):
    job = submit("image_series", PAYLOADS["image_series"])
    forge_and_run(redis_conn, "delivery", "dispatch_app.run.delivery", job)
    assert Job.objects.get(pk=job.pk).status == "submitted"
    assert "not 'delivery': wrong entry point" in refusal(job)


def test_a_job_whose_envelope_is_dead_does_not_start(redis_conn, provider):
    job = submit("delivery", PAYLOADS["delivery"])
    DispatchEnvelope.objects.filter(job=job).update(status="dead")
    forge_and_run(redis_conn, "delivery", "dispatch_app.run.delivery", job)
    assert Job.objects.get(pk=job.pk).status == "submitted"
    assert "envelope is dead" in refusal(job)


def start(job: Job, domains=("delivery",)):
    with connection.cursor() as cursor:
        return transitions.start(cursor, "w", job.pk, job.attempt, list(domains))


@pytest.mark.parametrize(
    "envelope, starts",
    [
        ({}, True),  # pending and due: sent ahead of its claim (a NOTIFY named it)
        ({"status": "dispatched"}, True),
        ({"lease_token": "6f1c1d52-4a7e-4c4e-9e0e-000000000001", "available_at_hours": 1}, True),  # leased
        ({"send_attempts": 1, "available_at_hours": 1}, True),  # a send backed off: it may have reached RQ
        ({"available_at_hours": 1}, False),  # never claimed, scheduled for later
        ({"status": "dead"}, False),
    ],
)
def test_which_envelopes_let_their_attempt_start(envelope, starts):
    from django.db.models.functions import Now

    job = submit("delivery", PAYLOADS["delivery"])
    hours = envelope.pop("available_at_hours", None)
    if hours is not None:
        envelope["available_at"] = Now() + timedelta(hours=hours)
    DispatchEnvelope.objects.filter(job=job).update(**envelope)
    assert (start(job) is not None) is starts


def test_a_claimed_envelope_lets_its_attempt_start_before_the_mark():
    job = submit("delivery", PAYLOADS["delivery"])
    assert [e.job_id for e in claim_batch(10, 60).envelopes] == [job.pk]
    assert start(job)[3] == "delivery"


def test_an_attempt_with_no_envelope_does_not_start():
    job = submit("delivery", PAYLOADS["delivery"])
    DispatchEnvelope.objects.filter(job=job).delete()
    assert start(job) is None
    with connection.cursor() as cursor:
        assert transitions.start_refusal(cursor, job.pk, 1, ["delivery"])[0] == transitions.REFUSED
