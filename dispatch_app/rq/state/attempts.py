"""What RQ says about an attempt: its job hash, whether its id is still listed, and whether its worker lives.

Recovery's evidence (``recovery.evidence``) asks these; reads only, outside any transaction, every Redis call bounded by
the socket timeouts in the connection's URL. Redis may have lost everything: a missing RQ job is evidence too. A job
or worker hash RQ cannot read raises, on purpose: that candidate is backed off with the error in its history.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import redis
from rq.exceptions import NoSuchJobError
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job as RQJob
from rq.queue import Queue
from rq.serializers import JSONSerializer
from rq.worker import Worker

import dispatch_app.db.liveness as liveness
from dispatch_app.config.tuning import RQ_LIST_READ_MAX
from dispatch_app.rq.ids import legacy_accepted, legacy_rq_job_id, rq_job_id


@dataclass(frozen=True)
class RQSeen:
    """An attempt's RQ job as Redis has it."""

    status: str  # "missing" when Redis has no such job
    worker: str | None = None
    started_at: datetime | None = None
    # For a "queued" job only: its id is in its queue or in the queue's intermediate list (a worker took it).
    # Neither: a worker popped it (BLPOP) and died or lost its connection before its take; nothing will run it.
    # None: not asked, or not found in the first RQ_LIST_READ_MAX ids of a list longer than that (not looked for).
    listed: bool | None = None
    # The longer list's length when the id was not looked for past RQ_LIST_READ_MAX ids.
    unread_depth: int | None = None


def rq_job_status(job_id: int, attempt: int, connection: redis.Redis) -> tuple[str, str | None]:
    """(status, worker name) of the attempt's RQ job; ("missing", None) when Redis has no such job."""
    seen = rq_job(job_id, attempt, connection)
    return seen.status, seen.worker


def rq_job(job_id: int, attempt: int, connection: redis.Redis) -> RQSeen:
    rq_id = rq_job_id(job_id, attempt)
    # A job sent by a release before namespaces has the id it had then (rq.ids: read while accepted): one look
    # for either, since after a Redis data loss every candidate is missing and each look is a round trip.
    ids = (rq_id, legacy_rq_job_id(job_id, attempt)) if legacy_accepted() else (rq_id,)
    if not connection.exists(*(RQJob.key_for(i) for i in ids)):
        return RQSeen("missing")
    job = None
    for rq_id in ids:
        try:
            job = RQJob.fetch(rq_id, connection=connection, serializer=JSONSerializer)
            break
        except NoSuchJobError:  # the other id, or expired between the two calls
            continue
    if job is None:
        return RQSeen("missing")
    status = job.get_status(refresh=False)
    status = getattr(status, "value", status) or "missing"
    listed, unread = None, None
    if status == "queued" and job.origin:
        listed, unread = _listed(connection, Queue.redis_queue_namespace_prefix + job.origin, rq_id)
    return RQSeen(status, job.worker_name or None, job.started_at, listed, unread)


def _listed(connection: redis.Redis, queue_key: str, rq_id: str) -> tuple[bool | None, int | None]:
    """(whether the id is in the queue or its intermediate list, the depth not read when that is not known).

    Both lists in one transaction: a BLMOVE between them is seen on one side. A worker's BLPOP is followed by its
    take (which lists the id again) within a round trip; a candidate caught in that gap is sent again as the next
    attempt, and the old attempt's start then finds it superseded. Each list is read from its head up to
    RQ_LIST_READ_MAX ids: a longer one may hold the id further back, so absence there proves nothing.
    """
    lists = (queue_key, IntermediateQueue.get_intermediate_queue_key(queue_key))
    with connection.pipeline(transaction=True) as pipe:
        for key in lists:
            pipe.lpos(key, rq_id, maxlen=RQ_LIST_READ_MAX)
            pipe.llen(key)
        replies = pipe.execute()
    positions, depths = replies[0::2], [int(depth) for depth in replies[1::2]]
    if any(position is not None for position in positions):
        return True, None
    if max(depths) > RQ_LIST_READ_MAX:
        return None, max(depths)
    return False, None


def worker_alive(name: str | None, connection: redis.Redis) -> bool | None:
    """A worker's hash lives while it heartbeats (it expires after the worker's TTL) and says when it died."""
    return worker_seen(name, connection)[0]


def worker_seen(name: str | None, connection: redis.Redis) -> tuple[bool | None, datetime | None]:
    """(alive, its last heartbeat by its own clock) of a worker; (None, None) without a name.

    Its PostgreSQL session first (``dispatch_app.db.liveness``): gone the moment the process is, present
    while it is merely slow. A worker whose session cannot be seen from here (none named in its hash:
    not started yet, another kind of worker, another server) is judged by its hash, which lives while it
    heartbeats and expires some periods after it stops.
    """
    if not name:
        return None, None
    key = Worker.redis_worker_namespace_prefix + name
    worker = Worker.find_by_key(key, connection=connection)
    if worker is None:
        return False, None
    if worker.death_date is not None:
        return False, worker.last_heartbeat
    claim = connection.hget(key, liveness.WORKER_HASH_FIELD)
    session = liveness.judged({name: claim.decode(errors="replace") if claim else None}).get(name)
    if session is not None:
        return session, worker.last_heartbeat
    return True, worker.last_heartbeat
