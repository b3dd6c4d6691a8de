"""The order in which workers will take the jobs waiting in RQ: the job list's RQ stage sorts by it.

A domain queue has lanes (``dispatch_app.domains.lanes``) and a worker takes every job of the ``new`` lane before one of
the ``recovery`` lane (``rq.worker.fetch``). So a job's place in line is its index in the new lane, and for a job
in the recovery lane, the new lane's whole depth plus its index there: #1 is taken next. First-dispatch order
in PostgreSQL only approximates this (a re-dispatch, an operator's retry, a lane), hence reading Redis.

Each lane is read from its head up to ``RQ_LIST_READ_MAX`` ids (one pipeline per server: an LRANGE and an LLEN per
lane), so a page costs the same whatever the backlog; jobs further back, taken by a worker but not started, or
on a server that cannot be read have no place and sort after the rest, by dispatch time. Redis trouble is
returned, never raised: the list still renders.
"""

from __future__ import annotations

import redis

import dispatch_app.domains.lanes as lanes
import dispatch_app.rq.junk as junk
import dispatch_app.rq.servers as redis_servers
import dispatch_app.rq.state.queues as rqside
from dispatch_app.config.tuning import RQ_LIST_READ_MAX
from dispatch_app.domains import all_domains
from dispatch_app.rq.ids import parse_rq_job_id


def key(job_id: int, attempt: int) -> str:
    """The key of one attempt in ``positions`` (what the SQL builds from a job row: ``<id>-<attempt>``)."""
    return f"{job_id}-{attempt}"


def positions(domains=None, *, conn: redis.Redis | None = None) -> tuple[dict[str, int], list[str]]:
    """({"<job>-<attempt>": place in line across its queue's lanes, 1 = next}, errors per unreadable server)."""
    queues = sorted({d.queue for d in all_domains() if domains is None or d.key in domains})
    groups = {"": queues} if conn is not None else redis_servers.by_server(queues)
    out: dict[str, int] = {}
    errors: list[str] = []
    for on_server in groups.values():
        try:
            out.update(_read(conn if conn is not None else rqside.redis_conn(on_server[0]), on_server))
        except redis.RedisError as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    return out, errors


def _read(conn: redis.Redis, queues: list[str]) -> dict[str, int]:
    with conn.pipeline(transaction=False) as pipe:
        for queue in queues:
            for name in lanes.queues(queue):
                pipe.llen(rqside.queue_key(name))
                pipe.lrange(rqside.queue_key(name), 0, RQ_LIST_READ_MAX - 1)
        raw = iter(junk.replies(pipe, "the job list's queue order"))  # a key of another type reads as empty
    out: dict[str, int] = {}
    for queue in queues:
        ahead = 0  # jobs of the earlier lanes, all taken first
        for _ in lanes.queues(queue):
            depth, ids = int(next(raw) or 0), next(raw) or ()
            for index, rq_id in enumerate(ids):
                parsed = parse_rq_job_id(rqside.text(rq_id))  # anyone may push any bytes: never a strict decode
                if parsed:
                    out.setdefault(key(*parsed), ahead + index + 1)
            ahead += depth
    return out
