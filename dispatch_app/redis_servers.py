"""Which Redis server each queue lives on: one server per group of queues.

RQ has no Redis Cluster support (its Lua scripts touch several keys without
hash tags), so RQ scales Redis by giving groups of queues their own server.
``RQ_QUEUES`` (django-rq's setting) names each queue's connection; everything
here reads it, so the dispatcher, recovery, the workers and the dashboard agree
on where a domain's queue is. A server is identified by its URL (database index
included: a worker can only listen on one).
"""

from __future__ import annotations

from functools import cache
from urllib.parse import quote, urlsplit, urlunsplit

import redis
from django.conf import settings


def queue_url(queue: str) -> str:
    """The Redis URL of a queue's ``RQ_QUEUES`` entry (URL, or UNIX_SOCKET_PATH / HOST+PORT+DB); REDIS_URL if none."""
    entry = getattr(settings, "RQ_QUEUES", {}).get(queue) or {}
    if entry.get("URL"):
        return entry["URL"]
    db = entry.get("DB", 0)
    password = f":{quote(str(entry['PASSWORD']), safe='')}@" if entry.get("PASSWORD") else ""
    if entry.get("UNIX_SOCKET_PATH"):
        return f"unix://{password}{entry['UNIX_SOCKET_PATH']}?db={db}"
    if entry.get("HOST"):
        return f"redis://{password}{entry['HOST']}:{entry.get('PORT', 6379)}/{db}"
    return settings.REDIS_URL


@cache
def connection(url: str) -> redis.Redis:
    """One connection pool per server per process (redis-py pools are thread-safe)."""
    return redis.Redis.from_url(url)


def queue_connection(queue: str) -> redis.Redis:
    return connection(queue_url(queue))


def domain_connection(domain: str) -> redis.Redis:
    from dispatch_app.domains import REGISTRY

    known = REGISTRY.get(domain)
    return queue_connection(known.queue if known is not None else domain)


def by_server(queues) -> dict[str, list[str]]:
    """Queues grouped by the server they live on, in first-seen order."""
    groups: dict[str, list[str]] = {}
    for queue in queues:
        groups.setdefault(queue_url(queue), []).append(queue)
    return groups


def label(url: str) -> str:
    """A server's name for logs and pages: the URL without its password and query (timeouts)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    path = parts.path
    if parts.scheme == "unix":
        db = [q for q in parts.query.split("&") if q.startswith("db=")]
        return f"unix://{path}" + (f"?{db[0]}" if db else "")
    return urlunsplit((parts.scheme, netloc, path, "", ""))
