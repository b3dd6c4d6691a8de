"""The listener notices a dead network: kernel keepalives on its socket, a ping with a deadline, the heartbeat told.

The dead network is a TCP proxy between the listener and PostgreSQL that stops
forwarding: the kernel still acknowledges, so only the listener's own ping
deadline can find out, which is what a silent failure of a middlebox looks like.
"""

from __future__ import annotations

import os
import select
import socket
import threading

import pytest
from django.db import connection

from dispatch_app.config.settings import dispatch_settings
from dispatch_app.dispatch.listener import Listener, keepalive_params, listener_conninfo
from dispatch_app.dispatch.wake import Wake
from dispatch_app.housekeeping.heartbeat import HeartbeatLoop, HeartbeatTracker
from dispatch_app.models import LoopHeartbeat
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db


class Proxy:
    """Forwards TCP to PostgreSQL until ``cut`` is set; then holds every byte (nothing is answered)."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.cut = threading.Event()
        self.parked: set[int] = set()  # pumps that have seen the cut and forward nothing more
        self.closed = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed.is_set():
            try:
                ready, _, _ = select.select([self.server], [], [], 0.1)
                if not ready:
                    continue
                client, _ = self.server.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.target, timeout=10)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst):
        try:
            while not self.closed.is_set():
                if self.cut.is_set():
                    self.parked.add(threading.get_ident())
                    self.closed.wait(0.05)  # holds the bytes: the peer's kernel has acknowledged them
                    continue
                self.parked.discard(threading.get_ident())
                ready, _, _ = select.select([src], [], [], 0.05)
                if ready:
                    data = src.recv(65536)
                    if not data:
                        break
                    dst.sendall(data)
        except OSError:
            pass

    def close(self):
        self.closed.set()
        for s in [self.server, *self.sockets]:
            try:
                s.close()
            except OSError:
                pass


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def tcp_conninfo():
    info = dict(listener_conninfo())
    host = info.get("host") or "127.0.0.1"
    if host.startswith("/"):
        pytest.skip("the database is on a unix socket: no TCP options to check")
    return info


def test_the_listen_socket_has_keepalives_and_a_user_timeout(tcp_conninfo):
    conf = dispatch_settings(LISTEN_DEAD_AFTER=9.0)
    stop = threading.Event()
    listener = Listener(conf, Wake(), stop)
    listener.start()
    try:
        assert listener.connected.wait(10)
        sock = socket.socket(fileno=os.dup(listener.conn.pgconn.socket))
        try:
            expected = keepalive_params(9.0)
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == expected["keepalives_idle"] == 3
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == expected["keepalives_interval"] == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 9000
        finally:
            sock.close()
    finally:
        stop.set()
        assert listener.join(10)


def test_a_ping_that_never_returns_makes_it_unhealthy_then_it_reconnects(tcp_conninfo):
    proxy = Proxy(tcp_conninfo.get("host") or "127.0.0.1", int(tcp_conninfo.get("port") or 5432))
    conf = dispatch_settings(LISTEN_TIMEOUT=5.0, LISTEN_DEAD_AFTER=1.0)
    clock = Clock()
    stop = threading.Event()
    listener = Listener(conf, Wake(), stop, conninfo=dict(tcp_conninfo, host="127.0.0.1", port=proxy.port), clock=clock)
    tracker = HeartbeatTracker()
    beat = HeartbeatLoop(conf, tracker, stop, listener=listener)
    listener.start()
    try:
        assert listener.connected.wait(10)
        assert listener.health_problem() is None
        beat.run_once()
        proxy.cut.set()
        wait_until(lambda: len(proxy.parked) == 2, 10, message="both directions cut")
        clock.now += 6  # idle past LISTEN_TIMEOUT: the next turn of the listener pings
        wait_until(lambda: listener.ping_started is not None, 10, message="the ping to be sent")
        clock.now += 6  # ...and it has not returned within LISTEN_TIMEOUT
        assert listener.health_problem() == "its ping has not returned within LISTEN_TIMEOUT (5s)"
        beat.run_once()
        row = LoopHeartbeat.objects.get(process_id=beat.process_id, loop="listener")
        assert "listener unhealthy: its ping has not returned" in row.last_error
        assert row.errors == 1
        beat.run_once()  # still unhealthy: reported once, not once per heartbeat
        assert LoopHeartbeat.objects.get(pk=row.pk).errors == 1
        # Its own deadline (LISTEN_DEAD_AFTER, real time) ends the ping: the connection is dropped and redone.
        wait_until(lambda: listener.errors >= 1, 30, message="the ping's deadline")
        assert listener.ping_started is None
        proxy.cut.clear()
        wait_until(lambda: listener.reconnects >= 1 and listener.connected.is_set(), 30, message="the reconnect")
        assert listener.health_problem() is None
    finally:
        stop.set()
        assert listener.join(10)
        proxy.close()
        connection.close()
