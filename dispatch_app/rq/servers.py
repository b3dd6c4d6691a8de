"""Which Redis server each queue lives on: one server per group of queues.

RQ has no Redis Cluster support (its Lua scripts touch several keys without
hash tags), so RQ scales Redis by giving groups of queues their own server.
``RQ_QUEUES`` (django-rq's setting) names each queue's connection; everything
here reads it, so the dispatcher, recovery, the workers and the dashboard agree
on where a domain's queue is. A server is identified by its URL (database index
included: a worker can only listen on one).
"""

from __future__ import annotations

import os
from functools import cache
from urllib.parse import quote, urlsplit, urlunsplit

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

import dispatch_app.domains.lanes as lanes


def with_timeouts(url: str, timeout: float) -> str:
    """Every Redis call of ours is bounded: redis-py reads these from the URL (unless it sets them)."""
    sep = "&" if "?" in url else "?"
    extra = [
        f"{key}={value}"
        for key, value in (
            ("socket_timeout", timeout),
            ("socket_connect_timeout", timeout),
            ("health_check_interval", 30),
        )
        if f"{key}=" not in url
    ]
    return url + (sep + "&".join(extra) if extra else "")


def ensure_redis_url() -> str:
    """Bounded Redis URLs and ``settings.REDIS_URL`` (the server of anything not on a queue's own), at start-up.

    This project's settings set REDIS_URL from the environment with timeouts in it; a project of its own usually
    configures only django-rq's ``RQ_QUEUES``. So: a ``"default"`` entry whose URL has no ``socket_timeout`` gets
    ``REDIS_SOCKET_TIMEOUT`` (default 5 s) added -- every Redis call of the dispatcher must be bounded to keep its
    leases honest (``conf.check_lease``) -- and an unset REDIS_URL becomes that entry's server.
    """
    timeout = getattr(settings, "REDIS_SOCKET_TIMEOUT", 5.0)
    entry = (getattr(settings, "RQ_QUEUES", None) or {}).get("default")
    if entry and entry.get("URL") and "socket_timeout=" not in entry["URL"]:
        entry["URL"] = with_timeouts(entry["URL"], timeout)
    url = getattr(settings, "REDIS_URL", None)
    if url:
        return url
    if not entry:
        raise ImproperlyConfigured(
            'RQ_QUEUES["default"] (django-rq) must name the Redis server of the dispatch queues, '
            'e.g. {"default": {"URL": "redis://localhost:6379/0", "SERIALIZER": "rq.serializers.JSONSerializer"}}'
        )
    url = f"redis://localhost:6379/{entry.get('DB', 0)}"  # django-rq's own defaults for an entry without a server
    if entry.get("URL") or entry.get("HOST") or entry.get("UNIX_SOCKET_PATH"):
        url = queue_url("default")
    settings.REDIS_URL = with_timeouts(url, timeout)
    return settings.REDIS_URL


def add_queue_entries(queues) -> list[str]:
    """Give each declared queue without an ``RQ_QUEUES`` entry one; returns the queues added.

    The entry copies ``RQ_QUEUES["default"]`` (its server, timeout, serializer); the
    environment variable ``REDIS_URL_<QUEUE>`` (upper-case) puts the queue on its own
    server instead. An entry the project wrote itself is left as it is. The dict is
    updated in place: django-rq reads the same object.
    """
    configured = getattr(settings, "RQ_QUEUES", None)
    if configured is None:
        configured = settings.RQ_QUEUES = {}
    base = configured.get("default") or {"URL": settings.REDIS_URL}
    added = []
    for queue in queues:
        if queue in configured:
            continue
        entry = dict(base)
        own = os.environ.get(f"REDIS_URL_{queue.upper()}")
        if own:
            for key in ("HOST", "PORT", "DB", "PASSWORD", "UNIX_SOCKET_PATH"):
                entry.pop(key, None)
            entry["URL"] = with_timeouts(own, getattr(settings, "REDIS_SOCKET_TIMEOUT", 5.0))
        configured[queue] = entry
        added.append(queue)
    # A queue's lanes live where the queue lives (dispatch_app.domains.lanes): the same entry, the same server.
    for queue in queues:
        for lane in lanes.queues(queue)[1:]:
            if lane not in configured:
                configured[lane] = dict(configured[queue])
                added.append(lane)
    return added


def queue_url(queue: str) -> str:
    """The Redis URL of a queue's ``RQ_QUEUES`` entry (URL, or UNIX_SOCKET_PATH / HOST+PORT+DB); REDIS_URL if none."""
    configured = getattr(settings, "RQ_QUEUES", {})
    entry = configured.get(queue) or configured.get(lanes.split(queue)[0]) or {}
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
    """The Redis connection of a domain's queue (a key no longer declared: a queue of that name)."""
    from dispatch_app.domains import UnknownDomain, get_domain

    try:
        return queue_connection(get_domain(domain).queue)
    except UnknownDomain:
        return queue_connection(domain)


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
