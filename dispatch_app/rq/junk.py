"""Values in Redis the project cannot use: read around them (the readers), reset them (the worker).

Anyone on Redis's network can write any key: a queue list made a string, a registry made a list, a
worker's ``failed_job_count`` made ``x``. RQ's writes to such a key fail (``WRONGTYPE``, "not an
integer") and, uncaught, ended the worker; a reader's pipeline failed whole on one such key.

Readers (``replies``): a reply Redis refused for one key reads as nothing (an empty list, hash or set),
logged (``action=redis_key_unreadable``); the other keys of the pipeline are still used.

The worker (``reset``): such a key holds nothing RQ wrote (RQ never writes a queue as a string), so
putting it right loses nothing. A key of the wrong type is deleted and a counter that is no number is
set to 0, in one script call that checks and writes atomically (a key RQ re-creates between a check
and a write is never touched). Each reset is logged (``action=redis_value_reset``) with the key, what
it held and what it should hold.
"""

from __future__ import annotations

import logging

import redis
from rq.executions import WORKER_EXECUTIONS_KEY_TEMPLATE, ExecutionRegistry
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.queue import Queue
from rq.results import Result
from rq.worker import Worker
from rq.worker_registration import REDIS_WORKER_KEYS, WORKERS_BY_QUEUE_KEY

log = logging.getLogger("dispatch_app.rqworker")

LIST, SET, ZSET, HASH, STREAM = "list", "set", "zset", "hash", "stream"
INT, FLOAT = "int", "float"
# RQ's counters in a worker hash (HINCRBY / HINCRBYFLOAT): anything else there makes the end write fail.
WORKER_COUNTERS = {"successful_job_count": INT, "failed_job_count": INT, "total_working_time": FLOAT}

# KEYS: the keys. ARGV: [i] the type KEYS[i] must have, for each key; then counters as triples: the index of
# their key in KEYS, the field, 'int' or 'float'. Returns what was reset, one line each.
RESET_SCRIPT = """
local out = {}
for i, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'none' and kind ~= ARGV[i] then
    redis.call('DEL', key)
    table.insert(out, key .. ' held a ' .. kind .. ', not a ' .. ARGV[i])
  end
end
local at = #KEYS + 1
while ARGV[at] do
  local key, field, kind = KEYS[tonumber(ARGV[at])], ARGV[at + 1], ARGV[at + 2]
  if redis.call('TYPE', key)['ok'] == 'hash' and redis.call('HEXISTS', key, field) == 1 then
    -- Its length first: a huge junk value is never copied into the script.
    local ok = redis.call('HSTRLEN', key, field) <= (kind == 'float' and 40 or 18)
    if ok then
      local value = redis.call('HGET', key, field)
      ok = string.match(value, '^-?%d+$') or (kind == 'float' and string.match(value, '^-?%d+%.%d*$'))
    end
    if not ok then
      redis.call('HSET', key, field, '0')
      table.insert(out, key .. ' field ' .. field .. ' was no number: set to 0')
    end
  end
  at = at + 3
end
return out
"""


_told: set[str] = set()  # readers whose junk was logged at WARNING in this process


def replies(pipe, what: str) -> list:
    """``pipe.execute()``, with a reply Redis refused for its key (WRONGTYPE) as None, logged once per call.

    Connection trouble still raises, and so does a pipeline every reply of which was refused (the server
    refuses us, not one key: say so). ``what``: the reader, for the log line.
    """
    out = pipe.execute(raise_on_error=False)
    refused = [r for r in out if isinstance(r, redis.ResponseError)]
    if refused and len(refused) == len(out):
        raise refused[0]
    if refused:
        first = what not in _told  # a page polled every few seconds: once at WARNING per reader, then INFO
        _told.add(what)
        (log.warning if first else log.info)(
            "%s: %d Redis key(s) hold what no RQ key holds (%s), read as empty",
            what,
            len(refused),
            str(refused[0])[:200],
            extra={"action": "redis_key_unreadable", "domain": "ops"},
        )
    return [None if isinstance(r, redis.ResponseError) else r for r in out]


def queue_keys(queue: Queue) -> dict[str, str]:
    """The keys of one queue RQ writes or a PipelineWorker reads, with their types."""
    keys = {queue.key: LIST, IntermediateQueue.get_intermediate_queue_key(queue.key): LIST}
    for registry in ("started", "finished", "failed", "deferred", "scheduled", "canceled"):
        keys[getattr(queue, f"{registry}_job_registry").key] = ZSET
    keys[WORKERS_BY_QUEUE_KEY % queue.name] = SET
    return keys


def worker_keys(queues, worker_name: str) -> dict[str, str]:
    """Every key a PipelineWorker on ``queues`` writes, with its type."""
    keys = {REDIS_WORKER_KEYS: SET, Queue.redis_queues_keys: SET}
    for queue in queues:
        keys.update(queue_keys(queue))
    keys[Worker.redis_worker_namespace_prefix + worker_name] = HASH
    keys[WORKER_EXECUTIONS_KEY_TEMPLATE.format(worker_name)] = SET
    return keys


def job_keys(job_id: str) -> dict[str, str]:
    """The keys of one job a worker's start and end write, with their types."""
    return {
        Job.key_for(job_id): HASH,
        Job.dependents_key_for(job_id): SET,
        ExecutionRegistry.key_template.format(job_id): ZSET,
        Result.get_key(job_id): STREAM,
    }


def reset(conn: redis.Redis, keys: dict[str, str], counters: dict[str, dict[str, str]] | None = None) -> list[str]:
    """Keys of the wrong type deleted, counters (``{hash key: {field: INT | FLOAT}}``) that are no number set to
    0, atomically; what was reset, each logged. Raises redis.RedisError (the server, not a value)."""
    counters = counters or {}
    typed = {**keys, **{key: HASH for key in counters if key not in keys}}
    names = list(typed)
    args: list = [typed[k] for k in names]
    for key, fields in counters.items():
        for field, kind in fields.items():
            args += [names.index(key) + 1, field, kind]
    done = [line.decode(errors="replace") for line in conn.eval(RESET_SCRIPT, len(names), *names, *args)]
    for line in done:
        log.warning(
            "Redis value reset: %s (anyone on Redis's network can write it; RQ's writes to it would fail)",
            line,
            extra={"action": "redis_value_reset", "domain": "worker"},
        )
    return done
