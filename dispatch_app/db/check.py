"""When a hot loop health-checks its PostgreSQL connection: after an error, or after it sat idle a while.

Django's close_old_connections() costs a ``SELECT 1`` (CONN_HEALTH_CHECKS) every
time it is called. A worker calls it per job and the dispatch loop per drain: one
round trip more on the path of every job. A connection used a moment ago is
reused without it; one idle for longer than the interval, or one that saw an
error, is checked (and replaced if dead) before its next use.
"""

from __future__ import annotations

import time

from django.db import close_old_connections, connection


class ConnectionCheck:
    def __init__(self, interval: float | None = None):
        self.interval = interval  # None: DISPATCH["WORKER_DB_CHECK_INTERVAL"], read at the first use
        self.checked_at = float("-inf")

    def before(self) -> None:
        if self.interval is None:
            from dispatch_app.config.settings import dispatch_settings

            self.interval = dispatch_settings().WORKER_DB_CHECK_INTERVAL
        now = time.monotonic()
        if connection.errors_occurred or now - self.checked_at >= self.interval:
            close_old_connections()
        self.checked_at = now

    def after(self) -> None:
        if connection.errors_occurred:
            close_old_connections()  # drops the connection if it is no longer usable
        self.checked_at = time.monotonic()


# The worker process's check: ``execution.execute`` and ``execution.start_protocol.begin`` (the start made ahead
# of a job) share it, so a start made ahead counts as the connection's use before the job's own start.
worker_check = ConnectionCheck()
