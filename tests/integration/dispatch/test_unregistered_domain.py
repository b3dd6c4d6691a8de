"""An envelope whose domain is no longer registered is dead-lettered with its reason; its batch goes on."""

import pytest
from rq import Queue
from rq.serializers import JSONSerializer

from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.models import DispatchEnvelope, EnvelopeStatus, Job, JobEvent, JobStatus
from dispatch_app.rq.publish import Publisher
from tests.factories import EnvelopeFactory, JobFactory
from tests.integration.loop_kit import loop_settings

pytestmark = pytest.mark.django_db


def test_an_envelope_of_a_retired_domain_is_dead_and_the_rest_of_the_batch_is_dispatched(redis_conn):
    before = EnvelopeFactory.create_batch(2)
    retired = EnvelopeFactory(job=JobFactory(domain="retired", payload={"anything": 1}))
    after = EnvelopeFactory.create_batch(2)
    conf = loop_settings(BATCH_SIZE=10)
    loop = DispatchLoop(conf, publisher=Publisher(conf, redis_conn))
    try:
        result = loop.run_once()
        # Dead stays dead: the next scan finds nothing to do.
        assert loop.run_once().claimed == 0
    finally:
        loop.close()

    assert (result.claimed, result.dispatched, result.dead, result.failed) == (5, 4, 1, 0)
    dead = DispatchEnvelope.objects.get(pk=retired.pk)
    assert dead.status == EnvelopeStatus.DEAD
    assert dead.last_error == "domain 'retired' is not registered"
    assert dead.lease_token is None
    job = Job.objects.get(pk=retired.job_id)
    assert job.status == JobStatus.FAILED
    assert "domain 'retired' is not registered" in job.error
    assert job.finished_at is not None
    event = JobEvent.objects.get(job=job)
    assert (event.kind, event.reason) == ("envelope_dead", "domain 'retired' is not registered")

    others = [e.pk for e in before + after]
    assert set(DispatchEnvelope.objects.filter(pk__in=others).values_list("status", flat=True)) == {"dispatched"}
    assert Queue("delivery", connection=redis_conn, serializer=JSONSerializer).count == 4
