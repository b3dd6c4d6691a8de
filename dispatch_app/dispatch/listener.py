"""LISTEN for new envelopes on a dedicated autocommit psycopg connection.

Not a Django connection: it must never sit inside a transaction (a full NOTIFY
queue would fail business commits) and must reach PostgreSQL directly, not
through PgBouncer transaction pooling. Order: LISTEN first, then request a scan,
so nothing committed between the two is missed. Notifications sent while we are
disconnected are lost, hence a catch-up scan after every (re)connect.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
from django.db import connection as django_connection

from dispatch_app.conf import NOTIFY_CHANNEL, DispatchSettings
from dispatch_app.runtime.wake import CATCH_UP, NOTIFY, Wake

log = logging.getLogger("dispatch_app.listener")

# How often the wait returns to check the stop signal.
_STOP_CHECK_SECONDS = 0.2


def listener_conninfo() -> dict:
    params = dict(django_connection.get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.setdefault("connect_timeout", 10)
    return params


class Listener:
    name = "listener"

    def __init__(
        self,
        conf: DispatchSettings,
        wake: Wake,
        stop: threading.Event,
        *,
        conninfo: dict | None = None,
        observer=None,
        clock=time.monotonic,
    ):
        self.conf = conf
        self.wake = wake
        self.stop = stop
        self.conninfo = conninfo
        self.observer = observer
        self.clock = clock
        self.connected = threading.Event()
        self.notifications = 0
        self.reconnects = 0
        self.pid: int | None = None  # the backend's pid, for fault tests
        self.thread = threading.Thread(target=self.run, name="loop-listener", daemon=True)
        self.errors = 0

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def run(self) -> None:
        backoff = 0.1
        first = True
        while not self.stop.is_set():
            try:
                self._listen_once(reconnect=not first)
                backoff = 0.1
            except (psycopg.Error, OSError) as exc:
                self.errors += 1
                self.connected.clear()
                log.warning(
                    "listener connection lost (%s); reconnecting in %.1fs",
                    exc,
                    backoff,
                    extra={"action": "listener_reconnect", "domain": "dispatch"},
                )
                if self.observer is not None:
                    self.observer.listener_reconnect()
                self.stop.wait(backoff)
                backoff = min(backoff * 2, self.conf.RECONNECT_BACKOFF_MAX)
            first = False
        self.connected.clear()

    def _listen_once(self, *, reconnect: bool) -> None:
        conninfo = self.conninfo if self.conninfo is not None else listener_conninfo()
        with psycopg.connect(autocommit=True, **conninfo) as conn:
            conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            self.pid = conn.info.backend_pid
            if reconnect:
                self.reconnects += 1
            self.connected.set()
            # After LISTEN: whatever committed before it is found by this scan.
            self.wake.set(CATCH_UP)
            idle_since = self.clock()
            while not self.stop.is_set():
                got = 0
                # stop_after=1: wake the dispatcher at the first notification, not at the timeout.
                for _ in conn.notifies(timeout=_STOP_CHECK_SECONDS, stop_after=1):
                    got += 1
                if got:
                    self.notifications += got
                    self.wake.set(NOTIFY)
                    idle_since = self.clock()
                elif self.clock() - idle_since >= self.conf.LISTEN_TIMEOUT:
                    # An idle connection can die silently (NAT, failover); a ping finds out.
                    conn.execute("SELECT 1")
                    idle_since = self.clock()
