"""One deployment per Redis database, and what its dispatcher did not write changes no job (issue 56.4).

Real PostgreSQL and Redis. The deployment's namespace is in every RQ id (``dispatch_app.rq.ids``) and its
dispatcher signs the hashes it writes: a hash planted ahead of a job is replaced by the job's first send (logged,
counted, on the timeline) instead of passing for a sent job; an id pushed with no hash, or a hash the dispatcher did
not write, leaves the job as it was; jobs sent under the ids of the release before namespaces still run; and a
second deployment is refused on a Redis database where another one is live (``dispatch_app.rq.deployment``).
"""

from __future__ import annotations

import logging

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from rq import Queue
from rq.job import Job as RQJob
from rq.serializers import JSONSerializer

import dispatch_app.rq.deployment as deployment
from dispatch_app import submit
from dispatch_app.config.settings import dispatch_settings
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.models import Job, JobEvent
from dispatch_app.rq.ids import SIGNATURE_FIELD, legacy_rq_job_id, parse, rq_job_id, signature
from dispatch_app.rq.worker import PipelineWorker, admission
from tests.factories import PAYLOADS
from tests.integration import provider_kit

pytestmark = pytest.mark.django_db(transaction=True)
ENTRY = "dispatch_app.run.delivery"


@pytest.fixture
def provider(tmp_path):
    yield from provider_kit.installed(tmp_path)


@pytest.fixture(autouse=True)
def unregistered():
    """What a test registers as this process's deployment is not refreshed by later tests' heartbeats."""
    yield
    deployment._registered.__init__()


def run_worker(redis_conn, *queues: str) -> None:
    rq_queues = [Queue(q, connection=redis_conn, serializer=JSONSerializer) for q in queues or ("delivery",)]
    PipelineWorker(rq_queues, connection=redis_conn, name="namespace").work(burst=True)


def drain() -> object:
    loop = DispatchLoop(dispatch_settings())
    try:
        return loop.run_once()
    finally:
        loop.close()


def row(job) -> tuple:
    job = Job.objects.get(pk=job.pk)
    return job.status, job.attempt, job.dispatched_at is not None, job.started_at is not None


def test_the_namespace_comes_from_the_database_unless_set():
    me = deployment.identity()
    assert len(me.namespace) == 8 and int(me.namespace, 16) >= 0
    assert deployment.identity() is me  # read once per process and database
    job_id = rq_job_id(7, 2)
    assert job_id == f"pf-{me.namespace}-7-2" and parse(job_id) == (me.namespace, 7, 2)
    assert parse(legacy_rq_job_id(7, 2)) == (None, 7, 2) and parse("pf-x-y-1") is None
    with override_settings(PRODUCTFLOW_NAMESPACE="prod_eu"):
        assert deployment.namespace() == "prod_eu" and rq_job_id(7, 2) == "pf-prod_eu-7-2"
    with override_settings(PRODUCTFLOW_NAMESPACE="prod-eu"):  # a dash would make ids ambiguous
        with pytest.raises(ImproperlyConfigured, match="PRODUCTFLOW_NAMESPACE='prod-eu' is not a namespace"):
            deployment.namespace()
    assert deployment.namespace() == me.namespace


def test_a_hash_planted_ahead_is_replaced_by_the_first_send_and_the_job_runs(redis_conn, provider, caplog):
    job = submit("delivery", PAYLOADS["delivery"])
    rq_id = rq_job_id(job.pk, 1)
    # What RQ writes for the dispatcher's own call, under the id the job will have: all but the signature.
    planted = Queue("delivery", connection=redis_conn, serializer=JSONSerializer).create_job(
        ENTRY, args=[job.pk, 1], job_id=rq_id
    )
    planted.save()
    assert redis_conn.llen("rq:queue:delivery") == 0  # planted, not pushed: a send that trusted it pushed nothing

    with caplog.at_level(logging.WARNING, logger="dispatch_app.dispatch"):
        result = drain()

    assert (result.sends, result.duplicates, result.foreign) == (1, 0, 1)
    assert redis_conn.lrange("rq:queue:delivery", 0, -1) == [rq_id.encode()]
    assert redis_conn.hget(RQJob.key_for(rq_id), SIGNATURE_FIELD).decode() == signature(rq_id, ENTRY, "delivery")
    event = JobEvent.objects.get(job=job, kind="foreign_hash_replaced")
    assert event.attempt == 1 and "not written by this deployment's dispatcher" in event.reason
    [record] = [r for r in caplog.records if getattr(r, "action", "") == "foreign_hash_replaced"]
    assert rq_id in record.getMessage() and record.domain == "delivery"
    run_worker(redis_conn)
    assert row(job) == ("succeeded", 1, True, True) and provider.deliveries == 1


def test_a_second_send_of_the_dispatchers_own_hash_is_still_a_no_op(redis_conn):
    job = submit("delivery", PAYLOADS["delivery"])
    assert drain().foreign == 0
    from dispatch_app.rq.publish import Publisher
    from dispatch_app.store.claim import Claimed

    again = Publisher(dispatch_settings()).send([Claimed(0, job.pk, 1, "delivery", "delivery", 1, False)])
    assert (again.sent, again.duplicates, again.foreign) == (0, 1, [])
    assert redis_conn.llen("rq:queue:delivery") == 1


def test_an_id_pushed_with_no_hash_leaves_the_job_as_it_was(redis_conn, provider):
    job = submit("delivery", PAYLOADS["delivery"])  # due, its envelope pending: the start's gate would pass it
    redis_conn.rpush("rq:queue:delivery", rq_job_id(job.pk, 1))
    run_worker(redis_conn)
    assert row(job) == ("submitted", 1, False, False)
    drain()
    run_worker(redis_conn)
    assert row(job) == ("succeeded", 1, True, True)  # the same attempt: recovery had nothing to spend on it


def test_a_hash_the_dispatcher_did_not_write_is_refused_unrun(redis_conn, provider):
    job = submit("delivery", PAYLOADS["delivery"])
    Queue("delivery", connection=redis_conn, serializer=JSONSerializer).enqueue(
        ENTRY, job.pk, 1, job_id=rq_job_id(job.pk, 1)
    )
    run_worker(redis_conn)
    assert row(job) == ("submitted", 1, False, False) and provider.deliveries == 0
    assert admission.totals(redis_conn)["kinds"] == {admission.UNSIGNED: 1}


def test_a_job_sent_before_namespaces_still_runs_and_not_once_the_upgrade_is_over(redis_conn, provider):
    job = submit("delivery", PAYLOADS["delivery"])
    drain()
    redis_conn.flushdb()  # what the release before this one had sent instead: its id, no signature
    q = Queue("delivery", connection=redis_conn, serializer=JSONSerializer)
    q.enqueue(ENTRY, job.pk, 1, job_id=legacy_rq_job_id(job.pk, 1))
    run_worker(redis_conn)
    assert row(job) == ("succeeded", 1, True, True)

    later = submit("delivery", PAYLOADS["delivery"])
    drain()
    redis_conn.flushdb()
    q.enqueue(ENTRY, later.pk, 1, job_id=legacy_rq_job_id(later.pk, 1))
    with override_settings(PRODUCTFLOW_LEGACY_RQ_IDS=False):
        run_worker(redis_conn)
    assert row(later)[0] == "queued" and admission.totals(redis_conn)["kinds"] == {admission.BAD_ID: 1}


def test_another_deployments_job_is_refused_naming_it(redis_conn, provider, caplog):
    job = submit("delivery", PAYLOADS["delivery"])
    theirs = rq_job_id(job.pk, 1, ns="staging")
    forged = Queue("delivery", connection=redis_conn, serializer=JSONSerializer).enqueue(
        ENTRY, job.pk, 1, job_id=theirs
    )
    redis_conn.hset(forged.key, SIGNATURE_FIELD, signature(theirs, ENTRY, "delivery"))  # signed by "them"
    admission._told.clear()
    with caplog.at_level(logging.ERROR, logger="dispatch_app.rqworker"):
        run_worker(redis_conn)
    assert row(job) == ("submitted", 1, False, False)
    assert any("another deployment's (namespace 'staging'" in r.getMessage() for r in caplog.records)


ME = deployment.Identity("aaaa1111", "database 'prod' on db1:5432")
OTHER = deployment.Identity("bbbb2222", "database 'staging' on db2:5432")


def test_a_second_live_deployment_is_refused_naming_both(redis_conn):
    assert deployment.claim(redis_conn, ME) == []
    with pytest.raises(deployment.SharedRedis) as refused:
        deployment.refuse_if_shared({"redis://r/1": redis_conn}, OTHER)
    message = str(refused.value)
    assert "aaaa1111 (database 'prod' on db1:5432" in message and "This deployment is bbbb2222" in message
    assert redis_conn.hkeys(deployment.REGISTRY) == [b"aaaa1111"]  # the refused one did not register
    assert deployment.claim(redis_conn, ME) == []  # the first one restarting is itself, not another


def test_a_deployment_gone_quiet_no_longer_blocks_and_junk_never_fails_the_check(redis_conn):
    seconds = redis_conn.time()[0]
    redis_conn.hset(deployment.REGISTRY, "old1", f"{seconds - deployment.LIVE_SECONDS - 5} gone a while")
    redis_conn.hset(deployment.REGISTRY, "junk", "not a time")
    assert deployment.refuse_if_shared({"r": redis_conn}, ME) == []
    assert set(redis_conn.hkeys(deployment.REGISTRY)) == {b"old1", b"aaaa1111"}  # junk dropped, quiet kept
    redis_conn.delete(deployment.REGISTRY)
    redis_conn.set(deployment.REGISTRY, "a string where a hash belongs")
    assert deployment.refuse_if_shared({"r": redis_conn}, OTHER) == []
    assert redis_conn.hkeys(deployment.REGISTRY) == [b"bbbb2222"]


def test_a_live_process_refreshes_its_entry_and_says_when_another_appears(redis_conn, caplog):
    deployment.refuse_if_shared({"r": redis_conn}, ME)
    redis_conn.hset(deployment.REGISTRY, "aaaa1111", "1 stale")
    deployment.keep_alive(clock=lambda: 10**9)
    assert int(redis_conn.hget(deployment.REGISTRY, "aaaa1111").split()[0]) >= redis_conn.time()[0] - 5
    redis_conn.hset(deployment.REGISTRY, "bbbb2222", f"{redis_conn.time()[0]} database 'staging'")
    with caplog.at_level(logging.ERROR, logger="dispatch_app.rq.deployment"):
        deployment.keep_alive(clock=lambda: 2 * 10**9)
    [record] = [r for r in caplog.records if getattr(r, "action", "") == "deployment_shares_redis"]
    assert "bbbb2222 (database 'staging'" in record.getMessage()


def test_refresh_never_raises_on_an_unreachable_server(caplog):
    gone = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    with caplog.at_level(logging.WARNING, logger="dispatch_app.rq.deployment"):
        deployment.refresh(gone, ME, "redis://127.0.0.1:1")
    assert any(getattr(r, "action", "") == "deployment_refresh_failed" for r in caplog.records)
    assert deployment.refuse_if_shared({"gone": gone}, ME) == ["gone"]


def test_rqs_set_of_queue_names_holding_junk_fails_no_send(redis_conn, caplog):
    job = submit("delivery", PAYLOADS["delivery"])
    redis_conn.set("rq:queues", "anyone may write this")
    with caplog.at_level(logging.WARNING, logger="dispatch_app.dispatch"):
        result = drain()
    assert (result.sends, result.failed) == (1, 0)
    assert redis_conn.lrange("rq:queue:delivery", 0, -1) == [rq_job_id(job.pk, 1).encode()]
    assert any(getattr(r, "action", "") == "queue_set_unwritable" for r in caplog.records)
