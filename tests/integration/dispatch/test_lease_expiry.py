"""A dispatcher that dies after claiming (and even after sending) loses nothing and duplicates nothing.

Its envelopes come back when the lease runs out; the successor's send finds the RQ job
already there (one job in Redis), and a real RQ worker runs the work once even when
RQ delivers the job twice.
"""

import pytest
from django.db import connection
from rq import Queue, SimpleWorker
from rq.job import Job as RQJob
from rq.job import JobStatus as RQStatus
from rq.serializers import JSONSerializer

from dispatch_app import submit
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.models import DispatchEnvelope, EnvelopeStatus, Job, JobEvent, JobStatus
from dispatch_app.rq.publish import Publisher, rq_job_id
from dispatch_app.store.claim import ENVELOPE, claim_batch, mark_dispatched
from tests.factories import PAYLOADS
from tests.helpers import wait_until
from tests.integration import provider_kit
from tests.integration.loop_kit import loop_settings

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def provider(tmp_path):
    yield from provider_kit.installed(tmp_path)


def expire_leases() -> None:
    """The lease's end, reached without waiting: what the clock would do in LEASE_SECONDS."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {ENVELOPE} SET available_at = clock_timestamp() - interval '1 second' "
            "WHERE status = 'pending' AND lease_token IS NOT NULL"
        )


def run_worker(redis_conn, queue: Queue) -> None:
    SimpleWorker([queue], connection=redis_conn, serializer=JSONSerializer).work(burst=True)


def test_a_real_lease_runs_out_by_itself():
    submit("delivery", PAYLOADS["delivery"])
    first = claim_batch(10, lease_seconds=0.5)
    assert len(first.envelopes) == 1 and first.envelopes[0].first_send
    assert claim_batch(10, 30).envelopes == []  # leased
    # Cross-transaction effect of the database clock: a bounded poll.
    again = wait_until(lambda: claim_batch(10, 30).envelopes, timeout=10, message="the lease to run out")
    assert [e.envelope_id for e in again] == [first.envelopes[0].envelope_id]
    assert again[0].send_attempts == 2 and not again[0].first_send


def test_dead_dispatcher_after_send_then_successor_then_double_delivery_runs_once(redis_conn, provider):
    conf = loop_settings(BATCH_SIZE=10)
    job = submit("delivery", PAYLOADS["delivery"])

    # The first dispatcher claims and sends, then dies before its mark.
    dead = claim_batch(10, 30)
    sent = Publisher(conf, redis_conn).send(dead.envelopes)
    assert (sent.sent, sent.duplicates) == (1, 0)
    assert claim_batch(10, 30).envelopes == []  # its lease still holds the envelope

    expire_leases()
    loop = DispatchLoop(conf, publisher=Publisher(conf, redis_conn))
    try:
        result = loop.run_once()
    finally:
        loop.close()
    assert (result.claimed, result.dispatched, result.duplicates) == (1, 1, 1)
    # The dead dispatcher's late mark cannot overwrite its successor's.
    assert mark_dispatched([dead.envelopes[0].envelope_id], dead.token) == 0

    queue = Queue("delivery", connection=redis_conn, serializer=JSONSerializer)
    assert queue.job_ids == [rq_job_id(job.pk, 1)]
    envelope = DispatchEnvelope.objects.get(job=job)
    assert (envelope.status, envelope.send_attempts) == (EnvelopeStatus.DISPATCHED, 2)

    run_worker(redis_conn, queue)
    rq_job = RQJob.fetch(rq_job_id(job.pk, 1), connection=redis_conn, serializer=JSONSerializer)
    assert rq_job.get_status() == RQStatus.FINISHED
    assert rq_job.return_value() == {"succeeded": True}
    finished = Job.objects.get(pk=job.pk)
    assert finished.status == JobStatus.SUCCEEDED

    # RQ delivers the same job again (a requeue, a second producer): the work does not run again.
    queue.push_job_id(rq_job.id)
    run_worker(redis_conn, queue)
    assert rq_job.get_status(refresh=True) == RQStatus.FINISHED
    assert rq_job.return_value(refresh=True) == {"duplicate": True}
    assert provider.deliveries == 1
    assert Job.objects.get(pk=job.pk).finished_at == finished.finished_at
    assert JobEvent.objects.filter(job=job, kind="duplicate_delivery").count() == 1
    assert queue.count == 0
