"""An id no RQ job can have, pushed into a queue, is dropped where the worker first reads it (rqworker.fetch).

Real Redis, a real PipelineWorker. RQ's ``Job(id)`` raises on an id outside its alphabet, and the
take made a Job of every id it took: one ``LPUSH delivery "evil id!"`` (with a hash beside it) ended
every worker that took it. Here such ids, UTF-8 or not, are dropped from the lists they sit in
(the queue, the intermediate list, the started registry), counted as refusals of kind ``bad_id``,
and the worker goes on, through the take, the blocking wait (one queue: BLMOVE; several: BLPOP)
and RQ's maintenance.
"""

from __future__ import annotations

import pytest
from rq import Queue
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from dispatch_app.rq.worker import PipelineWorker, admission
from dispatch_app.rq.worker.fetch import Fetcher
from dispatch_app.rq.worker.project_job import ProjectJob

MALFORMED = [b"evil id!", b"\xff\xfe", b"a:b", b"x" * 10 + b".y"]


@pytest.fixture(autouse=True)
def fresh_log_state():
    admission._told.clear()
    yield
    admission._told.clear()


def push(conn, queue: str, ids) -> None:
    for raw in ids:
        conn.hset(b"rq:job:" + raw, mapping={"status": "queued", "origin": queue, "data": "x"})
        conn.rpush(f"rq:queue:{queue}", raw)


def bad_ids_counted(conn) -> int:
    return admission.totals(conn)["kinds"].get(admission.BAD_ID, 0)


def queue_objects(conn, *names):
    return [Queue(name, connection=conn, serializer=JSONSerializer) for name in names]


def test_the_take_drops_malformed_ids_and_the_worker_goes_on(redis_conn):
    push(redis_conn, "delivery", MALFORMED)
    worker = PipelineWorker(queue_objects(redis_conn, "delivery"), connection=redis_conn, name="malformed")

    worker.work(burst=True)  # raised ValueError from rq.job.validate_job_id before the change

    assert redis_conn.llen("rq:queue:delivery") == 0
    assert redis_conn.lrange("rq:queue:delivery:intermediate", 0, -1) == []
    assert bad_ids_counted(redis_conn) == len(MALFORMED)


@pytest.mark.parametrize("names", [("delivery",), ("delivery", "agent")], ids=["blmove", "blpop"])
def test_the_blocking_wait_drops_a_malformed_id_before_any_start_is_written(redis_conn, names):
    fetcher = Fetcher(redis_conn, queue_objects(redis_conn, *names), ProjectJob, JSONSerializer, "malformed")
    push(redis_conn, "delivery", [b"\xff evil"])
    push(redis_conn, "delivery", [b"pf-1-1"])

    assert fetcher.wait(1.0) is None  # the malformed id, dropped
    assert redis_conn.lrange("rq:queue:delivery:intermediate", 0, -1) == []
    assert bad_ids_counted(redis_conn) == 1
    index, job_id, move = fetcher.wait(1.0)  # the next one is read as before
    assert (fetcher.queues[index].name, job_id, move) == ("delivery", "pf-1-1", len(names) > 1)


def test_maintenance_drops_malformed_ids_from_the_intermediate_list_and_the_started_registry(redis_conn):
    queue = Queue("delivery", connection=redis_conn, serializer=JSONSerializer)
    for raw in MALFORMED:
        redis_conn.rpush(queue.intermediate_queue_key, raw)
    wip = StartedJobRegistry("delivery", connection=redis_conn).key
    redis_conn.zadd(wip, {b"\xff:execution": 1, b"evil id!:execution": 1, b"pf-1-1:\xfe": 1})
    worker = PipelineWorker([queue], connection=redis_conn, name="malformed")

    worker.clean_registries()

    assert redis_conn.lrange(queue.intermediate_queue_key, 0, -1) == []
    assert redis_conn.zcard(wip) == 0
    assert bad_ids_counted(redis_conn) == len(MALFORMED)
    assert not redis_conn.exists(queue.registry_cleaning_key)
