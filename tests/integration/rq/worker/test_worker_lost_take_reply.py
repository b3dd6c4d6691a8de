"""A take whose reply is lost (the connection drops after Redis ran the script): the worker settles it.

Real Redis and a real PipelineWorker. The take script runs (or not) and the client then sees a
ConnectionError; once Redis answers, ``_redis_down`` settles the popped job: its start was written, so the
worker runs it; or it never got it, so it goes back to the head of its queue. Nothing is left "started" on a
live worker that will never run it, and nothing is left "queued" in no list.
"""

from __future__ import annotations

import pytest
import redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from dispatch_app import submit
from dispatch_app.models import Job as JobModel
from dispatch_app.rq.ids import rq_job_id
from dispatch_app.rq.worker import PipelineWorker
from dispatch_app.rq.worker.fetch import Fetcher
from tests.factories import PAYLOADS
from tests.helpers import sign_rq_job
from tests.integration import provider_kit


@pytest.fixture
def provider(tmp_path):
    yield from provider_kit.installed(tmp_path)


def make_worker(redis_conn, names=("delivery",)):
    queues = [Queue(n, connection=redis_conn, serializer=JSONSerializer, default_timeout=600) for n in names]
    worker = PipelineWorker(queues, connection=redis_conn, name="lost-take")
    worker.register_birth()
    worker._fetcher = Fetcher(
        worker.connection, worker._ordered_queues, worker.job_class, worker.serializer, worker.name
    )
    return worker, queues


def lose_the_reply(worker, monkeypatch, *, runs: bool) -> None:
    """The take of a popped job: its script runs in Redis (``runs``) or not; either way the connection drops."""
    fetcher = worker._fetcher
    send = fetcher._send

    def dropped(args):
        if runs:
            send(args)()  # sent and its reply read here, so the script has run before the drop

        def receive():
            raise redis.ConnectionError("Connection closed by server.")

        return receive

    # The popped job's take (send_take) goes through _send; a take without one (before the wait) does not.
    monkeypatch.setattr(fetcher, "_send", dropped)


def arrive_during_the_wait(worker, monkeypatch, queue, job_id, func="builtins.len", args=("abc",), **options) -> None:
    wait = worker._fetcher.wait

    def wait_and_arrive(timeout):
        arrived = queue.enqueue(func, *args, job_id=job_id, **options)
        sign_rq_job(queue.connection, arrived)  # as the dispatcher writes it (the worker runs nothing else)
        return wait(timeout)

    monkeypatch.setattr(worker._fetcher, "wait", wait_and_arrive)


@pytest.mark.django_db(transaction=True)
def test_a_start_written_before_the_reply_was_lost_is_run_by_the_worker(redis_conn, monkeypatch, provider):
    # The project's own job (the worker runs nothing else: rqworker.admission).
    submitted = submit("delivery", PAYLOADS["delivery"])
    rq_id = rq_job_id(submitted.pk, 1)
    worker, [queue] = make_worker(redis_conn)
    worker._timeouts["delivery"] = 600  # the take writes the start
    arrive_during_the_wait(
        worker, monkeypatch, queue, rq_id, "dispatch_app.run.delivery", (submitted.pk, 1), job_timeout=600
    )
    lose_the_reply(worker, monkeypatch, runs=True)

    with pytest.raises(redis.ConnectionError):
        worker._next(1, False)
    assert Job.fetch(rq_id, connection=redis_conn, serializer=JSONSerializer).get_status() == "started"
    monkeypatch.undo()
    worker._redis_down(redis.ConnectionError("Connection closed by server."))

    [(taken, _)] = worker._buffer
    assert taken.job.id == rq_id and taken.execution is not None
    assert redis_conn.exists(taken.execution.key)
    assert worker._next(1, False) is taken  # next in line: run, with the execution its take wrote
    worker._run(taken)
    worker._flush_pending()
    assert JobModel.objects.get(pk=submitted.pk).status == "succeeded"
    job = Job.fetch(rq_id, connection=redis_conn, serializer=JSONSerializer)
    assert job.get_status() == JobStatus.FINISHED
    assert StartedJobRegistry("delivery", connection=redis_conn).get_job_ids() == []
    assert redis_conn.keys("rq:execution:*") == []


@pytest.mark.parametrize(
    ("queues", "runs", "options"),
    [
        (("delivery",), True, {"job_timeout": 30}),  # taken without the start (another timeout): intermediate list
        (("delivery",), False, {}),  # the script never ran: the BLMOVE left it in the intermediate list
        (("delivery", "workflow"), False, {}),  # BLPOP: the id was only in the worker's memory
        (("delivery", "workflow"), True, {"job_timeout": 30}),
    ],
    ids=["taken-not-started", "blmove-only", "blpop-only", "blpop-taken-not-started"],
)
def test_a_job_the_worker_never_got_goes_back_to_the_head_of_its_queue(redis_conn, monkeypatch, queues, runs, options):
    worker, qs = make_worker(redis_conn, queues)
    queue = qs[0]
    worker._timeouts["delivery"] = 600
    queue.enqueue("builtins.len", "abc", job_id="behind")
    redis_conn.delete(queue.key)  # only the caught job in the list at the wait
    arrive_during_the_wait(worker, monkeypatch, queue, "lost-taken", **options)
    lose_the_reply(worker, monkeypatch, runs=runs)

    with pytest.raises(redis.ConnectionError):
        worker._next(1, False)
    redis_conn.rpush(queue.key, "behind")
    monkeypatch.undo()
    worker._redis_down(redis.ConnectionError("Connection closed by server."))

    assert worker._buffer == []
    assert redis_conn.lrange(queue.key, 0, -1) == [b"lost-taken", b"behind"]
    assert redis_conn.lrange(queue.intermediate_queue_key, 0, -1) == []
    job = Job.fetch("lost-taken", connection=redis_conn, serializer=JSONSerializer)
    assert job.get_status() == JobStatus.QUEUED
    assert StartedJobRegistry("delivery", connection=redis_conn).get_job_ids() == []
