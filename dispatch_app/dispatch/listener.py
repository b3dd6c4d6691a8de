"""LISTEN for new envelopes on a dedicated autocommit psycopg connection.

Not a Django connection: it must never sit inside a transaction (a full NOTIFY
queue would fail business commits) and must reach PostgreSQL directly, not
through PgBouncer transaction pooling. Order: LISTEN first, then request a scan,
so nothing committed between the two is missed. Notifications sent while we are
disconnected are lost, hence a catch-up scan after every (re)connect.

A dead network must not leave it listening to nothing: TCP keepalives and
``tcp_user_timeout`` (LISTEN_DEAD_AFTER) make the kernel give up on a silent
peer, and the idle ping has its own deadline, so a ping that does not return
ends in a reconnect; while one is overdue ``health_problem()`` says so for the
heartbeat. The listener also installs the dispatcher's arming
(dispatch_app.dispatch.arming): announcements are asked for only while it listens.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time

import psycopg
from django.db import connection as django_connection
from psycopg import pq

import dispatch_app.dispatch.announced as announced
from dispatch_app.config.settings import NOTIFY_CHANNEL, DispatchSettings
from dispatch_app.dispatch.arming import Arming
from dispatch_app.dispatch.wake import CATCH_UP, NOTIFY, Wake

log = logging.getLogger("dispatch_app.listener")

# How often the wait returns to check the stop signal.
_STOP_CHECK_SECONDS = 0.2


def listener_conninfo() -> dict:
    params = dict(django_connection.get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.setdefault("connect_timeout", 10)
    return params


class ListenerPingTimeout(psycopg.OperationalError):
    """The idle ping did not return within LISTEN_DEAD_AFTER: the connection is treated as dead."""


def keepalive_params(dead_after: float) -> dict:
    """libpq options so the kernel notices a silent peer within ``dead_after`` seconds.

    Keepalive probes cover an idle connection (nothing in flight: ~2/3 of the
    bound), ``tcp_user_timeout`` a request nobody acknowledges. Ignored on unix sockets.
    """
    idle = max(1, int(dead_after / 3))
    interval = max(1, int(dead_after / 9))
    return {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": interval,
        "keepalives_count": 3,
        "tcp_user_timeout": int(dead_after * 1000),
    }


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
        self.ping_started: float | None = None  # clock() when the ping in flight was sent
        self.conn = None
        self.pings = 0
        self.bad_payloads = 0
        # Conditional NOTIFY: the dispatcher sharing this wake arms only while we listen.
        if wake.arming is None:
            wake.arming = Arming(
                conf, wake, listening=self.connected, stop=stop, process=f"{socket.gethostname()}:{os.getpid()}"
            )

    def health_problem(self) -> str | None:
        """Why the listener cannot be trusted to hear NOTIFY now, or None (read by the heartbeat)."""
        if not self.connected.is_set():
            return "not connected"
        started = self.ping_started
        if started is not None and self.clock() - started > self.conf.LISTEN_TIMEOUT:
            return f"its ping has not returned within LISTEN_TIMEOUT ({self.conf.LISTEN_TIMEOUT:g}s)"
        return None

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
            except _Stopped:
                break
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
        conninfo = {**keepalive_params(self.conf.LISTEN_DEAD_AFTER), **conninfo}
        with psycopg.connect(autocommit=True, **conninfo) as conn:
            conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            self.pid = conn.info.backend_pid
            self.conn = conn  # for fault tests: the socket's options
            if reconnect:
                self.reconnects += 1
            self.connected.set()
            # After LISTEN: whatever committed before it is found by this scan.
            self.wake.set(CATCH_UP)
            idle_since = self.clock()
            while not self.stop.is_set():
                got = named = 0
                # stop_after=1: wake the dispatcher at the first notification, not at the timeout.
                for note in conn.notifies(timeout=_STOP_CHECK_SECONDS, stop_after=1):
                    got += 1
                    named += self._hand_over(note.payload)
                if got:
                    self.notifications += got
                    self.wake.set(NOTIFY, named=named == got)
                    idle_since = self.clock()
                elif self.clock() - idle_since >= self.conf.LISTEN_TIMEOUT:
                    # An idle connection can die silently (NAT, failover); a ping finds out.
                    self.ping(conn)
                    idle_since = self.clock()

    def _hand_over(self, payload: str) -> bool:
        """The envelopes a writer named (dispatch.announced), for the loop to send before it claims them.

        True when the payload named its envelopes and all of them were handed over: no claim is needed for it.
        """
        try:
            envelopes = announced.parse(payload)
        except announced.BadAnnouncement as exc:
            # Nothing is lost: the claim that follows the wake finds the envelopes in the table.
            self.bad_payloads += 1
            log.warning("%s", exc, extra={"action": "listener_bad_payload", "domain": "dispatch"})
            return False
        if not envelopes:
            return False
        hand_over = self.wake.announced
        # Past its bound the oldest are dropped: then only a claim finds them.
        fits = hand_over.maxlen is None or len(hand_over) + len(envelopes) <= hand_over.maxlen
        hand_over.extend(envelopes)
        return fits

    def ping(self, conn) -> None:
        """``SELECT 1`` with a deadline: psycopg's own wait has none, and a dead peer never answers."""
        self.ping_started = self.clock()
        try:
            pgconn = conn.pgconn
            pgconn.send_query(b"SELECT 1")
            deadline = time.monotonic() + self.conf.LISTEN_DEAD_AFTER
            while pgconn.flush():
                self._wait_socket(conn, deadline, write=True)
            while True:
                pgconn.consume_input()
                if not pgconn.is_busy():
                    break
                self._wait_socket(conn, deadline)
            while (result := pgconn.get_result()) is not None:
                if result.status != pq.ExecStatus.TUPLES_OK:
                    raise psycopg.OperationalError(f"ping failed: {result.error_message.decode(errors='replace')}")
            self.pings += 1
        finally:
            self.ping_started = None

    def _wait_socket(self, conn, deadline: float, *, write: bool = False) -> None:
        left = deadline - time.monotonic()
        if left <= 0 or self.stop.is_set():
            # A query is still in flight: the connection cannot be reused, only dropped.
            conn.close()
            if self.stop.is_set():
                raise _Stopped
            raise ListenerPingTimeout(f"no answer to the ping within {self.conf.LISTEN_DEAD_AFTER:g}s")
        # Short steps so a stop is noticed; the deadline is checked on each.
        step = min(left, _STOP_CHECK_SECONDS)
        fd = conn.pgconn.socket
        if write:
            select.select([], [fd], [], step)
        else:
            select.select([fd], [], [], step)


class _Stopped(Exception):
    """Told to stop while a ping was in flight."""
