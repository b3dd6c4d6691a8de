"""An idle worker starts the job in PostgreSQL while Redis hands it the job (worker.start_protocol).

Real PostgreSQL, real Redis, a real PipelineWorker driven one step at a time: its blocking wait catches a
job the dispatcher sent, the take's script call goes out, the start compare-and-set runs, then the take's
reply is read. The job runs once, on that start; and when the take does not hand the worker the job after
all, the start is withdrawn and the job is ``queued`` again as if the worker had never seen it. Recovery
tells a running job whose RQ job never started (the worker died in between) from an interrupted run.
"""

from __future__ import annotations

import logging

import pytest
import redis
from rq import Queue
from rq.job import Job as RQJob
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from dispatch_app import submit
from dispatch_app.execution import start_protocol as prestart
from dispatch_app.models import Job, JobAttempt, JobEvent
from dispatch_app.recovery.round import Round
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.rq.worker import PipelineWorker
from dispatch_app.rq.worker.fetch import Fetcher, PendingTake
from tests.factories import PAYLOADS
from tests.integration import provider_kit
from tests.integration.recovery_helpers import age_jobs, dispatch_now, policy, start_like_a_worker, statuses

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def provider(tmp_path):
    yield from provider_kit.installed(tmp_path)


@pytest.fixture
def idle_worker(redis_conn, monkeypatch):
    """A worker whose first look finds its queue empty, so it waits and its wait catches the job."""
    queue = Queue("delivery", connection=redis_conn, serializer=JSONSerializer)
    worker = PipelineWorker([queue], connection=redis_conn, name="prestart")
    worker.register_birth()
    worker._fetcher = Fetcher(
        worker.connection, worker._ordered_queues, worker.job_class, worker.serializer, "prestart"
    )
    monkeypatch.setattr(worker._fetcher, "take", lambda limit, **_: [])
    yield worker
    worker.register_death()


def row(job) -> tuple:
    job = Job.objects.get(pk=job.pk)
    return job.status, job.attempt, job.started_at is not None


def history(job) -> tuple:
    attempt = JobAttempt.objects.get(job_id=job.pk, attempt=1)
    return attempt.started_at is not None, attempt.worker


def test_the_start_is_made_while_the_take_is_in_flight_and_the_job_runs_on_it(idle_worker, provider, monkeypatch):
    job = submit("delivery", PAYLOADS["delivery"])
    dispatch_now()
    steps = []
    begin, result = prestart.begin, PendingTake.result
    monkeypatch.setattr(prestart, "begin", lambda *a: steps.append("start in PostgreSQL") or begin(*a))
    monkeypatch.setattr(PendingTake, "result", lambda self: steps.append("take's reply read") or result(self))

    taken = idle_worker._next(1, False)

    assert taken.job.id == rq_job_id(job.pk, 1)
    assert steps == ["start in PostgreSQL", "take's reply read"]
    assert row(job) == ("running", 1, True)
    assert history(job) == (True, "prestart")
    idle_worker._run(taken)
    # execute took the start made for it: a second compare-and-set would have found the job running.
    assert row(job) == ("succeeded", 1, True)
    assert not JobEvent.objects.filter(job=job, kind="duplicate_delivery").exists()
    assert provider.deliveries == 1


def test_a_job_whose_hash_is_gone_at_the_take_has_its_start_withdrawn(idle_worker, redis_conn, monkeypatch, caplog):
    job = submit("delivery", PAYLOADS["delivery"])
    dispatch_now()
    wait = idle_worker._fetcher.wait

    def caught_then_deleted(timeout):
        popped = wait(timeout)
        redis_conn.delete(f"rq:job:{popped[1]}")  # deleted (or expired) between the wait and the take
        return popped

    monkeypatch.setattr(idle_worker._fetcher, "wait", caught_then_deleted)
    with caplog.at_level(logging.WARNING, logger="dispatch_app.rqworker"):
        assert idle_worker._next(1, False) is None

    assert row(job) == ("queued", 1, False)
    assert history(job) == (False, "")
    event = JobEvent.objects.get(job=job, kind="start_withdrawn")
    assert "hash was gone from Redis" in event.reason and event.attempt == 1
    [record] = [r for r in caplog.records if getattr(r, "action", "") == "worker_start_withdrawn"]
    assert record.domain == "delivery"


def test_a_job_that_cannot_be_deserialised_has_its_start_withdrawn(idle_worker, redis_conn):
    job = submit("delivery", PAYLOADS["delivery"])
    # Not the dispatcher's JSON: pickled under the dispatcher's id for this attempt.
    Queue("delivery", connection=redis_conn).enqueue(
        "dispatch_app.run.delivery", job.pk, 1, job_id=rq_job_id(job.pk, 1)
    )

    taken = idle_worker._next(1, False)
    assert row(job) == ("running", 1, True)
    idle_worker._run(taken)

    # Back where it was: the dispatcher never sent it, so it is `submitted`, with no dispatch time (issue 56).
    assert row(job) == ("submitted", 1, False)
    assert Job.objects.get(pk=job.pk).dispatched_at is None
    assert "could not be deserialised" in JobEvent.objects.get(job=job, kind="start_withdrawn").reason
    assert FailedJobRegistry("delivery", connection=redis_conn).get_job_ids() == [rq_job_id(job.pk, 1)]


def test_a_take_whose_reply_is_lost_and_whose_job_went_back_has_its_start_withdrawn(
    idle_worker, redis_conn, provider, monkeypatch
):
    job = submit("delivery", PAYLOADS["delivery"])
    dispatch_now()

    def never_ran(args):
        def receive():
            raise redis.ConnectionError("Connection closed by server.")

        return receive

    monkeypatch.setattr(idle_worker._fetcher, "_send", never_ran)
    with pytest.raises(redis.ConnectionError):
        idle_worker._next(1, False)
    assert row(job) == ("running", 1, True)
    monkeypatch.undo()
    idle_worker._redis_down(redis.ConnectionError("Connection closed by server."))

    assert row(job) == ("queued", 1, False)
    assert "went back to its queue" in JobEvent.objects.get(job=job, kind="start_withdrawn").reason
    # Back at the head of its queue, it runs on the next take, started afresh.
    idle_worker._fetcher = Fetcher(redis_conn, idle_worker._ordered_queues, idle_worker.job_class, JSONSerializer, "x")
    [taken] = idle_worker._fetcher.take(1)
    idle_worker._run(taken)
    assert row(job) == ("succeeded", 1, True) and provider.deliveries == 1


def test_recovery_redispatches_a_running_job_whose_rq_job_no_worker_ever_started(redis_conn, provider):
    """The worker died between its start in PostgreSQL and its take: nothing ran, whatever the domain."""
    never = submit("agent", PAYLOADS["agent"])
    ran = submit("agent", PAYLOADS["agent"])
    dispatch_now()
    for job in (never, ran):
        start_like_a_worker(job)
    # ``ran`` did start on a worker that then died: RQ's maintenance failed it and someone requeued it.
    rq_ran = RQJob.fetch(rq_job_id(ran.pk, 1), connection=redis_conn, serializer=JSONSerializer)
    rq_ran.worker_name = "died-mid-job"
    rq_ran.save()
    age_jobs([never.pk, ran.pk], 7200)

    agent = policy("agent", RUNNING_STALE_SECONDS=3600)
    Round(agent, redis=redis_conn, provider=provider).run_once()

    assert statuses([never])[never.pk] == ("submitted", 2)
    event = JobEvent.objects.get(job=never, kind="recovery_redispatch")
    assert "no worker ever started it" in event.reason
    assert event.data["evidence"]["rq_never_started"] is True
    # A worker's name on the RQ job: it may have run. Not this rule's to decide.
    assert not JobEvent.objects.filter(job=ran, reason__contains="no worker ever started it").exists()


def test_a_start_ahead_of_the_take_that_fails_leaves_the_start_to_the_job(idle_worker, provider, monkeypatch, caplog):
    from django.db import OperationalError

    import dispatch_app.store.api as store

    job = submit("delivery", PAYLOADS["delivery"])
    dispatch_now()

    def down(*_):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(store, "start", down)  # the start, as the worker calls it: through the store's door
    with caplog.at_level(logging.WARNING, logger="dispatch_app.rqworker"):
        taken = idle_worker._next(1, False)
    assert taken.job.id == rq_job_id(job.pk, 1)  # the take's reply was still read
    assert row(job) == ("queued", 1, False)
    assert [r.action for r in caplog.records if getattr(r, "action", "")] == ["worker_prestart_failed"]
    monkeypatch.undo()

    idle_worker._run(taken)  # execute makes the start itself
    assert row(job) == ("succeeded", 1, True) and provider.deliveries == 1


def test_a_take_that_cannot_be_sent_makes_no_start(idle_worker, monkeypatch):
    job = submit("delivery", PAYLOADS["delivery"])
    dispatch_now()

    def refused(args):
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(idle_worker._fetcher, "_send", refused)
    with pytest.raises(redis.ConnectionError):
        idle_worker._next(1, False)
    assert row(job) == ("queued", 1, False)  # Redis is down: nothing started in PostgreSQL either
    assert idle_worker._held is None and idle_worker._in_doubt is not None


def test_an_id_pushed_with_no_hash_behind_it_leaves_the_job_as_it_was(idle_worker, redis_conn, provider):
    job = submit("delivery", PAYLOADS["delivery"])  # due, its envelope pending: the start's gate lets it start
    redis_conn.rpush("rq:queue:delivery", rq_job_id(job.pk, 1))  # anyone can push an id

    assert idle_worker._next(1, False) is None  # the start made ahead of the take, then the take found no hash

    assert row(job) == ("submitted", 1, False)
    assert Job.objects.get(pk=job.pk).dispatched_at is None  # no dispatch that never happened
    assert history(job) == (False, "")
    dispatch_now()  # the dispatcher sends it as any other, the same attempt: recovery has nothing to spend
    assert row(job) == ("queued", 1, False)
    idle_worker._run(idle_worker._next(1, False))
    assert row(job) == ("succeeded", 1, True) and provider.deliveries == 1
