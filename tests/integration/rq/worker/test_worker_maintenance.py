"""RQ's maintenance inside a PipelineWorker reads Redis as input (rqworker.maintenance, rqworker.project_job).

Real Redis, a real PipelineWorker. A clean-clone CI run caught a worker ending at start-up: RQ's
cleanup of a queue's intermediate list read a forged hash (``timeout: never``) with RQ's plain
``Job`` and the AssertionError ended the process. The same cleanup, for an abandoned "started"
job, imports and calls its failure callback and posts its webhooks. Here: the unreadable hash is
dropped, the abandoned forgery is failed by RQ's own code without importing the canary or
calling the webhook's URL, and a step that raises is logged while the other steps and the worker
go on and the queue's maintenance lock is free for the next worker.
"""

from __future__ import annotations

import logging
import socket
import uuid

import pytest
from rq import Callback, Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.webhook import Webhook

from dispatch_app.rq import internals as rq_internals
from dispatch_app.rq.worker import PipelineWorker
from tests.canary import CANARY_ENV

QUEUE = "delivery"
CANARY = "tests.canary.touch"


@pytest.fixture
def canary(tmp_path, monkeypatch):
    path = tmp_path / "canary"
    monkeypatch.setenv(CANARY_ENV, str(path))
    return path


@pytest.fixture
def listener():
    """A port that records whether anything connected to it (a webhook's POST would)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def connected(sock: socket.socket) -> bool:
    try:
        sock.accept()[0].close()
    except BlockingIOError:
        return False
    return True


def plant_unreadable(conn, queue: Queue) -> str:
    """A hash RQ's restore raises on, named in the queue's intermediate list (as if a worker took it)."""
    rq_id = f"forged-{uuid.uuid4().hex}"
    conn.hset(rq_internals.job_key(rq_id), mapping={"data": b"\x80garbage", "timeout": b"never", "status": b"?"})
    conn.rpush(queue.intermediate_queue_key, rq_id)
    return rq_id


def plant_abandoned(conn, queue: Queue, port: int) -> str:
    """A readable "started" job with a failure callback and a webhook, its started-registry entry expired."""
    job = Job.create(
        CANARY,
        args=("abandoned",),
        connection=conn,
        serializer=JSONSerializer,
        on_failure=Callback(CANARY),
        webhooks=[Webhook(f"http://127.0.0.1:{port}/hook", job_status="failed", timeout=1)],
    )
    job.origin = queue.name
    job.set_status("started")
    job.save()
    conn.zadd(StartedJobRegistry(queue.name, connection=conn).key, {f"{job.id}:forged-execution": 1})
    return job.id


def test_maintenance_drops_an_unreadable_hash_and_fails_an_abandoned_forgery_without_running_it(
    redis_conn, canary, listener
):
    # A Queue object with RQ's plain Job class, as a caller may hand it in: maintenance must not use it to read.
    queue = Queue(QUEUE, connection=redis_conn, serializer=JSONSerializer)
    unreadable = plant_unreadable(redis_conn, queue)
    abandoned = plant_abandoned(redis_conn, queue, listener.getsockname()[1])
    worker = PipelineWorker([queue], connection=redis_conn, name="maintenance")

    worker.clean_registries()

    assert unreadable.encode() not in redis_conn.lrange(queue.intermediate_queue_key, 0, -1)
    assert abandoned in FailedJobRegistry(QUEUE, connection=redis_conn).get_job_ids()  # RQ's own handling ran
    assert not canary.exists(), canary.read_text()  # its failure callback was never imported or called
    assert not connected(listener)  # its webhook was never posted
    assert worker.last_cleaned_at is not None
    assert not redis_conn.exists(queue.registry_cleaning_key)


def test_a_taken_queue_object_keeps_its_class_and_the_worker_reads_hashes_as_project_jobs(redis_conn):
    queue = Queue(QUEUE, connection=redis_conn, serializer=JSONSerializer)
    worker = PipelineWorker([queue], connection=redis_conn, name="maintenance")
    unreadable = plant_unreadable(redis_conn, queue)

    assert queue.job_class is Job  # the caller's object is left as it was
    with pytest.raises(NoSuchJobError, match="job hash unreadable"):
        worker.job_class.fetch(unreadable, connection=redis_conn, serializer=JSONSerializer)


def test_a_maintenance_step_that_raises_is_logged_the_other_steps_run_and_the_worker_goes_on(
    redis_conn, monkeypatch, caplog
):
    import dispatch_app.rq.worker.maintenance as maintenance

    def broken(queue):
        raise RuntimeError("worker registry unreadable")

    monkeypatch.setattr(maintenance, "clean_worker_registry", broken)
    queue = Queue(QUEUE, connection=redis_conn, serializer=JSONSerializer)
    unreadable = plant_unreadable(redis_conn, queue)
    worker = PipelineWorker([queue], connection=redis_conn, name="maintenance")

    with caplog.at_level(logging.ERROR, logger="dispatch_app.rqworker"):
        assert worker.work(burst=True) is False  # burst: nothing to do, and it returned instead of raising

    failed = [r for r in caplog.records if getattr(r, "action", None) == "worker_maintenance_failed"]
    assert {r.domain for r in failed} == {q.name for q in worker.queues}  # one per queue (its lanes included)
    assert all("worker registry unreadable" in r.getMessage() for r in failed)
    # The step after the failed one ran: the intermediate list's unreadable hash is gone.
    assert unreadable.encode() not in redis_conn.lrange(queue.intermediate_queue_key, 0, -1)
    assert not redis_conn.exists(queue.registry_cleaning_key)  # the next worker may clean this queue
    assert worker.last_cleaned_at is not None and not worker.should_run_maintenance_tasks
