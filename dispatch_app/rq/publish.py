"""Putting claimed envelopes on RQ: idempotent, pipelined, JSON-serialised.

The RQ job id is derived from the envelope (``rq.ids``: namespace, job id, attempt), and each job is
created by RQ's own create-if-absent Lua script (``rq.scripts``: the one behind
``enqueue(..., unique=True)``), with two guards in front. If the job hash exists
and carries this send's signature (``rq.ids.signature``), nothing is written and nothing is pushed.
A hash at that id without it was not written by a dispatcher of this deployment (planted ahead of the job,
or left by a database recreated under this Redis): it is replaced and the job pushed, and the send says so
(``SendResult.foreign``: logged, counted and put on the job's timeline by ``dispatch.foreign``), where it used
to count as already sent and leave the job to recovery. So a re-send (a dispatcher died between enqueue and mark, or
its lease ran out mid-send) is a no-op in Redis: a job a worker is running keeps
its hash ("started" stays "started") and is not queued a second time. One
pipeline per chunk, one round trip: the script is loaded at the head of the
same pipeline (cheap, idempotent) so a Redis restarted empty never answers
NOSCRIPT. Each job's reply is its own: created, already there, or an error that
belongs to that envelope alone; a server-wide refusal (OOM, READONLY, ...) fails
the whole chunk so the dispatch loop can pause (``dispatch.breaker``). The job
hash is RQ's own, built once per domain by RQ's code and filled in per envelope
(``HashTemplate``).

Each queue lives on the Redis its ``RQ_QUEUES`` entry names (``rq.servers``):
a chunk holds the envelopes of one server only (the loop groups them), so one
pipeline is still one round trip.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import zlib
from dataclasses import dataclass, field
from typing import Protocol

import redis
from django.conf import settings
from rq import Queue
from rq.job import Job, JobStatus
from rq.scripts import UNIQUE_ENQUEUE_SCRIPT
from rq.serializers import JSONSerializer
from rq.utils import now, utcformat

import dispatch_app.config.failpoints as failpoints
import dispatch_app.rq.internals as rq_internals
import dispatch_app.rq.servers as redis_servers
from dispatch_app.config.settings import DispatchSettings
from dispatch_app.domains import all_domains, get_domain, is_registered
from dispatch_app.rq.errors import outage_reason
from dispatch_app.rq.ids import SIGNATURE_FIELD, parse_rq_job_id, rq_job_id, signature

__all__ = ["CREATED", "EXISTED", "FOREIGN", "HashTemplate", "Publisher", "SendResult", "parse_rq_job_id", "rq_job_id"]

# The guards: a script is not rolled back when a command in it fails, so a push
# that would fail (the queue key is not a list) must fail before the hash is
# written; a hash left behind would make the re-send look like a sent job.
# Then a hash at the id that is not one this deployment's dispatcher wrote (ARGV[4..5], the first field, is the
# signature this send writes) goes, and RQ's script creates ours: its reply is 2 then (FOREIGN).
CREATE_IF_ABSENT = """
    local kind = redis.call("TYPE", KEYS[2])["ok"]
    if kind ~= "list" and kind ~= "none" then
        return redis.error_reply("WRONGTYPE queue key " .. KEYS[2] .. " holds a " .. kind .. ", not a list")
    end
    local foreign = 0
    local held = redis.call("TYPE", KEYS[1])["ok"]
    if held ~= "none" and (held ~= "hash" or redis.call("HGET", KEYS[1], ARGV[4]) ~= ARGV[5]) then
        redis.call("DEL", KEYS[1])
        foreign = 1
    end
""" + UNIQUE_ENQUEUE_SCRIPT.replace(
    rq_internals.UNIQUE_ENQUEUE_SUCCESS, "return 1 + foreign  -- created (2: in place of a foreign hash)"
)
# Redis names a loaded script by its SHA1 (an identifier, not a security use).
CREATE_IF_ABSENT_SHA = hashlib.sha1(CREATE_IF_ABSENT.encode(), usedforsecurity=False).hexdigest()
CREATED, EXISTED, FOREIGN = 1, 0, 2

log = logging.getLogger("dispatch_app.dispatch")


class Envelope(Protocol):
    """What a send needs of a claimed envelope (``store.claim.Claimed`` is one)."""

    job_id: int
    attempt: int
    domain: str
    queue: str


class PermanentSendError(Exception):
    """The envelope can never be sent as it is (e.g. its domain is not registered)."""


def redis_connection(url: str | None = None) -> redis.Redis:
    """One connection pool per server per process (redis-py pools are thread-safe)."""
    return redis_servers.connection(url or settings.REDIS_URL)


@dataclass
class SendResult:
    sent: int = 0
    duplicates: int = 0
    # Errors that belong to one envelope (its job's own reply): counted toward its MAX_SEND_ATTEMPTS.
    failed: list[tuple[Envelope, BaseException]] = field(default_factory=list)
    # Sent (counted in ``sent``) in place of a hash at their id that this deployment's dispatcher did not write.
    foreign: list[Envelope] = field(default_factory=list)


def _hset_args(job) -> list:
    """The job hash as field/value pairs, as ``Job.save`` would write it."""
    args: list = []
    for key, value in job.to_dict().items():
        if value is not None:
            args.extend((key, value if isinstance(value, (bytes, str)) else str(value)))
    return args


def _description(envelope: Envelope) -> str:
    return f"{envelope.domain} job {envelope.job_id} attempt {envelope.attempt}"


class HashTemplate:
    """One domain's RQ job hash, built once by RQ's own code: per envelope only four fields differ.

    Building an RQ ``Job`` per envelope (``create_job``, ``to_dict``) was most of
    a one-job send's client time (0.13 of 0.74 ms on a slow host; docs/benchmarks.md,
    "The send's job hash"), and an idle pipeline's send is on every job's path
    from commit to start. The fields stay exactly what RQ writes for the same
    call (tests/integration/rq/test_hash_template.py compares them with a Job built per envelope).
    """

    PER_JOB = ("created_at", "enqueued_at", "data", "description")

    def __init__(self, job):
        self.func_name = job.func_name
        self.origin = job.origin
        self.dumps = job.serializer.dumps
        self.ttl = job.ttl if job.ttl is not None else -1
        # The signature first: CREATE_IF_ABSENT compares a hash already there with ARGV[4..5].
        self.fields = [SIGNATURE_FIELD, "", *_hset_args(job)]
        names = self.fields[::2]
        missing = [name for name in self.PER_JOB if name not in names]
        if missing:  # an RQ whose job hash no longer has these fields: the template would write a stale value
            raise RuntimeError(f"RQ's job hash has no {', '.join(missing)} field: cannot template it")
        self._at = {name: 2 * names.index(name) + 1 for name in self.PER_JOB}

    def fields_for(self, envelope: Envelope, rq_id: str) -> list:
        fields = self.fields.copy()
        at = self._at
        # RQ reads both clocks within microseconds of each other (create_job, then _prepare_for_queue).
        fields[at["created_at"]] = fields[at["enqueued_at"]] = utcformat(now())
        # What Job.data and to_dict make of (func_name, instance, args, kwargs).
        fields[at["data"]] = zlib.compress(self.dumps((self.func_name, None, [envelope.job_id, envelope.attempt], {})))
        fields[at["description"]] = _description(envelope)
        fields[1] = signature(rq_id, self.func_name, self.origin)
        return fields


class Publisher:
    def __init__(self, conf: DispatchSettings, connection: redis.Redis | None = None):
        self.conf = conf
        # A connection given here carries every queue (tests, one-server tools); else each queue's RQ_QUEUES entry.
        self._fixed = connection is not None
        self.connection = connection or redis_connection()
        self._queues: dict[str, Queue] = {}
        self._templates: dict[tuple[str, str], HashTemplate] = {}
        self._servers: dict[str, str] = {}
        self._lock = threading.Lock()

    def server(self, queue: str) -> str:
        """The key of the Redis server a queue lives on (envelopes are grouped, and breakers kept, by it)."""
        # Asked per envelope on the hot path: a dict lookup, not a walk through the settings.
        server = self._servers.get(queue)
        if server is None:
            server = self._servers[queue] = "default" if self._fixed else redis_servers.queue_url(queue)
        return server

    def group_by_server(self, envelopes: list[Envelope]) -> dict[str, list[Envelope]]:
        """The envelopes per Redis server (``server``), in their order: one send per server."""
        groups: dict[str, list[Envelope]] = {}
        for envelope in envelopes:
            groups.setdefault(self.server(envelope.queue), []).append(envelope)
        return groups

    def servers(self) -> list[str]:
        """Every server a registered domain's queue lives on, the default one first."""
        if self._fixed:
            return ["default"]
        return list(dict.fromkeys([settings.REDIS_URL, *(self.server(d.queue) for d in all_domains())]))

    def connection_for(self, queue: str) -> redis.Redis:
        return self.connection if self._fixed else redis_servers.queue_connection(queue)

    def queue(self, name: str) -> Queue:
        with self._lock:
            queue = self._queues.get(name)
            if queue is None:
                queue = Queue(
                    name,
                    connection=self.connection_for(name),
                    serializer=JSONSerializer,
                    default_timeout=self.conf.RQ_JOB_TIMEOUT,
                )
                self._queues[name] = queue
            return queue

    def send_limits(self) -> dict:
        """What bounds one send on this connection, for ``conf.check_lease``."""
        pool = self.connection.connection_pool
        kwargs = pool.connection_kwargs
        # A connection object is built without connecting: its retry policy is the one sends will use.
        retry = pool.connection_class(**kwargs).retry
        retries = retry.get_retries() if retry is not None else 0
        backoff_cap = float(getattr(getattr(retry, "_backoff", None), "_cap", 0) or 0)
        return {
            "socket_timeout": kwargs.get("socket_timeout"),
            "attempts": retries + 1,
            "retry_wait": retries * backoff_cap,
        }

    @staticmethod
    def check(envelope: Envelope) -> None:
        if not is_registered(envelope.domain):
            raise PermanentSendError(f"domain {envelope.domain!r} is not registered")

    def _job(self, queue: Queue, envelope: Envelope, job_id: str):
        domain = get_domain(envelope.domain)
        job = queue.create_job(
            domain.task_path,
            args=[envelope.job_id, envelope.attempt],
            job_id=job_id,
            result_ttl=self.conf.RQ_RESULT_TTL,
            failure_ttl=self.conf.RQ_RESULT_TTL,
            description=_description(envelope),
            status=JobStatus.QUEUED,
        )
        # What Queue.enqueue does before it writes (origin, enqueued_at, timeout, status).
        rq_internals.prepare_for_queue(queue, job)
        return job

    def template(self, queue: Queue, envelope: Envelope) -> HashTemplate:
        key = (envelope.domain, queue.name)
        template = self._templates.get(key)
        if template is None:
            template = self._templates[key] = HashTemplate(self._job(queue, envelope, "pf-template"))
        return template

    def _check_setup(self, replies: list, setup: list[int], chunk: list[Envelope]) -> None:
        """The chunk-wide replies: no script is no job written (raised); RQ's set of queue names holding something
        else (anyone may write it; ``Queue.all``, listings only) is logged, the jobs were sent all the same and the
        worker's maintenance resets the key."""
        if isinstance(replies[0], Exception):
            raise replies[0]
        for position in setup[1:]:
            if isinstance(replies[position], Exception):
                queue = self.queue(chunk[0].queue)
                log.warning(
                    "%s could not be added to %s: %s; the jobs were sent",
                    queue.key,
                    queue.redis_queues_keys,
                    str(replies[position])[:200],
                    extra={"action": "queue_set_unwritable", "domain": chunk[0].domain},
                )

    def send(self, chunk: list[Envelope]) -> SendResult:
        failpoints.hit("hold_send")  # a send outliving its lease (fault suite, scenario 33)
        failpoints.hit("note_send")  # a send has begun (fault suite, scenario 9)
        pipe = self.queue(chunk[0].queue).connection.pipeline(transaction=False)
        pipe.execute_command("SCRIPT LOAD", CREATE_IF_ABSENT)
        setup = [0]  # reply positions of the chunk-wide commands
        slots: list[tuple[Envelope, int]] = []
        registered: set[str] = set()
        for envelope in chunk:
            queue = self.queue(envelope.queue)
            if queue.name not in registered:
                registered.add(queue.name)
                setup.append(len(pipe))
                pipe.sadd(queue.redis_queues_keys, queue.key)
            template = self.template(queue, envelope)
            job_id = rq_job_id(envelope.job_id, envelope.attempt)
            slots.append((envelope, len(pipe)))
            pipe.execute_command(
                "EVALSHA",
                CREATE_IF_ABSENT_SHA,
                2,
                Job.key_for(job_id),
                queue.key,
                job_id,
                "R",
                template.ttl,
                *template.fields_for(envelope, job_id),
            )
        replies = pipe.execute(raise_on_error=False)

        errors = [r for r in replies if isinstance(r, Exception)]
        # Redis as a whole refused: the chunk's fate says nothing about its envelopes.
        for error in errors:
            if outage_reason(error) is not None:
                raise error
        self._check_setup(replies, setup, chunk)
        result = SendResult()
        for envelope, position in slots:
            reply = replies[position]
            if isinstance(reply, Exception):
                result.failed.append((envelope, reply))
            elif reply == CREATED:
                result.sent += 1
            elif reply == FOREIGN:
                result.sent += 1
                result.foreign.append(envelope)
            else:
                result.duplicates += 1
        return result
