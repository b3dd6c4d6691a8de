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
"""

from __future__ import annotations

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

import dispatch_app.lanes as lanes
import dispatch_app.rq_internals as rq_internals
import dispatch_app.worker.rqworker.admission as admission
from dispatch_app.tuning import RQ_LIST_READ_MAX

TAKEN_BY = "pf_taken_by"

# KEYS: the suspension flag, then (queue, intermediate) pairs.
# ARGV: [1] how many jobs at most, [2] the job hash key prefix, [3] the worker's
# name, [4] the plan: which pairs to scan in which order, each as its KEYS index
# and 'n' (new work: as many as allowed) or 'r' (a late lane, ``dispatch_app.lanes``:
# one job, and only when nothing else was taken in this call), [5] (optional) a job
# id already popped from the queue of pair [6] (the blocking wait's catch), [7] '1'
# if it still has to go to the intermediate list, [8] (optional) the popped job's
# start: the timeout its writes assumed ('' for none), [9] how many commands, then
# each command as its length and its words.
TAKE_SCRIPT = (
    """
if redis.call('EXISTS', KEYS[1]) == 1 and not ARGV[5] then return {1} end
local out = {0}
local left = tonumber(ARGV[1])
local taken = 0
local function take(pair, id)
  local key = ARGV[2] .. id
  local hash = redis.call('HGETALL', key)
  if #hash == 0 then
    redis.call('LREM', KEYS[pair + 1], 1, id)
    return nil
  end
  redis.call('HSET', key, '"""
    + TAKEN_BY
    + """', ARGV[3])
  local entry = {pair, id, hash}
  table.insert(out, entry)
  left = left - 1
  taken = taken + 1
  return entry
end
-- The recorded start, if the job is the one it was recorded for: its timeout sets the
-- execution's TTL, and a repeating job takes RQ's own path (the worker writes those itself).
local function start(entry)
  local hash, timeout, repeating = entry[3], '', false
  for i = 1, #hash, 2 do
    if hash[i] == 'timeout' then timeout = hash[i + 1] elseif hash[i] == 'repeats_left' then repeating = true end
  end
  if timeout ~= ARGV[8] or repeating then return end
  local at = 10
  for _ = 1, tonumber(ARGV[9]) do
    local n = tonumber(ARGV[at])
    redis.call(unpack(ARGV, at + 1, at + n))
    at = at + n + 1
  end
  table.insert(entry, 1)
end
if ARGV[5] then
  local pair = tonumber(ARGV[6])
  if ARGV[7] == '1' then redis.call('RPUSH', KEYS[pair + 1], ARGV[5]) end
  local entry = take(pair, ARGV[5])
  if entry and ARGV[8] then start(entry) end
end
-- A late lane's job is taken alone: held in the worker's hand behind nothing and ahead of nothing,
-- so new work arriving while it runs waits for that one job at most.
for pair, lane in string.gmatch(ARGV[4], '(%d+)(%a)') do
  pair = tonumber(pair)
  if left <= 0 then break end
  if lane == 'n' then
    while left > 0 do
      local id = redis.call('LMOVE', KEYS[pair], KEYS[pair + 1], 'LEFT', 'RIGHT')
      if not id then break end
      take(pair, id)
    end
  elseif taken == 0 then
    local id = redis.call('LMOVE', KEYS[pair], KEYS[pair + 1], 'LEFT', 'RIGHT')
    while id and not take(pair, id) do
      id = redis.call('LMOVE', KEYS[pair], KEYS[pair + 1], 'LEFT', 'RIGHT')
    end
  end
end
return out
"""
)

# KEYS: (queue, intermediate) pairs. ARGV: [1] job hash key prefix, [2] worker hash key prefix.
# A job in an intermediate list whose taker's hash is gone (it died) and that never
# started goes back to the head of its queue; returns how many.
RESCUE_SCRIPT = (
    """
local moved = 0
for pair = 1, #KEYS, 2 do
  local ids = redis.call('LRANGE', KEYS[pair + 1], 0, -1)
  for _, id in ipairs(ids) do
    local key = ARGV[1] .. id
    local owner = redis.call('HGET', key, '"""
    + TAKEN_BY
    + """')
    if owner and redis.call('EXISTS', ARGV[2] .. owner) == 0 and redis.call('HGET', key, 'status') == 'queued' then
      redis.call('LREM', KEYS[pair + 1], 1, id)
      redis.call('LPUSH', KEYS[pair], id)
      moved = moved + 1
    end
  end
end
return moved
"""
)


# After a take whose reply never came (a dropped connection): what became of the job the blocking wait popped.
# KEYS: [1] its hash, [2] its queue, [3] the intermediate list. ARGV: [1] the job id, [2] this worker's name,
# [3] the execution key its recorded start would have created ('' without one), [4] how far into the queue to
# look (tuning.RQ_LIST_READ_MAX: a popped id is not there at all, or back at its head).
# 'started': the take wrote the start (the job is this worker's to run); 'requeued': it went back to the head
# of its queue (the take never ran, or took it without the start); 'listed', 'gone', 'other': nothing to do.
SETTLE_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 'gone' end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'started' then
  if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], 'worker_name') == ARGV[2]
     and redis.call('EXISTS', ARGV[3]) == 1 then return 'started' end
  return 'other'
end
if status ~= 'queued' then return 'other' end
if redis.call('LPOS', KEYS[2], ARGV[1], 'MAXLEN', ARGV[4]) then return 'listed' end
redis.call('LREM', KEYS[3], 1, ARGV[1])
redis.call('LPUSH', KEYS[2], ARGV[1])
return 'requeued'
"""


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
        # Every new lane before any late one (``dispatch_app.lanes``): the blocking wait's BLPOP and the
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
        taken, malformed = [], {}
        for pair, job_id, flat, *started in reply[1:]:
            queue = self.queues[(pair - 2) // 2]
            if admission.malformed_id(job_id):  # RQ's Job would raise on it: never made one
                malformed.setdefault(queue, []).append(job_id)
                continue
            job = self.job_class(job_id.decode(), connection=self.connection, serializer=self.serializer)
            # Any hash, bounded and without raising: a forged one is refused by the worker, not a crash here.
            unreadable = admission.restore(job, dict(zip(flat[::2], flat[1::2], strict=True)))
            taken.append(Taken(job, queue, self._started(job, start) if started else None, unreadable))
        for queue, ids in malformed.items():
            admission.drop_malformed(self.name, self.connection, queue.name, queue.intermediate_queue_key, ids)
        return taken

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

    def rescue(self) -> int:
        """Jobs taken by dead workers and never started go back to the head of their queues."""
        from rq.worker import Worker

        prefixes = [Job.redis_job_namespace_prefix, Worker.redis_worker_namespace_prefix]
        return self._rescue(keys=self.keys[1:], args=prefixes)

    def give_back(self, taken: list[Taken]) -> None:
        """Return taken-but-not-started jobs to the head of their queues, in their order."""
        if not taken:
            return
        with self.connection.pipeline() as pipe:
            for item in reversed(taken):
                pipe.lrem(item.queue.intermediate_queue_key, 1, item.job.id)
                pipe.lpush(item.queue.key, item.job.id)
            pipe.execute()
