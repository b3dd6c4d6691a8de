"""start_template: a job's start written from the recorded template is RQ's own start, value for value.

Real Redis. RQ's code (``_rq_start_writes``) and the template (``_start_writes``) each start a job; every key
either touched must match in type, TTL, fields and values, with the ids and the clock made generic (and the
clock checked to be the moment of the start). A recording that varies beyond the ids and the clock is refused,
and the worker then writes each start with RQ's code.
"""

from __future__ import annotations

import itertools
import re
import time
import uuid

import pytest
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import utcformat, utcparse
from rq.worker import WorkerStatus

from dispatch_app.rq.worker import PipelineWorker
from dispatch_app.rq.worker.start_template import StartTemplate

QUEUE = "delivery"
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@pytest.fixture
def worker(redis_conn):
    queue = Queue(QUEUE, connection=redis_conn, serializer=JSONSerializer, default_timeout=600)
    w = PipelineWorker([queue], connection=redis_conn, name="template-start")
    w.register_birth()
    w.set_state(WorkerStatus.IDLE)
    return w


def start(worker, job_id: str, *, rq_code: bool):
    """Enqueue job_id, take it to the intermediate list as the worker does, start it; (execution, before, after)."""
    queue = worker._ordered_queues[0]
    before = time.time()  # the enqueue's own times fall in the window too
    queue.enqueue("dispatch_app.run.delivery", 1, 1, job_id=job_id)
    worker.connection.lmove(queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT")
    job = Job.fetch(job_id, connection=worker.connection, serializer=JSONSerializer)
    with worker.connection.pipeline() as pipe:
        write = worker._rq_start_writes if rq_code else worker._start_writes
        execution = write(pipe, job, queue)
        pipe.execute()
    return job, execution, before, time.time()


def snapshot(redis_conn, job, execution, before: float, after: float) -> dict:
    """Every key but the worker's own hash: ids generic, times checked against [before, after] and made generic."""
    ids = {job.id: "<job>", execution.id: "<execution>"}

    def generic(value) -> str:
        text = value.decode(errors="backslashreplace") if isinstance(value, bytes) else str(value)
        for real, name in ids.items():
            text = text.replace(real, name)
        if ISO.match(text):
            assert before - 0.001 <= utcparse(text).timestamp() <= after + 0.001, text
            return "<now>"
        if re.fullmatch(r"\d{10}\.\d+", text):
            assert before - 0.001 <= float(text) <= after + 0.001, text
            return "<now>"
        return text

    started = int(job.started_at.timestamp())

    def offset(score: float) -> int:
        # An epoch-seconds score: the start's second + a TTL.
        assert score == int(score) and score > started
        return int(score) - started

    out = {}
    for raw in redis_conn.keys("*"):
        key = raw.decode()
        if key.startswith("rq:worker:template-start") and "executions" not in key or key.startswith("rq:workers"):
            continue  # the worker's hash (its state is compared apart) and its registration
        kind = redis_conn.type(raw).decode()
        if kind == "hash":
            content = sorted((f.decode(), generic(v)) for f, v in redis_conn.hgetall(raw).items())
        elif kind == "zset":
            content = sorted((generic(m), offset(s)) for m, s in redis_conn.zrange(raw, 0, -1, withscores=True))
        elif kind == "set":
            content = sorted(generic(m) for m in redis_conn.smembers(raw))
        elif kind == "list":
            content = [generic(m) for m in redis_conn.lrange(raw, 0, -1)]
        else:
            content = generic(redis_conn.get(raw))
        out[generic(key)] = (kind, redis_conn.ttl(raw), content)
    return out


@pytest.mark.parametrize("state", [WorkerStatus.IDLE, WorkerStatus.BUSY])
def test_a_start_from_the_template_is_rqs_start_value_for_value(worker, redis_conn, state):
    worker.set_state(state)
    rq_start = start(worker, "by-rq", rq_code=True)
    by_rq = snapshot(redis_conn, *rq_start)
    rq_state = redis_conn.hget(worker.key, "state")
    redis_conn.delete(*[k for k in redis_conn.keys("*") if k.decode() != worker.key])
    worker.set_state(state)

    job, execution, before, after = start(worker, "by-template", rq_code=False)

    assert worker._start_templates[(QUEUE, 600, state == WorkerStatus.BUSY)] is not None
    by_template = snapshot(redis_conn, job, execution, before, after)
    assert by_template == by_rq
    assert redis_conn.hget(worker.key, "state") == rq_state == WorkerStatus.BUSY.encode()
    # The job and the execution in hand say what Redis says, as RQ's own objects would.
    stored = Job.fetch("by-template", connection=redis_conn, serializer=JSONSerializer)
    assert (job.worker_name, job.get_status(refresh=False)) == ("template-start", JobStatus.STARTED)
    assert utcformat(job.started_at) == utcformat(stored.started_at) == utcformat(job.last_heartbeat)
    assert execution.job is job and execution.job_id == "by-template"
    assert execution.created_at == job.started_at
    assert StartedJobRegistry(QUEUE, connection=redis_conn).get_job_ids() == ["by-template"]


def test_each_start_gets_its_own_execution(worker, redis_conn):
    first = start(worker, "one", rq_code=False)[1]
    second = start(worker, "two", rq_code=False)[1]
    assert first.id != second.id
    assert len({first.key, second.key}) == 2 and all(redis_conn.exists(e.key) for e in (first, second))


def recorder(extra):
    """A record() whose writes are RQ-like plus ``extra(job_id)`` in the last command."""

    def record(job_id: str):
        execution_id = uuid.uuid4().hex
        now = time.time()
        stack = [
            (("HSET", f"rq:execution:{job_id}:{execution_id}", "created_at", now), {}),
            (("ZADD", "rq:wip:delivery", int(now) + 240, f"{job_id}:{execution_id}"), {}),
            (("HSET", f"rq:job:{job_id}", "started_at", utcformat(utcparse(utcformat_now())), *extra(job_id)), {}),
        ]
        return stack, execution_id

    return record


def utcformat_now() -> str:
    from datetime import UTC, datetime

    return utcformat(datetime.now(UTC))


def test_the_model_takes_ids_and_clock_and_refuses_anything_else_that_varies():
    assert StartTemplate.build(recorder(lambda job_id: ()), "w") is not None
    assert StartTemplate.build(recorder(lambda job_id: ("constant", "x")), "w") is not None
    # A random token, a counter, a value derived from the id, a time that is not the recording's: refused.
    assert StartTemplate.build(recorder(lambda job_id: ("token", uuid.uuid4().hex)), "w") is None
    counter = itertools.count()
    assert StartTemplate.build(recorder(lambda job_id: ("n", next(counter))), "w") is None
    assert StartTemplate.build(recorder(lambda job_id: ("tail", job_id[-6:])), "w") is None
    assert StartTemplate.build(recorder(lambda job_id: ("then", time.time() - 3600.0)), "w") is None


def test_a_refused_template_leaves_each_start_to_rqs_code(worker, redis_conn, monkeypatch, caplog):
    rq_writes = worker._rq_start_writes

    def with_a_token(pipe, job, queue):
        execution = rq_writes(pipe, job, queue)
        pipe.hset(job.key, "token", uuid.uuid4().hex)  # varies between recordings: no template fits
        return execution

    monkeypatch.setattr(worker, "_rq_start_writes", with_a_token)
    job, execution, before, after = start(worker, "refused", rq_code=False)

    assert worker._start_templates[(QUEUE, 600, False)] is None
    assert "worker_start_template_refused" in [getattr(r, "action", "") for r in caplog.records]
    stored = redis_conn.hgetall(job.key)
    assert stored[b"status"] == b"started" and len(stored[b"token"]) == 32
    assert redis_conn.exists(execution.key)


def test_templates_are_bounded_and_past_the_bound_rqs_code_starts_the_job(worker, redis_conn):
    from dispatch_app.rq.worker.starts import MAX_START_TEMPLATES

    for timeout in range(MAX_START_TEMPLATES):
        worker._start_templates[(QUEUE, 10_000 + timeout, False)] = None
    job, execution, before, after = start(worker, "past-the-bound", rq_code=False)
    assert len(worker._start_templates) == MAX_START_TEMPLATES
    assert Job.fetch(job.id, connection=redis_conn, serializer=JSONSerializer).get_status() == JobStatus.STARTED
    assert StartedJobRegistry(QUEUE, connection=redis_conn).get_job_ids() == ["past-the-bound"]
    assert redis_conn.exists(execution.key)
