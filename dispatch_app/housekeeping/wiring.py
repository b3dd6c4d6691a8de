"""Adds the operations side to a dispatcher process: observer, heartbeat, retention, metrics endpoint.

Used by ``runtime.assembly.build``: make ``Ops`` first (its observer goes to the
Supervisor), then ``attach`` once the loops are known.
"""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError, connection

from dispatch_app.config.settings import DispatchSettings
from dispatch_app.housekeeping.heartbeat import HeartbeatLoop, HeartbeatTracker
from dispatch_app.housekeeping.retention import RetentionLoop

log = logging.getLogger("dispatch_app.ops")


class FanOut:
    """One observer that forwards each hook to several, skipping those that lack it."""

    def __init__(self, *observers):
        self.observers = [o for o in observers if o is not None]

    def _call(self, hook: str, *args) -> None:
        for observer in self.observers:
            method = getattr(observer, hook, None)
            if method is not None:
                method(*args)

    def drained(self, result) -> None:
        self._call("drained", result)

    def listener_reconnect(self) -> None:
        self._call("listener_reconnect")

    def loop_tick(self, name: str) -> None:
        self._call("loop_tick", name)

    def loop_error(self, name: str, exc: BaseException) -> None:
        self._call("loop_error", name, exc)


class Ops:
    def __init__(self, conf: DispatchSettings, options: dict | None = None):
        options = options or {}
        self.conf = conf
        self.metrics_port = options.get("metrics_port")
        self.metrics_host = options.get("metrics_host") or "127.0.0.1"
        self.heartbeats = HeartbeatTracker()
        self.metrics = None
        if self.metrics_port is not None:
            from dispatch_app.housekeeping.metrics import DispatchMetrics

            self.metrics = DispatchMetrics()
        self.observer = FanOut(self.heartbeats, self.metrics)
        self.heartbeat: HeartbeatLoop | None = None
        self.metrics_server = None

    def attach(self, supervisor) -> None:
        """Add the heartbeat and retention loops, register this process, start the metrics endpoint."""
        supervisor.ops = self
        self.heartbeat = HeartbeatLoop(
            self.conf,
            self.heartbeats,
            supervisor.stop,
            listener=supervisor.listener,
            observer=self.observer,
            with_beacon=True,
        )
        try:
            self.heartbeat.register()
        except (OperationalError, InterfaceError) as exc:
            # The process's first statement: PostgreSQL restarting must not end it here. The start-up check that
            # follows waits the outage out (or names a database that cannot be right), and the first beat registers.
            connection.close()
            log.warning(
                "database unavailable at start-up (%s); the process registers at its first heartbeat",
                " ".join(str(exc).split()),
                extra={"action": "heartbeat_register_deferred", "domain": "ops"},
            )
        supervisor.add_loop(self.heartbeat, domain="ops")
        supervisor.add_loop(RetentionLoop(self.conf, supervisor.stop), domain="ops")
        supervisor.closers.append(self.heartbeat.mark_stopped)
        if self.metrics is not None:
            from dispatch_app.housekeeping.metrics import serve

            self.metrics.declare_loops(supervisor.loop_names())
            self.metrics_server, close = serve(self.metrics.registry, self.metrics_port, self.metrics_host)
            supervisor.closers.append(close)
