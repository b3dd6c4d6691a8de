"""An idle PipelineWorker's take also writes the start of the job its blocking wait caught (fetch.Start).

Real Redis. The Redis state after that one call must be what the two-step path (take, then ``_write_start``)
leaves, key for key; a job whose hash is not what the recorded writes assumed (another timeout, a repeating
job, a hash gone) is taken without them, and nothing of them is left behind.
"""

from __future__ import annotations

import re

import pytest
from rq import Queue, Repeat
from rq.exceptions import DeserializationError
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.worker import WorkerStatus

from dispatch_app.rq.worker import PipelineWorker
from dispatch_app.rq.worker.fetch import Fetcher

QUEUE = "delivery"


@pytest.fixture
def worker(redis_conn):
    queue = Queue(QUEUE, connection=redis_conn, serializer=JSONSerializer, default_timeout=600)
    w = PipelineWorker([queue], connection=redis_conn, name="take-start")
    w.register_birth()
    w._fetcher = Fetcher(w.connection, w._ordered_queues, w.job_class, w.serializer, w.name)
    return w


def enqueue(worker, job_id: str, **kwargs) -> Job:
    queue = worker._ordered_queues[0]
    return queue.enqueue("dispatch_app.run.delivery", 1, 1, job_id=job_id, **kwargs)


def catch(worker):
    """What the blocking wait hands the take: (queue index, job id, needs moving)."""
    popped = worker._fetcher.wait(1)
    assert popped is not None
    return popped


def shape(redis_conn, job_id: str) -> dict:
    """Every key this job's start touched, with the job and execution ids made generic: type, TTL set, fields."""

    def generic(text: bytes | str) -> str:
        text = text.decode() if isinstance(text, bytes) else text
        return re.sub(r"[0-9a-f]{32}", "<execution>", text.replace(job_id, "<job>"))

    out = {}
    for raw in redis_conn.keys("*"):
        key = raw.decode()
        if key.startswith("rq:worker") and not key.startswith("rq:worker_executions"):
            continue  # the worker's own hash: its state is compared on its own
        kind = redis_conn.type(raw).decode()
        if kind == "hash":
            content = sorted(f.decode() for f in redis_conn.hkeys(raw))
        elif kind == "zset":
            content = sorted(generic(m) for m in redis_conn.zrange(raw, 0, -1))
        elif kind == "set":
            content = sorted(generic(m) for m in redis_conn.smembers(raw))
        elif kind == "list":
            content = [m.decode().replace(job_id, "<job>") for m in redis_conn.lrange(raw, 0, -1)]
        else:
            content = None
        out[generic(key)] = (kind, redis_conn.ttl(raw) > 0, content)
    return out


def test_the_take_starts_the_caught_job_as_the_two_step_start_does(worker, redis_conn):
    enqueue(worker, "two-step")
    popped = catch(worker)
    [taken] = worker._fetcher.take(1, popped=popped)
    assert taken.execution is None
    worker._write_start(taken.job, taken.queue)
    two_step = shape(redis_conn, "two-step")
    worker.set_state(WorkerStatus.IDLE)
    redis_conn.delete(*[k for k in redis_conn.keys("*") if not k.decode().startswith("rq:worker")])

    enqueue(worker, "one-call")
    popped = catch(worker)
    start = worker._record_start(popped)
    [taken] = worker._fetcher.take(1, popped=popped, start=start)

    assert taken.execution is not None and taken.execution.job_id == "one-call"
    assert shape(redis_conn, "one-call") == two_step
    job = Job.fetch("one-call", connection=redis_conn, serializer=JSONSerializer)
    assert job.get_status() == JobStatus.STARTED and job.worker_name == "take-start"
    assert (taken.job.worker_name, taken.job.get_status(refresh=False)) == ("take-start", JobStatus.STARTED)
    registry = StartedJobRegistry(QUEUE, connection=redis_conn)
    assert registry.get_job_ids() == ["one-call"]
    assert redis_conn.hget(worker.key, "state").decode() == WorkerStatus.BUSY


@pytest.mark.parametrize(
    ("why", "options"),
    [("another timeout", lambda: {"job_timeout": 30}), ("a repeating job", lambda: {"repeat": Repeat(times=2)})],
)
def test_a_job_unlike_the_recorded_start_is_taken_without_it(worker, redis_conn, why, options):
    enqueue(worker, "unlike", **options())
    worker.set_state(WorkerStatus.IDLE)
    popped = catch(worker)
    start = worker._record_start(popped)
    [taken] = worker._fetcher.take(1, popped=popped, start=start)

    assert taken.execution is None, why
    assert Job.fetch("unlike", connection=redis_conn, serializer=JSONSerializer).get_status() == JobStatus.QUEUED
    assert StartedJobRegistry(QUEUE, connection=redis_conn).get_job_ids() == []
    assert redis_conn.keys("rq:execution*") == []
    assert redis_conn.hget(worker.key, "state").decode() == WorkerStatus.IDLE
    assert redis_conn.lrange(taken.queue.intermediate_queue_key, 0, -1) == [b"unlike"]


def test_the_worker_learns_a_queues_timeout_and_starts_its_next_job_in_the_take(worker, redis_conn):
    enqueue(worker, "slow-1", job_timeout=30)
    enqueue(worker, "slow-2", job_timeout=30)
    [first] = worker._fetcher.take(1, popped=catch(worker), start=worker._record_start((0, "slow-1", False)))
    assert first.execution is None
    worker._timeouts[QUEUE] = first.job.timeout  # what _run records for the job it runs
    popped = catch(worker)
    [second] = worker._fetcher.take(1, popped=popped, start=worker._record_start(popped))
    assert second.execution is not None
    ttl = redis_conn.ttl(second.execution.key)
    assert 0 < ttl <= 30 + 60


def test_a_caught_job_whose_hash_is_gone_leaves_nothing_behind(worker, redis_conn):
    enqueue(worker, "gone")
    popped = catch(worker)
    redis_conn.delete("rq:job:gone")
    start = worker._record_start(popped)
    assert worker._fetcher.take(1, popped=popped, start=start) == []
    assert redis_conn.keys("rq:job:gone*") == [] and redis_conn.keys("rq:execution*") == []
    assert StartedJobRegistry(QUEUE, connection=redis_conn).get_job_ids() == []


def test_an_undeserializable_job_started_by_the_take_ends_failed_with_its_execution(worker, redis_conn):
    enqueue(worker, "foreign")
    redis_conn.hset("rq:job:foreign", "data", b"\x80\x04not json")
    popped = catch(worker)
    [taken] = worker._fetcher.take(1, popped=popped, start=worker._record_start(popped))
    assert taken.execution is not None
    with pytest.raises(DeserializationError):
        taken.job.func_name  # noqa: B018

    worker._run(taken)

    assert FailedJobRegistry(QUEUE, connection=redis_conn).get_job_ids() == ["foreign"]
    assert StartedJobRegistry(QUEUE, connection=redis_conn).get_job_ids() == []
    assert redis_conn.keys("rq:execution:*") == []
    assert redis_conn.lrange(taken.queue.intermediate_queue_key, 0, -1) == []
    assert worker._undeserializable == 1
