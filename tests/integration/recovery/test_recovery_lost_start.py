"""A start lost between Redis and the worker: RQ says "started on a live worker", PostgreSQL never saw the start.

The take script applied the job's start in Redis but its reply never reached the worker (a dropped connection):
the worker lives on and never runs the job. Recovery tells that apart from a start about to commit by the
worker's own clock (its last heartbeat against the RQ start, both written by it), and re-dispatches it.
Real PostgreSQL, real Redis, a real PipelineWorker's take.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from rq import Queue
from rq.job import Job as RQJob
from rq.serializers import JSONSerializer
from rq.utils import utcformat

from dispatch_app import submit
from dispatch_app.models import Job, JobEvent
from dispatch_app.recovery.round import Round
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.rq.worker import PipelineWorker
from dispatch_app.rq.worker.fetch import Fetcher
from tests.factories import PAYLOADS
from tests.integration import provider_kit
from tests.integration.recovery_helpers import age_jobs, dispatch_now, policy, run_workers, statuses

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def provider(tmp_path):
    yield from provider_kit.installed(tmp_path)


def lose_the_start(redis_conn, rq_id: str) -> tuple[PipelineWorker, RQJob]:
    """An idle worker catches the job and its take writes the start; the reply is 'lost': nothing runs it."""
    queue = Queue("delivery", connection=redis_conn, serializer=JSONSerializer)
    worker = PipelineWorker([queue], connection=redis_conn, name="lost-reply")
    worker.register_birth()
    worker._fetcher = Fetcher(
        worker.connection, worker._ordered_queues, worker.job_class, worker.serializer, worker.name
    )
    # As after a first job of this queue: the worker knows its timeout, so the take writes the start.
    worker._timeouts["delivery"] = RQJob.fetch(rq_id, connection=redis_conn, serializer=JSONSerializer).timeout
    popped = worker._fetcher.wait(1)
    assert popped is not None
    [taken] = worker._fetcher.take(1, popped=popped, start=worker._record_start(popped))
    assert taken.execution is not None  # started in Redis
    return worker, RQJob.fetch(taken.job.id, connection=redis_conn, serializer=JSONSerializer)


def heartbeat_at(worker, redis_conn, when) -> None:
    """What the worker's heartbeat thread writes, on the worker's clock."""
    redis_conn.hset(worker.key, "last_heartbeat", utcformat(when))


def test_a_start_lost_on_a_live_worker_is_redispatched_once_the_worker_has_lived_past_the_threshold(
    redis_conn, provider
):
    job = submit("delivery", PAYLOADS["delivery"])
    dispatch_now()
    worker, rq_job = lose_the_start(redis_conn, rq_job_id(job.pk, 1))
    assert rq_job.get_status() == "started" and rq_job.worker_name == "lost-reply"
    age_jobs([job.pk], 600)  # queued in PostgreSQL for 10 minutes: a candidate
    delivery = policy("delivery", QUEUED_STALE_SECONDS=60)

    # 30 s of the worker's life after the RQ start: a start about to commit looks the same. Left alone.
    heartbeat_at(worker, redis_conn, rq_job.started_at + timedelta(seconds=30))
    result = Round(delivery, redis=redis_conn, provider=provider).run_once()
    assert (result.left_alone, result.redispatched) == (1, 0)
    assert statuses([job]) == {job.pk: ("queued", 1)}

    # 120 s: the worker would have committed the start long ago. Lost: the next attempt.
    age_jobs([job.pk], 600)
    heartbeat_at(worker, redis_conn, rq_job.started_at + timedelta(seconds=120))
    result = Round(delivery, redis=redis_conn, provider=provider).run_once()
    assert result.redispatched == 1
    assert statuses([job]) == {job.pk: ("submitted", 2)}
    event = JobEvent.objects.filter(job=job, kind="recovery_redispatch").get()
    assert "started on live worker lost-reply 120s before that worker's last heartbeat" in event.reason
    # What recovery saw is kept with the event, for the job's timeline.
    assert event.data["evidence"]["started_for"] == pytest.approx(120.0)
    assert event.data["evidence"]["worker_name"] == "lost-reply" and event.data["next_attempt"] == 2

    dispatch_now()
    run_workers(redis_conn)
    assert statuses([job]) == {job.pk: ("succeeded", 2)}
    assert Job.objects.get(pk=job.pk).attempt == 2
    worker.register_death()


def test_a_job_popped_by_a_worker_that_never_took_it_is_redispatched_and_a_listed_one_left_alone(redis_conn, provider):
    popped_job = submit("delivery", PAYLOADS["delivery"])
    dispatch_now()
    # A worker on two queues pops with BLPOP (the id is then only in its memory) and dies before its take.
    queues = [Queue(name, connection=redis_conn, serializer=JSONSerializer) for name in ("delivery", "workflow")]
    fetcher = Fetcher(redis_conn, queues, RQJob, JSONSerializer, "died-after-pop")
    popped = fetcher.wait(1)
    assert popped is not None and popped[1] == rq_job_id(popped_job.pk, 1)
    waiting_job = submit("delivery", PAYLOADS["delivery"])
    dispatch_now()  # in its queue: waiting for a worker
    age_jobs([popped_job.pk, waiting_job.pk], 600)

    result = Round(policy("delivery", QUEUED_STALE_SECONDS=60), redis=redis_conn, provider=provider).run_once()

    assert (result.redispatched, result.left_alone) == (1, 1)
    assert statuses([popped_job, waiting_job]) == {popped_job.pk: ("submitted", 2), waiting_job.pk: ("queued", 1)}
    event = JobEvent.objects.filter(job=popped_job, kind="recovery_redispatch").get()
    assert "queued but in neither its queue nor a worker's hands" in event.reason
    assert event.data["evidence"] == {"rq_status": "queued", "rq_listed": False}
    left = JobEvent.objects.filter(job=waiting_job, kind="recovery_leave_alone").get()
    assert "waiting for a worker" in left.reason

    dispatch_now()
    run_workers(redis_conn)
    assert statuses([popped_job, waiting_job]) == {popped_job.pk: ("succeeded", 2), waiting_job.pk: ("succeeded", 1)}
