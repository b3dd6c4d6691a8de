"""Taking ready jobs off RQ's queues: several per round trip, each tracked the way RQ tracks one.

A taken job moves from its queue to the queue's intermediate list (LMOVE), as
RQ's own worker does with BLMOVE: until its start is written it is "taken but
not started", and RQ's maintenance (IntermediateQueue.cleanup) fails one left
there for over a minute by a dead worker. The script also returns each job's
hash, so taking N jobs costs one round trip instead of 2N.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.queue import Queue
from rq.suspension import WORKERS_SUSPENDED

# KEYS: the suspension flag, then (queue, intermediate) pairs in priority order.
# ARGV: [1] how many jobs at most, [2] the job hash key prefix, [3] (optional) a
# job id already popped from the queue given in [4] (the blocking wait's catch).
TAKE_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 1 and not ARGV[3] then return {1} end
local out = {0}
local left = tonumber(ARGV[1])
local function take(pair, id)
  local hash = redis.call('HGETALL', ARGV[2] .. id)
  if #hash == 0 then
    redis.call('LREM', KEYS[pair + 1], 1, id)
    return
  end
  table.insert(out, {pair, id, hash})
  left = left - 1
end
if ARGV[3] then
  local pair = tonumber(ARGV[4])
  if ARGV[5] == '1' then redis.call('RPUSH', KEYS[pair + 1], ARGV[3]) end
  take(pair, ARGV[3])
end
for pair = 2, #KEYS, 2 do
  while left > 0 do
    local id = redis.call('LMOVE', KEYS[pair], KEYS[pair + 1], 'LEFT', 'RIGHT')
    if not id then break end
    take(pair, id)
  end
  if left <= 0 then break end
end
return out
"""


@dataclass
class Taken:
    job: Job
    queue: Queue


class Suspended(Exception):
    """``rq suspend`` is in force: nothing was taken."""


class Fetcher:
    def __init__(self, connection: redis.Redis, queues: list[Queue], job_class: type[Job], serializer):
        self.connection = connection
        self.queues = queues
        self.job_class = job_class
        self.serializer = serializer
        self.keys = [WORKERS_SUSPENDED]
        for queue in queues:
            self.keys += [queue.key, IntermediateQueue.get_intermediate_queue_key(queue.key)]
        self._script = connection.register_script(TAKE_SCRIPT)

    def take(self, limit: int, popped: tuple[int, str, bool] | None = None) -> list[Taken]:
        """Up to ``limit`` ready jobs, in RQ's queue priority order; raises Suspended.

        ``popped`` is (queue index, job id, needs moving to the intermediate list)
        for a job the blocking wait already took off its queue.
        """
        args: list = [limit, Job.redis_job_namespace_prefix]
        if popped is not None:
            index, job_id, move = popped
            args += [job_id, 2 + 2 * index, "1" if move else "0"]
        reply = self._script(keys=self.keys, args=args)
        if reply[0] == 1:
            raise Suspended()
        taken = []
        for pair, job_id, flat in reply[1:]:
            queue = self.queues[(pair - 2) // 2]
            job = self.job_class(job_id.decode(), connection=self.connection, serializer=self.serializer)
            job.restore(dict(zip(flat[::2], flat[1::2], strict=True)))
            taken.append(Taken(job, queue))
        return taken

    def wait(self, timeout: float) -> tuple[int, str, bool] | None:
        """Block until a job is ready on any queue; (queue index, job id, needs moving) or None.

        One queue: BLMOVE into its intermediate list, so nothing is ever only in
        this process's memory. Several: BLPOP (Redis cannot block-move from
        several lists), as RQ's own worker does; the script moves it next.
        """
        if len(self.queues) == 1:
            queue = self.queues[0]
            job_id = self.connection.blmove(
                queue.key, IntermediateQueue.get_intermediate_queue_key(queue.key), timeout, "LEFT", "RIGHT"
            )
            return None if job_id is None else (0, job_id.decode(), False)
        reply = self.connection.blpop([q.key for q in self.queues], timeout)
        if reply is None:
            return None
        key, job_id = reply[0].decode(), reply[1].decode()
        return next(i for i, q in enumerate(self.queues) if q.key == key), job_id, True

    def give_back(self, taken: list[Taken]) -> None:
        """Return taken-but-not-started jobs to the head of their queues, in their order."""
        if not taken:
            return
        with self.connection.pipeline() as pipe:
            for item in reversed(taken):
                pipe.lrem(item.queue.intermediate_queue_key, 1, item.job.id)
                pipe.lpush(item.queue.key, item.job.id)
            pipe.execute()
