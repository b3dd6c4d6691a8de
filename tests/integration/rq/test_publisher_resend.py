"""A re-send of an existing RQ job id is a no-op in Redis: a running job's hash is untouched, nothing queued twice.

Each job is created by RQ's create-if-absent script inside the chunk's one
pipeline, so a first send and a re-send cost the same single round trip and no
existence probe.
"""

import pytest
from rq.job import Job as RQJob

from dispatch_app import submit_many
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.models import DispatchEnvelope
from dispatch_app.rq.publish import Publisher, rq_job_id
from dispatch_app.store import claim
from tests.factories import PAYLOADS
from tests.integration.loop_kit import loop_settings
from tests.private_servers import PrivateRedis, make_base_dir, remove_tree

pytestmark = pytest.mark.django_db


def _expire_leases() -> None:
    """What the clock would do in LEASE_SECONDS: the claims run out."""
    DispatchEnvelope.objects.update(available_at="2000-01-01T00:00:00Z")


def test_a_resend_leaves_a_running_jobs_hash_alone_and_queues_nothing_twice(redis_conn):
    publisher = Publisher(loop_settings(), connection=redis_conn)
    jobs = submit_many([("delivery", PAYLOADS["delivery"])] * 3)
    first = claim.claim_batch(10, 30)
    assert (publisher.send(first.envelopes).sent, redis_conn.llen("rq:queue:delivery")) == (3, 3)

    # A worker takes the first job and runs it: its id leaves the queue, its hash says "started".
    running = RQJob.key_for(rq_job_id(jobs[0].pk, 1))
    redis_conn.lrem("rq:queue:delivery", 0, rq_job_id(jobs[0].pk, 1))
    redis_conn.hset(running, mapping={"status": "started", "worker_name": "w1", "started_at": "2026-01-01T00:00:00Z"})
    before = redis_conn.hgetall(running)

    # The lease ran out mid-send: a successor claims the same envelopes and sends them again.
    _expire_leases()
    second = claim.claim_batch(10, 30)
    assert not any(e.first_send for e in second.envelopes)
    result = publisher.send(second.envelopes)

    assert (result.sent, result.duplicates, result.failed) == (0, 3, [])
    assert redis_conn.hgetall(running) == before, "the running job's hash was rewritten"
    assert redis_conn.llen("rq:queue:delivery") == 2, "a job was queued a second time"


def test_a_send_after_redis_lost_its_scripts_still_goes_through(django_db_setup):
    base = make_base_dir("pf-pub-")
    server = PrivateRedis(base)
    server.start()
    try:
        client = server.client()
        publisher = Publisher(loop_settings(), connection=client)
        submit_many([("delivery", PAYLOADS["delivery"])] * 2)
        batch = claim.claim_batch(10, 30)
        client.script_flush()  # as after a restart: no script cached
        assert publisher.send(batch.envelopes[:1]).sent == 1
        client.script_flush()
        assert publisher.send(batch.envelopes[1:]).sent == 1
        assert client.llen("rq:queue:delivery") == 2
    finally:
        server.stop()
        remove_tree(base)


def test_an_error_of_one_queue_counts_against_its_envelopes_only(redis_conn):
    """A WRONGTYPE on one queue's key is that envelope's own error: counted; the rest of the chunk is sent."""
    conf = loop_settings(BATCH_SIZE=10, SEND_CHUNK_SIZE=10)
    redis_conn.set("rq:queue:workflow", "not a list")
    submit_many([("delivery", PAYLOADS["delivery"]), ("workflow", PAYLOADS["workflow"])] * 2)
    loop = DispatchLoop(conf, publisher=Publisher(conf, redis_conn))
    try:
        result = loop.run_once()
    finally:
        loop.close()

    assert (result.dispatched, result.failed, result.dead, result.outage) == (2, 2, 0, "")
    assert loop.breaker.state == "closed"
    failed = DispatchEnvelope.objects.filter(domain="workflow")
    assert {(e.status, e.send_attempts) for e in failed} == {("pending", 1)}
    assert all("WRONGTYPE" in e.last_error for e in failed)
    assert DispatchEnvelope.objects.filter(domain="delivery", status="dispatched").count() == 2
    # Nothing of a failed job was written: its re-send is not taken for a sent job.
    assert {redis_conn.hget(key, "origin") for key in redis_conn.keys("rq:job:pf-*")} == {b"delivery"}
