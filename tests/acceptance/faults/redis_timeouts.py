"""Redis timeouts that fit a scenario's short lease.

``rundispatcher`` refuses a lease that does not outlast the worst case of a
batch's sends (``conf.check_lease``: connect + socket timeouts, per wave of
SEND_CONCURRENCY). Scenarios that shorten the lease to see it run out give
their dispatchers Redis timeouts to match, in the URL (which wins over
REDIS_SOCKET_TIMEOUT) and in the environment.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode


def short_redis_timeouts(url: str, seconds: float) -> dict[str, str]:
    """Child-process environment whose Redis calls time out after ``seconds``."""
    # Split by hand: urlunsplit drops the "//" of a unix:// URL without a host.
    base, _, query = url.partition("?")
    params = dict(parse_qsl(query))
    params.update(socket_timeout=str(seconds), socket_connect_timeout=str(seconds))
    return {"REDIS_URL": f"{base}?{urlencode(params)}", "REDIS_SOCKET_TIMEOUT": str(seconds)}
