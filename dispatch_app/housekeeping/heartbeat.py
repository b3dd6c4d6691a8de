"""Heartbeats: each ``rundispatcher`` records itself and each loop's last successful tick.

``HeartbeatTracker`` is an observer (loop_tick / loop_error) that only notes,
in memory and on the monotonic clock, when each loop last succeeded.
``HeartbeatLoop`` writes that to the database every HEARTBEAT_INTERVAL as
``clock_timestamp() - <seconds since the tick>``: a duration measured on the
host, anchored on the database clock, so every age read later is the
database's. Old rows are pruned by ``housekeeping.retention``.

The process also holds a PostgreSQL session named for its row
(``dispatch_app.db.liveness.Beacon``): a dispatcher killed with -9 loses it at
once, so ``session_alive`` reads it dead in seconds instead of after
HEARTBEAT_STALE_SECONDS (``views.stats.dispatchers``).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from django.db import connection, transaction

import dispatch_app.db.liveness as liveness
import dispatch_app.rq.deployment as deployment
import dispatch_app.store.api as store
from dispatch_app.config.settings import DispatchSettings

DISPATCH_LOOP = "dispatch"  # DispatchLoop.name
PAUSED = "dispatch paused: "


@dataclass
class _LoopState:
    tick: float | None = None
    error_at: float | None = None
    error: str = ""
    errors: int = 0
    dirty: bool = True


class HeartbeatTracker:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._loops: dict[str, _LoopState] = {}
        self._pauses = 0

    def loop_tick(self, name: str) -> None:
        with self._lock:
            state = self._loops.setdefault(name, _LoopState())
            state.tick, state.dirty = self.clock(), True

    def loop_error(self, name: str, exc: BaseException) -> None:
        with self._lock:
            state = self._loops.setdefault(name, _LoopState())
            state.error_at, state.dirty = self.clock(), True
            state.error = f"{type(exc).__name__}: {exc}"[:2000]
            state.errors += 1

    def drained(self, result) -> None:
        """The dispatch loop's pause (its Redis breaker open) is its last error, for the dashboard; so is the resume.

        A paused loop still ticks (it is alive and probing); the error says why it sends nothing.
        """
        breaker = getattr(result, "breaker", None)
        if breaker is None:
            return
        with self._lock:
            state = self._loops.setdefault(DISPATCH_LOOP, _LoopState())
            if breaker.state != "closed":
                note = f"{PAUSED}{breaker.reason}: {breaker.error}"[:2000]
                if breaker.pauses > self._pauses:
                    state.errors += breaker.pauses - self._pauses
                    self._pauses = breaker.pauses
                if note != state.error:
                    state.error, state.error_at, state.dirty = note, self.clock(), True
            elif state.error.startswith(PAUSED):
                state.error, state.dirty = f"dispatch resumed (was {state.error})"[:2000], True

    def take(self) -> list[tuple[str, float | None, float | None, str, int]]:
        """Loops changed since the last take: (name, seconds since tick, seconds since error, error, errors)."""
        now = self.clock()
        with self._lock:
            out = []
            for name, s in self._loops.items():
                if s.dirty:
                    s.dirty = False
                    out.append(
                        (
                            name,
                            None if s.tick is None else now - s.tick,
                            None if s.error_at is None else now - s.error_at,
                            s.error,
                            s.errors,
                        )
                    )
            return out

    def mark_all_dirty(self) -> None:
        with self._lock:
            for state in self._loops.values():
                state.dirty = True


class HeartbeatLoop:
    name = "heartbeat"
    BEACON_WAIT = 5.0  # s: how long the first beat waits for the liveness session before it goes on without

    def __init__(
        self,
        conf: DispatchSettings,
        tracker: HeartbeatTracker,
        stop: threading.Event,
        *,
        listener=None,
        observer=None,
        with_beacon: bool = False,
    ):
        self.conf = conf
        self.tracker = tracker
        # The listener's tick goes to the process's observer (heartbeats and metrics alike), not the tracker alone,
        # or productflow_loop_ticks_total{loop="listener"} would stay 0 while the dashboard shows it ticking.
        self.observer = observer if observer is not None else tracker
        self.stop = stop
        self.listener = listener
        self.process_id: int | None = None
        self.process_name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # Ops.attach (a real dispatcher) asks for a liveness session; its name goes into the row once connected.
        self.with_beacon = with_beacon
        self.beacon: liveness.Beacon | None = None
        self._session_written = ""

    def _session(self) -> str:
        """The liveness session's name once it is connected, else ''."""
        beacon = self.beacon
        return beacon.tag if beacon is not None and beacon.connected.is_set() else ""

    def register(self) -> int:
        with connection.cursor() as cursor:
            session = self._session()
            self.process_id = store.register(cursor, self.process_name, socket.gethostname(), os.getpid(), session)
            self._session_written = session
        self.tracker.mark_all_dirty()
        return self.process_id

    def wait(self) -> str:
        if self.with_beacon and self.beacon is None:
            # Started with the loop, not with the object: a HeartbeatLoop built and never run holds no session.
            self.beacon = liveness.Beacon(
                liveness.tag(liveness.DISPATCHER, self.process_name), liveness.django_conninfo
            )
            self.beacon.start()
            if self.beacon.connected.wait(self.BEACON_WAIT):
                return "tick"  # write it into the row now, so a kill from here on reads dead at once
        self.stop.wait(self.conf.HEARTBEAT_INTERVAL)
        return "tick"

    def run_once(self, trigger: str = "tick") -> int:
        """Write last_seen_at and the loops' ticks; returns how many loop rows were written."""
        if self.listener is not None and self.listener.connected.is_set():
            # The listener is not a loop runner: being connected, its ping answering, is its tick. A ping
            # that does not return (a dead network) is reported as its error, once, and it stops ticking.
            problem = self.listener.health_problem()
            if problem is None:
                self.observer.loop_tick(self.listener.name)
            elif problem != getattr(self, "_listener_problem", None):
                self.observer.loop_error(self.listener.name, ConnectionError(f"listener unhealthy: {problem}"))
            self._listener_problem = problem
        if self.process_id is None:
            self.register()
        with transaction.atomic(), connection.cursor() as cursor:
            session = self._session() or self._session_written  # a session lost a moment is the same name
            alive = store.seen(cursor, self.process_id, session)
            self._session_written = session
            if not alive:
                # Pruned while we were silent (a long pause): come back as a new row, under the same name (the
                # old row is gone), which the liveness session carries.
                self.process_id = None
        if self.process_id is None:
            self.register()
        deployment.keep_alive()  # this deployment's entry on its Redis servers (dispatch_app.rq.deployment)
        rows = self.tracker.take()
        if rows:
            with transaction.atomic(), connection.cursor() as cursor:
                for name, tick_ago, error_ago, error, errors in rows:
                    store.loop_beat(cursor, self.process_id, name, tick_ago, error_ago, error, errors)
        return len(rows)

    def mark_stopped(self) -> None:
        try:
            if self.process_id is None:
                return
            self.run_once()
            with connection.cursor() as cursor:
                store.stopped(cursor, self.process_id)
        finally:
            self.stop_beacon()  # after stopped_at: a stopped process never reads "dead" first

    def stop_beacon(self) -> None:
        if self.beacon is not None:
            self.beacon.stop()
