"""Admission: a job taken from Redis runs only if it is exactly what the dispatcher would have sent.

RQ imports and calls whatever function path a job hash names, and imports its
callback paths too (docs/architecture.md, "RQ runs whatever a job hash names"). Redis is a
delivery channel anyone on its network can write to, so its contents are input,
not instructions. Before anything is imported or called, ``check`` compares a
taken job with what ``rq.publish`` writes:

- its function is a declared domain's ``task_path`` (``dispatch_app.run.<key>``,
  the task backend's ``dispatch_app.tasks.run.entry.<queue>``, or a domain's own);
- its call is ``(job_id, attempt)``: two positive integers, no instance, no kwargs;
- its RQ id is ``rq.ids.rq_job_id(job_id, attempt)``: this deployment's namespace (or the form before namespaces,
  while ``PRODUCTFLOW_LEGACY_RQ_IDS`` accepts it: jobs sent before an upgrade);
- its hash carries the dispatcher's signature of that id, entry point and queue (``rq.ids.signed``; the legacy
  form has none);
- it was taken from a lane of that domain's queue (``lanes.queues``) and names that queue as its origin;
- it carries no callbacks, dependencies, repeats, retries, webhooks or rate limit.

A refused job is never imported or run: it leaves the queue (or its started
registry, when the take wrote its start) for RQ's failed registry, with the
reason as its exc_info, for inspection. The first refusal of each kind in a
process is logged at ERROR with the function path the job named, later ones one
INFO line each (a flood of forged jobs must not become a flood of alerts). Each
refusal is counted on its Redis server (``refused_key()``: the count, per kind, and
the last function path), where the dashboard's banner and the
``productflow_rq_jobs_refused`` metric read it (``totals``).

What PostgreSQL allows is checked after this, by the start itself
(transitions.START_SQL): a job that passes here still starts only if it is that
domain's, due, not paused, and its envelope was sent.
"""

from __future__ import annotations

import json
import logging
import re
import zlib
from dataclasses import dataclass

import redis
from rq.utils import now, utcformat

import dispatch_app.domains.lanes as lanes
from dispatch_app.domains import all_domains
from dispatch_app.rq.deployment import namespace
from dispatch_app.rq.ids import SIGNATURE_FIELD, legacy_accepted, legacy_rq_job_id, parse, rq_job_id, signed
from dispatch_app.rq.state.refusals import (  # the kinds and the counter are read there too
    BAD_ARGUMENTS,
    BAD_ID,
    EXTRAS,
    FUNC_SHOWN_MAX,
    KINDS,
    NOT_AN_ENTRY_POINT,
    REFUSED_TTL,
    UNREADABLE,
    UNSIGNED,
    WRONG_QUEUE,
    refused_key,
    totals,
)

log = logging.getLogger("dispatch_app.rqworker")

# The dispatcher's call data is ~60 bytes; a hash much bigger than a real one is refused before it is
# parsed (RQ decompresses ``data`` unbounded: a few KB of zlib can become hundreds of MB).
MAX_DATA_BYTES = 4096
MAX_HASH_BYTES = 64 * 1024

__all__ = [
    "BAD_ARGUMENTS", "BAD_ID", "EXTRAS", "KINDS", "NOT_AN_ENTRY_POINT", "UNREADABLE", "UNSIGNED", "WRONG_QUEUE",
    "Verdict", "check", "refuse", "refused_key", "restore", "totals",
]  # fmt: skip
_SIGNATURE = SIGNATURE_FIELD.encode()


@dataclass(frozen=True)
class Verdict:
    """``admitted``: the domain keys whose entry point and queue the job matches (one, unless two domains
    share a task_path and a queue). Refused: ``kind`` and ``reason``. ``func``: the path it named, shown."""

    admitted: tuple[str, ...] = ()
    kind: str = ""
    reason: str = ""
    func: str = ""

    @property
    def refused(self) -> bool:
        return not self.admitted

    @property
    def why(self) -> str:
        """Why its start (made ahead of the take, prestart) is withdrawn."""
        if self.kind == UNREADABLE:
            return f"its data in Redis could not be deserialised ({self.reason})"
        return f"it is not the project's work (refused: {self.kind})"


def restore(job, mapping: dict) -> str | None:
    """``job.restore(mapping)``, bounded and never raising: None, or why the hash cannot be read.

    Called by ``fetch`` on every taken hash: a hash RQ's own restore chokes on (a non-integer
    timeout, an unknown status, no data) must not stop the worker; ``check`` then refuses it.
    """
    size = sum(len(k) + len(v) for k, v in mapping.items() if isinstance(k, bytes) and isinstance(v, bytes))
    data = mapping.get(b"data")
    if size > MAX_HASH_BYTES or (data is not None and len(data) > MAX_DATA_BYTES):
        return f"job hash too big ({size} bytes; data {len(data or b'')} bytes)"
    try:
        job.restore(mapping)
    except Exception as exc:  # noqa: BLE001 - any error: the hash is not one RQ wrote for our publisher
        return f"job hash unreadable: {type(exc).__name__}: {str(exc)[:200]}"
    job.pf_signature = mapping.get(_SIGNATURE)  # for ``check``: RQ's restore keeps no field it does not know
    return None


def _shown(func) -> str:
    text = func if isinstance(func, str) else repr(func)
    return text[:FUNC_SHOWN_MAX]


def _is_positive_int(value) -> bool:
    # bool is an int in Python; JSON true is not a job id.
    return type(value) is int and 1 <= value < 2**63


def _extras(job) -> list[str]:
    found = []
    for name in ("success", "failure", "stopped"):
        if getattr(job, f"_{name}_callback_name", None):
            found.append(f"{name} callback")
    if getattr(job, "_dependency_ids", None):
        found.append("dependencies")
    if job.repeats_left is not None or getattr(job, "repeat_intervals", None):
        found.append("repeats")
    if job.retries_left is not None or getattr(job, "retry_intervals", None):
        found.append("retries")
    if getattr(job, "webhooks", None):
        found.append("webhooks")
    if getattr(job, "rate_limit_key", None):
        found.append("rate limit")
    return found


def check(job, queue: str, unreadable: str | None = None) -> Verdict:
    """Is this taken job the project's own work? Reads only the hash in hand: imports nothing."""
    if unreadable:
        return Verdict(kind=UNREADABLE, reason=unreadable)
    try:
        data = job.data
        if len(data) > MAX_DATA_BYTES:
            raise ValueError(f"{len(data)} bytes")
        call = json.loads(data)
    except Exception as exc:  # noqa: BLE001 - bytes no serializer of ours wrote (pickle, garbage, a bomb)
        return Verdict(kind=UNREADABLE, reason=f"call data is not JSON: {type(exc).__name__}: {str(exc)[:200]}")
    if not (isinstance(call, list) and len(call) == 4):
        return Verdict(kind=UNREADABLE, reason="call data is not [function, instance, args, kwargs]")
    func, instance, args, kwargs = call
    shown = _shown(func)
    named = [d for d in all_domains() if d.task_path == func] if isinstance(func, str) else []
    if not named:
        return Verdict(kind=NOT_AN_ENTRY_POINT, reason=f"function {shown!r} is no domain's entry point", func=shown)
    if instance is not None or kwargs != {} or not (isinstance(args, list) and len(args) == 2):
        return Verdict(kind=BAD_ARGUMENTS, reason="the call is not (job_id, attempt)", func=shown)
    if not all(_is_positive_int(a) for a in args):
        return Verdict(kind=BAD_ARGUMENTS, reason=f"arguments {str(args)[:100]} are not two job numbers", func=shown)
    refused = _id_refused(job.id, args)
    if refused:
        return Verdict(kind=BAD_ID, reason=refused, func=shown)
    keys = tuple(d.key for d in named if queue in lanes.queues(d.queue))
    if not keys or job.origin != queue:
        return Verdict(
            kind=WRONG_QUEUE, reason=f"taken from {queue!r} (origin {job.origin[:100]!r}), not its domain's", func=shown
        )
    extras = _extras(job)
    if extras:
        return Verdict(kind=EXTRAS, reason=f"carries {', '.join(extras)}", func=shown)
    if job.id != legacy_rq_job_id(*args) and not signed(job.id, func, queue, getattr(job, "pf_signature", None)):
        return Verdict(kind=UNSIGNED, reason="no signature of this deployment's dispatcher", func=shown)
    return Verdict(admitted=keys, func=shown)


def _id_refused(rq_id: str, args: list) -> str | None:
    """Why ``rq_id`` is not the id the dispatcher gives (job, attempt) ``args``, or None."""
    if rq_id == rq_job_id(*args) or (legacy_accepted() and rq_id == legacy_rq_job_id(*args)):
        return None
    parsed = parse(rq_id)
    if parsed is not None and parsed.namespace not in (None, namespace()):
        theirs = parsed.namespace
        return f"RQ id {rq_id[:100]!r} is another deployment's (namespace {theirs!r}, this is {namespace()!r})"
    return f"RQ id {rq_id[:100]!r} is not {rq_job_id(*args)!r}"


_told: set[str] = set()  # kinds already logged at ERROR in this process

# RQ's rule for a job id (``rq.job.JOB_ID_PATTERN``), on the raw bytes: an id outside it (or not UTF-8) is
# no RQ job's; making a Job of it raises, so it is dropped where it is first read and never becomes one.
_RQ_ID = re.compile(rb"[A-Za-z0-9_-]+")


def malformed_id(raw: bytes) -> bool:
    return _RQ_ID.fullmatch(raw) is None


def drop_malformed(
    worker_name: str, conn: redis.Redis, queue: str, intermediate: str | None, ids: list, verdict: Verdict | None = None
) -> None:
    """Ids no RQ job can have (or, given ``verdict``, why else nothing of them can be read), taken from ``queue``:
    out of its intermediate list (None: popped, already gone), logged and counted as refused (``bad_id`` unless
    ``verdict`` says otherwise), nothing else read or written for them."""
    verdict = verdict or Verdict(kind=BAD_ID, reason="not an RQ job id", func="(none: malformed RQ id)")
    with conn.pipeline() as pipe:
        logged = []
        for raw in ids:
            if intermediate is not None:
                pipe.lrem(intermediate, 1, raw)
            logged.append(_count(pipe, verdict, now()))
        replies = pipe.execute()
    for log_reset in logged:
        log_reset(replies)
    message = "worker %s: id %s taken from %s refused: %s (%s), nothing of it read or run"
    for raw in ids:
        shown = repr(raw[:100])
        _log_refusal(verdict.kind, queue, shown, message, worker_name, shown, queue, verdict.reason, verdict.kind)


def _log_refusal(kind: str, queue: str, job_id: str, message: str, *args) -> None:
    """The first refusal of a kind in this process at ERROR, later ones at INFO (a flood stays readable)."""
    extra = {"action": "job_refused", "domain": queue, "job_id": job_id, "kind": kind}
    if kind not in _told:
        _told.add(kind)
        log.error(message + "; later refusals of this kind are logged at INFO", *args, extra=extra)
    else:
        log.info(message, *args, extra=extra)


def refuse(worker, taken, verdict: Verdict) -> None:
    """Fail the job without running it (RQ's failed registry keeps it), log and count the refusal."""
    job, queue = taken.job, taken.queue
    message = "worker %s: job %r refused, not the project's work (%s: %s), function %r: never imported or run"
    args = (worker.name, job.id[:100], verdict.kind, verdict.reason, verdict.func)
    _log_refusal(verdict.kind, queue.name, job.id[:100], message, *args)
    if verdict.kind == UNREADABLE:
        worker._note_unreadable(job.id, verdict.reason)
        worker.failed_job_count += 1
    worker._flush_pending()  # the previous job's end first, as every write of this worker
    # The registries this worker wrote (the take's start) are the queue's, whatever origin the hash names.
    job.origin = queue.name
    at = now()
    with worker.connection.pipeline() as pipe:
        if taken.execution is None:
            pipe.lrem(queue.intermediate_queue_key, 1, job.id)
        else:  # started by the take (fetch.Start): end that execution, as RQ ends a failed one
            worker.cleanup_execution(job, pipeline=pipe, execution=taken.execution)
        # Written field by field, never ``job.save()``: the hash holds what the writer put there.
        pipe.hset(
            job.key,
            mapping={
                "status": "failed",
                "ended_at": utcformat(at),
                "exc_info": zlib.compress(f"refused by admission ({verdict.kind}): {verdict.reason}".encode()),
            },
        )
        pipe.expire(job.key, REFUSED_TTL)
        pipe.zadd(queue.failed_job_registry.key, {job.id: at.timestamp() + REFUSED_TTL})
        if verdict.kind == UNREADABLE:
            # As before admission: a worker fed jobs it cannot read shows as failing them (the health view's
            # "misconfigured worker: serializer?"). Other refusals are someone else's writes, not this worker's.
            worker.increment_failed_job_count(pipe)
        log_reset = _count(pipe, verdict, at)
        worker._write_fields(pipe)
        log_reset(pipe.execute())


def _count(pipe, verdict: Verdict, at):
    """The refusal counted into ``pipe``, whatever ``REFUSED_KEY`` holds; returns what logs a reset, given the
    pipeline's replies.

    Anyone on Redis's network can write that key: a string or a list there, or a count that is no number
    (``HSET productflow:refused count x``), made the refusal's HINCRBY fail and, uncaught, ended the worker.
    One script call puts it right first (a key of another type deleted, a count that is not 1-18 digits
    removed, each reset counted in ``resets``), then counts: the refusal itself is never held up by it.
    """
    script = """
    local reset = {}
    local kind = redis.call('TYPE', KEYS[1])['ok']
    if kind ~= 'hash' and kind ~= 'none' then
      redis.call('DEL', KEYS[1])
      table.insert(reset, 'the key held a ' .. kind)
    end
    for _, field in ipairs({'count', ARGV[1], 'resets'}) do
      if redis.call('HEXISTS', KEYS[1], field) == 1 and (redis.call('HSTRLEN', KEYS[1], field) > 18
          or not string.match(redis.call('HGET', KEYS[1], field), '^%d+$')) then
        redis.call('HDEL', KEYS[1], field)
        table.insert(reset, field .. ' was no count')
      end
    end
    redis.call('HINCRBY', KEYS[1], 'count', 1)
    redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
    if #reset > 0 then redis.call('HINCRBY', KEYS[1], 'resets', 1) end
    redis.call('HSET', KEYS[1], 'last_func', ARGV[2], 'last_kind', ARGV[3], 'last_at', ARGV[4])
    redis.call('EXPIRE', KEYS[1], ARGV[5])
    return table.concat(reset, '; ')
    """
    index = len(pipe)
    pipe.eval(script, 1, refused_key(), f"kind:{verdict.kind}", verdict.func, verdict.kind, utcformat(at), REFUSED_TTL)

    def log_reset(replies: list) -> None:
        reset = replies[index]
        if not reset:
            return
        first = "refused_counter_reset" not in _told
        _told.add("refused_counter_reset")
        (log.warning if first else log.info)(
            "the refusal counter %s held junk (%s): reset and counted (resets), the refusal counted on it",
            refused_key(),
            reset.decode(errors="replace") if isinstance(reset, bytes) else reset,
            extra={"action": "refused_counter_reset", "domain": "worker"},
        )

    return log_reset
