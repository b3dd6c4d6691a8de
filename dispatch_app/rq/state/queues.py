"""The RQ side, read live: what sits in each Redis queue, who serves it, and whether the worker of a job lives.

PostgreSQL says a job is ``queued`` or ``running``; only Redis says whether a
worker listens on its queue and whether the worker running it is still there.
Everything here is read-only against Redis (a few pipelined reads per page,
bounded by a short socket timeout) and joins Redis to PostgreSQL by the RQ job
id (``rq.ids.rq_job_id``); one job's RQ side is ``rqjobs``.

Ages are on the database clock: the oldest job waiting in a queue is aged from
its envelope's ``dispatched_at``; only a worker's last heartbeat is a
timestamp written by the worker's host (RQ writes it), and is labelled so.

Anyone on Redis's network can write these keys: a value that is no RQ value reads as unknown (``text``,
``_count``, ``parse_utc``), a key of another type as empty (``junk.replies``), never as an error for the page.

Worker liveness: RQ keeps a worker's hash (``rq:worker:<name>``) alive with a
TTL it renews on every heartbeat, so a worker killed with SIGKILL disappears
only when that TTL runs out (up to ``worker_ttl + 60`` s when idle,
``job_monitoring_interval + 60`` s mid-job). A worker on the host that serves
this page is also checked by its pid, so a killed local worker shows dead at
once; so is one whose PostgreSQL session is gone (``dispatch_app.db.liveness``), on
any host. A worker hash marked with ``death`` or gone is dead. A PipelineWorker
beats every ``pf_heartbeat_interval`` seconds (its hash says so) from its own
thread, so on any host it is "not alive" once its last heartbeat is older than
SILENT_PERIODS periods by Redis' clock (TIME): ~25 s at the default 10 s, not
the 60 s its hash takes to expire. Such a worker is dead *since* its last
heartbeat; a worker that recovers (a frozen process thawed) shows alive again.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import cache

import redis
from django.conf import settings
from django.db import connection

import dispatch_app.db.liveness as liveness
import dispatch_app.domains.lanes as lanes
import dispatch_app.rq.internals as rq_internals
import dispatch_app.rq.junk as junk
import dispatch_app.rq.servers as redis_servers
import dispatch_app.rq.state.health as health
from dispatch_app.config.tuning import REDIS_TIMEOUT, SILENT_PERIODS
from dispatch_app.domains import all_domains
from dispatch_app.rq.fields import HEARTBEAT_INTERVAL_FIELD, LAST_ERROR_FIELD, RECENT_FIELD
from dispatch_app.rq.ids import parse_rq_job_id

log = logging.getLogger("dispatch_app.rq.state.queues")

WORKER_PREFIX = rq_internals.worker_key_prefix()


@cache
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT, socket_connect_timeout=REDIS_TIMEOUT)


def redis_conn(queue: str | None = None) -> redis.Redis:
    """The short-timeout connection to the server a queue lives on (its RQ_QUEUES entry; REDIS_URL without one)."""
    return _redis(redis_servers.queue_url(queue) if queue else settings.REDIS_URL)


queue_key = rq_internals.queue_key


def text(value) -> str:
    # Anyone on Redis's network writes these bytes: a page must render whatever they are.
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


def parse_utc(value: str) -> datetime | None:
    """RQ's timestamps (``utcformat``): ISO 8601 in UTC, with or without a trailing Z."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    # A killed process stays a zombie until its parent (a worker pool) reaps it: dead all the same.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@dataclass
class WorkerInfo:
    name: str
    queues: list[str]
    state: str
    hostname: str
    pid: int | None
    alive: bool
    dead_reason: str
    last_heartbeat: datetime | None  # the worker host's clock (RQ writes it)
    current_job: str
    successful: int
    failed: int
    recent: str = ""  # PipelineWorker's last outcomes (rq.worker.health)
    last_error: str = ""
    heartbeat_age: float | None = None  # seconds since last_heartbeat, by Redis' clock
    heartbeat_interval: float | None = None  # PipelineWorker only: its beat period

    @property
    def dead_since(self) -> datetime | None:
        """The last sign of life of a dead worker (its last heartbeat), None while alive or unknown."""
        return None if self.alive else self.last_heartbeat

    @property
    def failing_every_job(self) -> bool:
        """rq.worker.health's rule: the last outcomes all failed, or every job since one it could not deserialize
        (RQ counts a job failed only when the task raised or could not be loaded: business failures return)."""
        return self.alive and health.failing(self.recent, self.failed, self.successful)


def _float(value: str) -> float | None:
    try:
        number = float(value) if value else None
    except ValueError:
        return None
    return number if number is None or math.isfinite(number) else None


def _count(value: str) -> int:
    """A counter RQ writes as decimal digits; anything else (forged, corrupt) reads as 0."""
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 18 else 0


def _pid(value: str) -> int | None:
    pid = _count(value)
    return pid if 0 < pid < 2**22 else None  # Linux's largest pid_max; beyond it os.kill overflows


def _judge(
    name: str,
    data: dict,
    local_host: str,
    redis_now: datetime | None = None,
    executions: list[str] = (),
    session: bool | None = None,
) -> WorkerInfo:
    pid = _pid(data.get("pid", ""))
    host = data.get("hostname", "")
    last_heartbeat = parse_utc(data.get("last_heartbeat", ""))
    age = (redis_now - last_heartbeat).total_seconds() if redis_now and last_heartbeat else None
    interval = _float(data.get(HEARTBEAT_INTERVAL_FIELD, ""))
    alive, reason = True, ""
    if not data:
        alive, reason = False, "its RQ hash is gone (TTL ran out without a heartbeat, or it was cleaned up)"
    elif data.get("death"):
        alive, reason = False, "it registered its death (stopped)"
    elif session is False:
        # Its PostgreSQL session (dispatch_app.db.liveness) ended with the process: dead on any host, at once.
        alive, reason = False, "its PostgreSQL session is gone"
    elif host == local_host and pid is not None and not pid_alive(pid):
        alive, reason = False, f"pid {pid} no longer exists on {host}"
    elif interval and age is not None and age > SILENT_PERIODS * interval:
        # Killed on another host, frozen, or cut off from Redis: its beat thread has stopped.
        alive, reason = False, f"no heartbeat for {age:.0f} s (it beats every {interval:g} s)"
    return WorkerInfo(
        name=name,
        queues=[q for q in data.get("queues", "").split(",") if q],
        state=data.get("state", "?"),
        hostname=host,
        pid=pid,
        alive=alive,
        dead_reason=reason,
        last_heartbeat=last_heartbeat,
        # RQ's own worker names its job in the hash; PipelineWorker only keeps RQ's executions set (job:execution).
        current_job=data.get("current_job", "") or ", ".join(sorted(e.split(":", 1)[0] for e in executions)),
        successful=_count(data.get("successful_job_count", "")),
        failed=_count(data.get("failed_job_count", "")),
        recent=data.get(RECENT_FIELD, ""),
        last_error=data.get(LAST_ERROR_FIELD, ""),
        heartbeat_age=None if age is None else round(age, 1),
        heartbeat_interval=interval,
    )


def read_workers(conn: redis.Redis, names) -> dict[str, WorkerInfo]:
    """Each named worker's hash, in one pipeline, judged alive or dead."""
    names = sorted(set(names))
    with conn.pipeline(transaction=False) as pipe:
        pipe.time()
        for name in names:
            pipe.hgetall(WORKER_PREFIX + name)
            pipe.smembers(f"{WORKER_PREFIX}{name}:executions")
        (seconds, micros), *raw = junk.replies(pipe, "the RQ side's workers")  # a key of another type: empty
    redis_now = datetime.fromtimestamp(seconds + micros / 1e6, tz=UTC)
    local = socket.gethostname()
    hashes = [{text(k): text(v) for k, v in (raw[2 * i] or {}).items()} for i in range(len(names))]
    sessions = liveness.judged(
        {name: data.get(liveness.WORKER_HASH_FIELD) for name, data in zip(names, hashes, strict=True)}
    )
    return {
        name: _judge(name, hashes[i], local, redis_now, [text(e) for e in raw[2 * i + 1] or ()], sessions.get(name))
        for i, name in enumerate(names)
    }


@dataclass
class QueueInfo:
    queue: str
    domains: list[str]
    depth: int
    workers: list[str] = field(default_factory=list)  # registered on this queue (live or not)
    live_workers: int = 0
    head: str = ""  # the RQ id a worker takes next
    oldest_wait: float | None = None  # seconds since the head job was dispatched (database clock)
    # Per lane (dispatch_app.domains.lanes): its RQ queue, depth, head, oldest_wait, workers and live_workers.
    # depth above is all lanes', live_workers the new lane's, head and oldest_wait the one taken next / oldest.
    lanes: dict[str, dict] = field(default_factory=dict)


def _head_ages(rq_ids: list[str]) -> dict[str, float]:
    """Seconds since each head job's envelope was dispatched, on the database clock."""
    ids = {pair: rq_id for rq_id in rq_ids if (pair := parse_rq_job_id(rq_id))}
    pairs = list(ids)
    if not pairs:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT e.job_id, e.attempt, extract(epoch FROM clock_timestamp() - e.dispatched_at)::float8 "
            "FROM dispatch_app_dispatchenvelope e "
            "JOIN unnest(%s::bigint[], %s::int[]) AS h(job_id, attempt) USING (job_id, attempt) "
            "WHERE e.dispatched_at IS NOT NULL",
            [[p[0] for p in pairs], [p[1] for p in pairs]],
        )
        return {ids[(j, a)]: age for j, a, age in cursor.fetchall()}


def snapshot(conn: redis.Redis | None = None) -> dict:
    """Per queue: depth, registered and live workers, the head job and its wait; plus every worker seen.

    Each queue is read on its own server (RQ_QUEUES; ``conn`` given: all on it).
    Never raises for Redis trouble: ``error`` says what failed, and the queues of
    an unreadable server are left out (the other servers' are still shown).
    """
    all_queues: dict[str, QueueInfo] = {}
    for domain in all_domains():
        all_queues.setdefault(domain.queue, QueueInfo(domain.queue, [], 0)).domains.append(domain.key)
    groups = {"": list(all_queues)} if conn is not None else redis_servers.by_server(all_queues)
    queues: dict[str, QueueInfo] = {}
    workers: dict[str, WorkerInfo] = {}
    errors: list[str] = []
    for url, names_on_server in groups.items():
        try:
            server = conn if conn is not None else _redis(url)
            read = _read_server(server, [all_queues[q] for q in names_on_server])
            workers.update(read)
            queues.update((q, all_queues[q]) for q in names_on_server)
        except redis.RedisError as exc:
            where = f" on {redis_servers.label(url)}" if len(groups) > 1 else ""
            log.warning("RQ side unreadable%s: %s", where, exc, extra={"action": "rq_side_unreadable", "domain": "ops"})
            errors.append(f"{type(exc).__name__}{where}: {exc}")
    if not queues:
        return {"error": "; ".join(errors), "queues": {}, "workers": [], "domains": {}}
    ages = _head_ages([lane["head"] for q in queues.values() for lane in q.lanes.values() if lane["head"]])
    for info in queues.values():
        for lane in info.lanes.values():
            lane["live_workers"] = sum(1 for w in lane["workers"] if workers[w].alive)
            lane["oldest_wait"] = ages.get(lane["head"])
        info.live_workers = info.lanes[lanes.NEW]["live_workers"]
        waits = [lane["oldest_wait"] for lane in info.lanes.values() if lane["oldest_wait"] is not None]
        info.oldest_wait = max(waits) if waits else None
    domains = {}
    for info in queues.values():
        for domain in info.domains:
            domains[domain] = {
                "queue": info.queue,
                "depth": info.depth,
                "live_workers": info.live_workers,
                "workers": len(info.workers),
                "oldest_wait": info.oldest_wait,
                "lanes": {
                    name: {k: lane[k] for k in ("queue", "depth", "live_workers", "oldest_wait")}
                    for name, lane in info.lanes.items()
                },
            }
    return {
        "error": "; ".join(errors),
        "queues": {q: asdict(info) for q, info in queues.items()},
        "workers": [_worker_dict(w) for w in workers.values()],
        "domains": domains,
    }


def _read_server(conn: redis.Redis, infos: list[QueueInfo]) -> dict[str, WorkerInfo]:
    """Depth, head and registered workers of the queues on one server (one pipeline), and those workers."""
    with conn.pipeline(transaction=False) as pipe:
        for info in infos:
            for name in lanes.queues(info.queue):
                pipe.llen(queue_key(name))
                pipe.lindex(queue_key(name), 0)
                pipe.smembers(rq_internals.workers_of_queue_key(name))
        raw = iter(junk.replies(pipe, "the RQ side's queues"))  # a key of another type reads as empty
    names: set[str] = set()
    for info in infos:
        for lane, name in zip(lanes.LANES, lanes.queues(info.queue), strict=True):
            depth, head, members = next(raw), next(raw), next(raw)
            lane_workers = sorted(text(m).removeprefix(WORKER_PREFIX) for m in members or ())
            info.lanes[lane] = {"queue": name, "depth": int(depth or 0), "head": text(head), "workers": lane_workers}
            names.update(lane_workers)
        info.depth = sum(lane["depth"] for lane in info.lanes.values())
        info.workers = sorted({w for lane in info.lanes.values() for w in lane["workers"]})
        info.head = next((lane["head"] for lane in info.lanes.values() if lane["head"]), "")
    return read_workers(conn, names)


def _worker_dict(w: WorkerInfo) -> dict:
    data = asdict(w)
    data["last_heartbeat"] = w.last_heartbeat.isoformat() if w.last_heartbeat else None
    data["dead_since"] = w.dead_since.isoformat() if w.dead_since else None
    data["failing_every_job"] = w.failing_every_job
    return data
