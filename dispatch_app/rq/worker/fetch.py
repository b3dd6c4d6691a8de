"""Taking ready jobs off RQ's queues: several per round trip, each tracked the way RQ tracks one.

A taken job moves from its queue to the queue's intermediate list (LMOVE), as
RQ's own worker does with BLMOVE: until its start is written it is "taken but
not started". The script also returns each job's hash, so taking N jobs costs
one round trip instead of 2N, and marks the job with the worker that took it
(``pf_taken_by``, a hash field RQ ignores): a job taken by a worker that died
(kill -9) before starting it goes back to its queue at the next ``rescue``, by
any worker, instead of waiting for RQ's maintenance to fail it.

After a blocking wait the worker knows the job it is about to run before it has
read it: the take can then also write that job's start (``Start``: the writes
RQ's own code put into a pipeline, recorded, not sent), so an idle worker goes
from "a job arrived" to "started in Redis" in one round trip instead of two.
The script applies them only to a job whose hash says what the writes assumed.

The scripts are ``take_scripts``. A key of the wrong type in their way (junk anyone may write) is passed
over, its keys reset (``junk.reset``); a job whose key holds no hash is refused like an unreadable one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
from rq.executions import Execution
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.suspension import WORKERS_SUSPENDED

import dispatch_app.domains.lanes as lanes
import dispatch_app.rq.internals as rq_internals
import dispatch_app.rq.junk as junk
import dispatch_app.rq.worker.admission as admission
from dispatch_app.config.tuning import RQ_LIST_READ_MAX
from dispatch_app.rq.worker.take_scripts import RESCUE_SCRIPT, SETTLE_SCRIPT, TAKE_SCRIPT
from dispatch_app.rq.worker.take_scripts import TAKEN_BY as TAKEN_BY  # the readers' name for it

log = logging.getLogger("dispatch_app.rqworker")

NO_HASH = admission.Verdict(kind=admission.UNREADABLE, reason="its job key holds no hash", func="(none: no job hash)")


@dataclass
class Start:
    """A popped job's start, recorded: ``timeout`` is what its writes assumed, ``state`` the worker's before."""

    execution: Execution
    at: datetime  # the job's started_at (and last_heartbeat) the writes set
    worker_name: str
    timeout: str
    commands: list[tuple]
    state: str


def mark_started(job: Job, worker_name: str, at: datetime, execution: Execution) -> Execution:
    """What a start's writes set on the job in Redis (RQ's prepare_for_execution), on the job in hand."""
    job.worker_name, job.last_heartbeat, job.started_at = worker_name, at, at
    rq_internals.set_status(job, JobStatus.STARTED)
    rq_internals.attach_job(execution, job)
    return execution


@dataclass
class Taken:
    job: Job
    queue: Queue
    execution: Execution | None = None  # its start is already written (``Start``)
    unreadable: str | None = None  # why its hash could not be read (``admission`` refuses it)


class Suspended(Exception):
    """``rq suspend`` is in force: nothing was taken."""


class PendingTake:
    """A take script call sent, its reply not read yet (``Fetcher.send_take``).

    Errors are redis-py's (ConnectionError, TimeoutError), raised by ``result``: the caller's in-doubt
    handling is the same as for ``Fetcher.take``.
    """

    def __init__(self, fetcher: Fetcher, args: list, start: Start | None):
        self.fetcher, self.start = fetcher, start
        self.error: BaseException | None = None
        try:
            self.receive = fetcher._send(args)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.error = exc

    def result(self) -> list[Taken]:
        if self.error is not None:
            raise self.error
        return self.fetcher._taken(self.receive(), self.start)


class Fetcher:
    def __init__(self, connection: redis.Redis, queues: list[Queue], job_class: type[Job], serializer, name: str):
        self.connection = connection
        self.name = name
        # Every new lane before any late one (``dispatch_app.domains.lanes``): the blocking wait's BLPOP and the
        # take both go down this list, so new work of any queue comes before recovered work of all.
        self.queues = [q for q in queues if not lanes.is_late(q.name)] + [q for q in queues if lanes.is_late(q.name)]
        self.job_class = job_class
        self.serializer = serializer
        self.keys = [WORKERS_SUSPENDED]
        for queue in self.queues:
            self.keys += [queue.key, IntermediateQueue.get_intermediate_queue_key(queue.key)]
        tokens = [f"{2 + 2 * i}{'r' if lanes.is_late(q.name) else 'n'}" for i, q in enumerate(self.queues)]
        self.plan = " ".join(tokens)
        # The late lanes' share: one job from them first, then new work as usual.
        self.plan_late_first = " ".join([t for t in tokens if t.endswith("r")] + [t for t in tokens if t.endswith("n")])
        self.has_late = any(t.endswith("r") for t in tokens)
        self._script = connection.register_script(TAKE_SCRIPT)
        self._rescue = connection.register_script(RESCUE_SCRIPT)
        self._settle = connection.register_script(SETTLE_SCRIPT)

    def take(
        self,
        limit: int,
        popped: tuple[int, str, bool] | None = None,
        start: Start | None = None,
        late_first: bool = False,
    ) -> list[Taken]:
        """Up to ``limit`` ready jobs, new lanes first in RQ's queue order, then at most one from a late lane
        when no new work was there; raises Suspended.

        ``popped`` is (queue index, job id, needs moving to the intermediate list)
        for a job the blocking wait already took off its queue; ``start``, that
        job's start, written in the same call when the job is as it assumed (the
        first Taken then carries its execution). ``late_first``: the late lanes'
        share is due, so one of their jobs (if any) comes before new work.
        """
        args = self._take_args(limit, popped, start, late_first)
        return self._taken(self._script(keys=self.keys, args=args), start)

    def send_take(
        self, limit: int, popped: tuple[int, str, bool], start: Start | None, late_first: bool = False
    ) -> PendingTake:
        """``take`` in two halves: the script call is sent now and its reply read by ``PendingTake.result``,
        so the caller can do other I/O (the job's start in PostgreSQL) while Redis runs the script."""
        return PendingTake(self, self._take_args(limit, popped, start, late_first), start)

    def _send(self, args: list) -> Callable[[], Any]:
        """The take script call sent on a connection of its own from the pool; returns what reads its reply."""
        pool = self.connection.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_command("EVALSHA", self._script.sha, len(self.keys), *self.keys, *args)
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise

        def receive():
            try:
                return conn.read_response()
            except redis.exceptions.NoScriptError:
                # Redis restarted or flushed its scripts since the last call: loaded and run again, once.
                return self._script(keys=self.keys, args=args)
            except BaseException:
                conn.disconnect()  # the reply may still be on its way: never reuse this socket
                raise
            finally:
                pool.release(conn)

        return receive

    def _take_args(
        self, limit: int, popped: tuple[int, str, bool] | None, start: Start | None, late_first: bool = False
    ) -> list:
        plan = self.plan_late_first if late_first else self.plan
        args: list = [limit, Job.redis_job_namespace_prefix, self.name, plan]
        if popped is not None:
            index, job_id, move = popped
            args += [job_id, 2 + 2 * index, "1" if move else "0"]
            if start is not None:
                args += [start.timeout, len(start.commands)]
                for command in start.commands:
                    args += [len(command), *command]
        return args

    def _taken(self, reply, start: Start | None) -> list[Taken]:
        if reply[0] == 1:
            raise Suspended()
        taken, malformed, junk_hash = [], {}, {}
        for pair, job_id, flat, *started in reply[1:]:
            queue = self.queues[(pair - 2) // 2]
            if not isinstance(flat, list):  # its key holds no hash: out of the list already, refused here
                junk_hash.setdefault(queue, []).append(job_id)
                continue
            if admission.malformed_id(job_id):  # RQ's Job would raise on it: never made one
                malformed.setdefault(queue, []).append(job_id)
                continue
            job = self.job_class(job_id.decode(), connection=self.connection, serializer=self.serializer)
            # Any hash, bounded and without raising: a forged one is refused by the worker, not a crash here.
            unreadable = admission.restore(job, dict(zip(flat[::2], flat[1::2], strict=True)))
            taken.append(Taken(job, queue, self._started(job, start) if started else None, unreadable))
        for queue, ids in malformed.items():
            admission.drop_malformed(self.name, self.connection, queue.name, queue.intermediate_queue_key, ids)
        for queue, ids in junk_hash.items():
            admission.drop_malformed(self.name, self.connection, queue.name, None, ids, NO_HASH)
        if isinstance(reply[0], bytes):
            self.repair(reply[0].decode(errors="replace"))
        return taken

    def repair(self, why: str) -> None:
        """A key this worker takes through held the wrong type (the take passed over it): its keys put right."""
        log.warning(
            "worker %s: a Redis key of its queues held the wrong type (%s); resetting its keys",
            self.name,
            why[:300],
            extra={"action": "worker_take_key_refused", "domain": "worker"},
        )
        junk.reset(self.connection, junk.worker_keys(self.queues, self.name))

    @staticmethod
    def _started(job: Job, start: Start) -> Execution:
        return mark_started(job, start.worker_name, start.at, start.execution)

    def wait(self, timeout: float) -> tuple[int, str, bool] | None:
        """Block until a job is ready on any queue; (queue index, job id, needs moving) or None.

        One queue: BLMOVE into its intermediate list, so nothing is ever only in
        this process's memory. Several: BLPOP (Redis cannot block-move from
        several lists), as RQ's own worker does; the script moves it next.
        """
        if len(self.queues) == 1:
            queue = self.queues[0]
            intermediate = IntermediateQueue.get_intermediate_queue_key(queue.key)
            job_id = self.connection.blmove(queue.key, intermediate, timeout, "LEFT", "RIGHT")
            if job_id is None or self._dropped(queue, intermediate, job_id):
                return None
            return 0, job_id.decode(), False
        reply = self.connection.blpop([q.key for q in self.queues], timeout)
        if reply is None:
            return None
        index = next(i for i, q in enumerate(self.queues) if q.key == reply[0].decode())
        if self._dropped(self.queues[index], None, reply[1]):
            return None
        return index, reply[1].decode(), True

    def _dropped(self, queue: Queue, intermediate: str | None, job_id: bytes) -> bool:
        """A popped id no RQ job can have is dropped here, before a start is written or a Job made for it."""
        if not admission.malformed_id(job_id):
            return False
        admission.drop_malformed(self.name, self.connection, queue.name, intermediate, [job_id])
        return True

    def settle(self, popped: tuple[int, str, bool], start: Start | None) -> tuple[str, Taken | None]:
        """What became of a popped job whose take's reply was lost; with the job to run if its start was written."""
        index, job_id, _ = popped
        queue = self.queues[index]
        keys = [Job.redis_job_namespace_prefix + job_id, queue.key, queue.intermediate_queue_key]
        execution_key = start.execution.key if start is not None else ""
        verdict = self._settle(keys=keys, args=[job_id, self.name, execution_key, RQ_LIST_READ_MAX]).decode()
        if verdict != "started":
            return verdict, None
        job = self.job_class(job_id, connection=self.connection, serializer=self.serializer)
        raw = self.connection.hgetall(job.key)
        if not raw:  # gone since (expired, deleted): nothing to run
            return "gone", None
        unreadable = admission.restore(job, raw)  # as a take reads it: a forged hash is refused, not a crash
        return verdict, Taken(job, queue, self._started(job, start), unreadable)

    def rescue(self, own: bool = False) -> int:
        """Jobs taken by dead workers and never started go back to the head of their queues; ``own``: those this
        worker took too (it holds none of them: a take that failed half-way)."""
        from rq.worker import Worker

        args = [Job.redis_job_namespace_prefix, Worker.redis_worker_namespace_prefix, *([self.name] if own else [])]
        return self._rescue(keys=self.keys[1:], args=args)

    def give_back(self, taken: list[Taken]) -> None:
        """Return taken-but-not-started jobs to the head of their queues, in their order."""
        if not taken:
            return
        with self.connection.pipeline() as pipe:
            for item in reversed(taken):
                pipe.lrem(item.queue.intermediate_queue_key, 1, item.job.id)
                pipe.lpush(item.queue.key, item.job.id)
            pipe.execute()
