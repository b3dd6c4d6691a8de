"""Helpers shared by the recovery tests (integration and acceptance). No tests here."""

from __future__ import annotations

import psycopg
from django.db import connection
from rq import Queue, SimpleWorker
from rq.job import Job as RQJob
from rq.job import JobStatus as RQStatus
from rq.serializers import JSONSerializer

from dispatch_app.config.settings import dispatch_settings
from dispatch_app.dispatch.listener import listener_conninfo
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.domains import domain_keys, lane_queue_names
from dispatch_app.domains.policy import resolve
from dispatch_app.rq.publish import rq_job_id
from dispatch_app.store.transitions import START_SQL

TABLES = ("dispatch_app_job", "dispatch_app_dispatchenvelope", "dispatch_app_jobevent", "dispatch_app_recoveryround")
# Every job is stale at once: the tests move time by thresholds, never by sleeping.
STALE_NOW = {"QUEUED_STALE_SECONDS": 0, "RUNNING_STALE_SECONDS": 0, "JITTER_SECONDS": 0}


def zero_thresholds(**extra) -> dict:
    return {domain: {**STALE_NOW, **extra} for domain in domain_keys()}


def policy(domain: str, **overrides):
    return resolve(domain, {domain: {**STALE_NOW, **overrides}})


def other_connection() -> psycopg.Connection:
    """A second session, outside Django: another process's transaction, as far as PostgreSQL is concerned."""
    return psycopg.connect(**listener_conninfo())


def age_jobs(job_ids, seconds: float) -> None:
    """Move updated_at back: the trigger stamps only an UPDATE that leaves the column as it was, not this one."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dispatch_app_job SET updated_at = clock_timestamp() - make_interval(secs => %s) WHERE id = ANY(%s)",
            [seconds, list(job_ids)],
        )


def snapshot() -> dict[str, list[tuple]]:
    """Every row of the tables recovery could write, in a stable order."""
    out = {}
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"SELECT * FROM {table} ORDER BY id")
            out[table] = cursor.fetchall()
    return out


def dispatch_now() -> None:
    loop = DispatchLoop(dispatch_settings())
    try:
        loop.run_once()
    finally:
        loop.close()


def start_like_a_worker(job) -> None:
    """The worker's own start compare-and-set (queued -> running), as a worker that then dies would do."""
    with connection.cursor() as cursor:
        cursor.execute(START_SQL, ["a-worker-that-then-dies", job.pk, job.attempt, None])
        assert cursor.fetchone() is not None


def mark_rq_started(redis_conn, job_id: int, attempt: int, worker_name: str) -> None:
    """What RQ records when a worker takes the job: status started, the worker's name."""
    rq_job = RQJob.fetch(rq_job_id(job_id, attempt), connection=redis_conn, serializer=JSONSerializer)
    rq_job.worker_name = worker_name
    rq_job.set_status(RQStatus.STARTED)
    rq_job.save()


def run_workers(redis_conn) -> None:
    """A real RQ worker (JSON serializer), in burst mode: runs what is queued, then returns."""
    queues = [Queue(name, connection=redis_conn, serializer=JSONSerializer) for name in lane_queue_names()]
    SimpleWorker(queues, connection=redis_conn, serializer=JSONSerializer).work(burst=True)


def statuses(jobs) -> dict[int, tuple[str, int]]:
    from dispatch_app.models import Job

    return {j.pk: (j.status, j.attempt) for j in Job.objects.filter(pk__in=[job.pk for job in jobs])}
