"""Which deployment this process belongs to, and the one rule about sharing Redis: one deployment per database.

RQ's keys are global to a Redis database (``rq:queue:<name>``, ``rq:job:<id>``): two deployments on one database
(staging and production on one Redis, two projects on a shared development server, a database recreated under a
Redis that kept its keys) take each other's jobs. Measured before this module: deployment A's jobs were taken by
B's worker, which ran B's rows of the same numbers; A's jobs never ran, and nothing was logged.

So every RQ job id and every key of this project's own carries the deployment's **namespace**
(``settings.PRODUCTFLOW_NAMESPACE``; unset, derived from the database: 8 hex digits of a hash of PostgreSQL's
system identifier, the database's name and its oid, so a copy on another server or a recreated database is
another deployment), and each process that writes to Redis (``rundispatcher``, ``runworkers``, ``recover``)
registers it in the database's ``REGISTRY`` hash at start-up and refuses to start, naming both, when another
deployment was seen there within ``LIVE_SECONDS``. RQ's queue keys are named by the queue, not the namespace:
that is why a second live deployment is refused rather than run beside the first.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger("dispatch_app.rq.deployment")

SETTING = "PRODUCTFLOW_NAMESPACE"
NAMESPACE_RE = re.compile(r"[A-Za-z0-9_]{1,32}")
REGISTRY = "productflow:deployments"
# A deployment's processes refresh its entry this often; one not refreshed for LIVE_SECONDS is gone (its
# processes stopped), and entries older than FORGET_SECONDS are dropped.
REFRESH_SECONDS = 20.0
LIVE_SECONDS = 75
FORGET_SECONDS = 7 * 86_400
# The check and the refresh are one small script: a server that has not answered in this long is not checked now
# (at start-up: checked by the heartbeat later), rather than holding a process's start or its heartbeat.
CHECK_TIMEOUT = 2.0
DESCRIPTION_MAX = 300

IDENTITY_SQL = """
SELECT (SELECT system_identifier FROM pg_control_system())::text, current_database(),
       (SELECT oid FROM pg_database WHERE datname = current_database())::text
"""

# Check and register in one step, on Redis's clock: two deployments starting at once cannot both pass.
# KEYS[1] the registry; ARGV: namespace, description, live seconds, forget seconds, and when to write ours: "1"
# when no other is live (a start), "2" always (a live process's refresh). Returns the other live entries, flat
# (namespace, seconds since seen, description, ...).
# A registry of the wrong type, or an entry that is not "<seconds> <text>", is junk anyone could have written:
# it is dropped, never a reason to fail.
CLAIM_SCRIPT = """
if redis.call("TYPE", KEYS[1])["ok"] ~= "hash" then redis.call("DEL", KEYS[1]) end
local now = tonumber(redis.call("TIME")[1])
local others = {}
local entries = redis.call("HGETALL", KEYS[1])
for i = 1, #entries, 2 do
    local name, value = entries[i], entries[i + 1]
    if name ~= ARGV[1] then
        local seen = tonumber(string.match(value, "^(%d+) "))
        if seen == nil or now - seen > tonumber(ARGV[4]) then
            redis.call("HDEL", KEYS[1], name)
        elseif now - seen <= tonumber(ARGV[3]) then
            table.insert(others, name)
            table.insert(others, now - seen)
            table.insert(others, string.sub(value, string.len(seen) + 2))
        end
    end
end
if ARGV[5] == "2" or (ARGV[5] == "1" and #others == 0) then
    redis.call("HSET", KEYS[1], ARGV[1], now .. " " .. ARGV[2])
end
return others
"""


@dataclass(frozen=True)
class Identity:
    namespace: str
    description: str  # which database, for messages: "database 'x' on host:port (system 7716...)"


@dataclass(frozen=True)
class Other:
    namespace: str
    description: str
    seen_seconds_ago: int


class SharedRedis(RuntimeError):
    """Another live deployment uses this Redis database."""


_cache: dict[tuple, Identity] = {}


def _db_key(connection) -> tuple:
    sd = connection.settings_dict
    return (sd.get("NAME"), sd.get("HOST"), sd.get("PORT"), (sd.get("OPTIONS") or {}).get("host"))


def identity(connection=None) -> Identity:
    """This process's deployment: the setting, else derived from the database it is connected to (cached)."""
    from django.db import connection as default

    connection = connection or default
    key = _db_key(connection)
    found = _cache.get(key)
    if found is None:
        found = _cache[key] = _read_identity(connection)
    return found


def namespace() -> str:
    return identity().namespace


def _read_identity(connection) -> Identity:
    configured = getattr(settings, SETTING, None) or ""
    sd = connection.settings_dict
    where = f"{sd.get('HOST') or (sd.get('OPTIONS') or {}).get('host') or 'local socket'}:{sd.get('PORT') or 5432}"
    if configured:
        if not NAMESPACE_RE.fullmatch(configured):
            raise ImproperlyConfigured(
                f"{SETTING}={configured[:40]!r} is not a namespace: 1 to 32 letters, digits or underscores"
            )
        return Identity(configured, f"{SETTING} {configured!r}, database {sd.get('NAME')!r} on {where}")
    with connection.cursor() as cursor:
        cursor.execute(IDENTITY_SQL)
        system, database, oid = cursor.fetchone()
    return Identity(derived(system, database, oid), f"database {database!r} on {where} (PostgreSQL system {system})")


def derived(system: str, database: str, oid: str) -> str:
    """The namespace of a database without the setting: from IDENTITY_SQL's row."""
    return hashlib.sha256(f"{system}:{database}:{oid}".encode()).hexdigest()[:8]


def validate_setting() -> str | None:
    """Why the namespace setting is unusable, or None (a system check; needs no database)."""
    configured = getattr(settings, SETTING, None) or ""
    if configured and not NAMESPACE_RE.fullmatch(configured):
        return f"{SETTING}={configured[:40]!r} is not a namespace: 1 to 32 letters, digits or underscores"
    return None


def _text(value, limit: int) -> str:
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return text[:limit]


def claim(conn: redis.Redis, me: Identity, *, mode: str = "1") -> list[Other]:
    """The other deployments live on this server; ours registered per ``mode`` (CLAIM_SCRIPT's last argument)."""
    reply = conn.eval(
        CLAIM_SCRIPT,
        1,
        REGISTRY,
        me.namespace,
        me.description[:DESCRIPTION_MAX],
        LIVE_SECONDS,
        FORGET_SECONDS,
        mode,
    )
    if not isinstance(reply, list):  # a reply this script never gives
        return []
    return [
        Other(_text(name, 40), _text(description, DESCRIPTION_MAX) or "(no description)", int(age))
        for name, age, description in zip(reply[::3], reply[1::3], reply[2::3], strict=False)
        if isinstance(age, int)
    ]


class _Registered:
    """What this process registered at its start, refreshed by its heartbeat (``keep_alive``)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.me: Identity | None = None
        self.servers: dict[str, redis.Redis] = {}
        self.last = float("-inf")


_registered = _Registered()


def refuse_if_shared(servers: dict[str, redis.Redis], me: Identity | None = None, *, register=True) -> list[str]:
    """At a process's start: register on every server its queues live on, or raise ``SharedRedis`` naming both.

    Returns the labels of the servers that could not be reached (checked by ``keep_alive`` once they answer).
    A registered process keeps its entries fresh with ``keep_alive`` from its heartbeat. ``register=False`` (a
    dry run) looks and refuses alike, and writes nothing.
    """
    me = me or identity()
    bounded = {label: _bounded(conn) for label, conn in servers.items()}
    unreached = []
    for label, conn in bounded.items():
        try:
            others = claim(conn, me, mode="1" if register else "0")
        except (redis.ConnectionError, redis.TimeoutError):
            unreached.append(label)
            continue
        if others:
            raise SharedRedis(_message(label, me, others))
    if not register:
        return unreached
    with _registered.lock:
        _registered.me, _registered.servers, _registered.last = me, bounded, time.monotonic()
    return unreached


def _bounded(conn: redis.Redis) -> redis.Redis:
    """A client of the same server whose calls give up after CHECK_TIMEOUT, without retries."""
    pool = conn.connection_pool
    kwargs = dict(pool.connection_kwargs)
    timeout = min(CHECK_TIMEOUT, kwargs.get("socket_timeout") or CHECK_TIMEOUT)
    kwargs.update(socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))


def keep_alive(clock=time.monotonic) -> None:
    """Refresh this process's entries if ``REFRESH_SECONDS`` passed (a heartbeat calls it); never raises."""
    with _registered.lock:
        me, servers = _registered.me, _registered.servers
        if me is None or clock() - _registered.last < REFRESH_SECONDS:
            return
        _registered.last = clock()
    for label, conn in servers.items():
        refresh(conn, me, label)


def _message(label: str, me: Identity, others: list[Other]) -> str:
    named = "; ".join(f"{o.namespace} ({o.description}, seen {o.seen_seconds_ago} s ago)" for o in others)
    return (
        f"Redis {label} is in use by another deployment: {named}. This deployment is {me.namespace} "
        f"({me.description}). Two deployments on one Redis database take each other's jobs (RQ's queue keys are "
        f"global to it): give each its own Redis database (REDIS_URL .../<db>), or, if the other one is this "
        f"deployment under another name, set {SETTING} to the same value in both. An entry is forgotten "
        f"{LIVE_SECONDS} s after its deployment's last process stopped."
    )


def refresh(conn: redis.Redis, me: Identity, label: str = "") -> None:
    """A live process's periodic refresh of its entry. Never raises: another live deployment showing up (one that
    started while this one could not be seen) is logged, and Redis trouble is the caller's heartbeat's to see."""
    try:
        others = claim(conn, me, mode="2")
    except redis.RedisError as exc:
        log.warning(
            "deployment entry not refreshed on %s: %s: %s",
            label or "Redis",
            type(exc).__name__,
            str(exc)[:200],
            extra={"action": "deployment_refresh_failed", "domain": "deployment"},
        )
        return
    if others:
        log.error(
            "%s",
            _message(label or "Redis", me, others),
            extra={"action": "deployment_shares_redis", "domain": "deployment"},
        )


def _forget(setting, **kwargs) -> None:
    if setting in (SETTING, "DATABASES"):
        _cache.clear()


setting_changed.connect(_forget, dispatch_uid="dispatch_app.rq.deployment")
