"""Putting claimed envelopes on RQ: idempotent, pipelined, JSON-serialised.

The RQ job id is derived from the envelope (job id + attempt), and a send first
asks Redis which of those ids exist: an existing one is a send that already
happened (a dispatcher died between enqueue and mark) and counts as success.
The rest go in one MULTI/EXEC pipeline, so a chunk lands whole or not at all.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cache

import redis
from django.conf import settings
from rq import Queue
from rq.job import Job as RQJob
from rq.serializers import JSONSerializer

from dispatch_app.conf import DispatchSettings
from dispatch_app.dispatch.claim import Claimed
from dispatch_app.domains import REGISTRY


class PermanentSendError(Exception):
    """The envelope can never be sent as it is (e.g. its domain is not registered)."""


def rq_job_id(job_id: int, attempt: int) -> str:
    return f"pf-{job_id}-{attempt}"


@cache
def redis_connection(url: str | None = None) -> redis.Redis:
    """One connection pool per process (redis-py pools are thread-safe)."""
    return redis.Redis.from_url(url or settings.REDIS_URL)


@dataclass
class SendResult:
    sent: int = 0
    duplicates: int = 0


class Publisher:
    def __init__(self, conf: DispatchSettings, connection: redis.Redis | None = None):
        self.conf = conf
        self.connection = connection or redis_connection()
        self._queues: dict[str, Queue] = {}
        self._lock = threading.Lock()

    def queue(self, name: str) -> Queue:
        with self._lock:
            queue = self._queues.get(name)
            if queue is None:
                queue = Queue(
                    name,
                    connection=self.connection,
                    serializer=JSONSerializer,
                    default_timeout=self.conf.RQ_JOB_TIMEOUT,
                )
                self._queues[name] = queue
            return queue

    @staticmethod
    def check(envelope: Claimed) -> None:
        if envelope.domain not in REGISTRY:
            raise PermanentSendError(f"domain {envelope.domain!r} is not registered")

    def send(self, chunk: list[Claimed]) -> SendResult:
        ids = [rq_job_id(e.job_id, e.attempt) for e in chunk]
        # Only an envelope claimed before can have reached Redis already: a first
        # send skips the probe (a round trip per chunk). Should a server crash
        # lose an unflushed claim, a re-push is still refused by the worker's
        # start compare-and-set.
        resend = [i for i, e in enumerate(chunk) if not e.first_send]
        exists = [False] * len(chunk)
        if resend:
            probe = self.connection.pipeline(transaction=False)
            for i in resend:
                probe.exists(RQJob.key_for(ids[i]))
            for i, found in zip(resend, probe.execute(), strict=True):
                exists[i] = bool(found)
        pending = [(e, job_id) for e, job_id, found in zip(chunk, ids, exists, strict=True) if not found]
        if pending:
            pipe = self.connection.pipeline(transaction=True)
            by_queue: dict[str, list] = {}
            for envelope, job_id in pending:
                domain = REGISTRY[envelope.domain]
                by_queue.setdefault(envelope.queue, []).append(
                    Queue.prepare_data(
                        domain.task_path,
                        args=[envelope.job_id, envelope.attempt],
                        job_id=job_id,
                        result_ttl=self.conf.RQ_RESULT_TTL,
                        failure_ttl=self.conf.RQ_RESULT_TTL,
                        description=f"{envelope.domain} job {envelope.job_id} attempt {envelope.attempt}",
                    )
                )
            for queue_name, datas in by_queue.items():
                self.queue(queue_name).enqueue_many(datas, pipeline=pipe)
            pipe.execute()
        return SendResult(sent=len(pending), duplicates=len(chunk) - len(pending))
