"""Redis as a whole refusing (an outage) or one command failing: told apart from the error alone.

A server-wide condition (out of memory under ``noeviction``, a read-only replica after a failover, a dataset still
loading, an ACL denial, no connection at all) says nothing about the jobs a command carried; the dispatch loop's
breaker (``dispatch.breaker``) and the writer's send pause on it instead of counting it against their envelopes.
"""

from __future__ import annotations

import re

import redis
from redis import exceptions as rx

# Error codes Redis answers for the whole server, whatever the command. Inside a
# Lua script (Redis 6.2) the code arrives wrapped: "Error running script ...: -OOM ...".
_SERVER_CODES = {
    "OOM": "Redis refuses writes (OOM: used memory > maxmemory)",
    "READONLY": "Redis refuses writes (read-only replica)",
    "MISCONF": "Redis refuses writes (MISCONF: it cannot persist)",
    "NOREPLICAS": "Redis refuses writes (NOREPLICAS: too few replicas)",
    "NOPERM": "Redis refuses the dispatcher's commands (NOPERM: ACL)",
    "NOAUTH": "Redis refuses the dispatcher's connection (NOAUTH)",
    "WRONGPASS": "Redis refuses the dispatcher's connection (WRONGPASS)",
    "LOADING": "Redis is loading its dataset",
    "BUSY": "Redis is busy running a script",
    "TRYAGAIN": "Redis asks to try again (TRYAGAIN)",
    "MASTERDOWN": "Redis has no master (MASTERDOWN)",
    "CLUSTERDOWN": "Redis cluster is down (CLUSTERDOWN)",
}
_CODE = re.compile(r"(?:^|[\s:]-|^-)(" + "|".join(_SERVER_CODES) + r")\b")

# redis-py strips the code from the message of the errors it knows; their type tells it instead.
_SERVER_TYPES: tuple[tuple[type[BaseException], str], ...] = (
    (rx.OutOfMemoryError, "OOM"),
    (rx.ReadOnlyError, "READONLY"),
    (rx.NoPermissionError, "NOPERM"),
    (rx.BusyLoadingError, "LOADING"),
    (rx.TryAgainError, "TRYAGAIN"),
    (rx.MasterDownError, "MASTERDOWN"),
    (rx.ClusterDownError, "CLUSTERDOWN"),
    (rx.AuthenticationError, "NOAUTH"),
    (rx.AuthorizationError, "NOPERM"),
)
UNREACHABLE = "Redis unreachable"


def outage_reason(exc: BaseException) -> str | None:
    """A short description if ``exc`` is a server-wide condition (an outage), else None (the envelope's own)."""
    for kind, code in _SERVER_TYPES:
        if isinstance(exc, kind):
            return _SERVER_CODES[code]
    if isinstance(exc, redis.ResponseError):  # ExecAbortError and script errors included
        match = _CODE.search(str(exc))
        return _SERVER_CODES[match.group(1)] if match else None
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError)):
        return UNREACHABLE
    return None
