"""Runs one loop on its own thread: wait, step, repeat, until told to stop.

Every loop of the dispatcher has the same shape: a stop signal it checks, a
``wait()`` that returns why it woke, a ``run_once(reason)`` that tests and
one-shot commands call directly, and errors logged with a stable action name
and the loop's domain (once per incident, ``runtime.incident``), followed by a
bounded backoff instead of a dead thread.
A loop whose steps are asked for by wakes (``retry_failed_step``, the dispatch
loop) has its failed step run again after the backoff: the wake was spent on
it. Periodic loops (recovery, heartbeat) wait for their next period as before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from django.db import close_old_connections, connections

import dispatch_app.runtime.incident as incident
from dispatch_app.db.check import ConnectionCheck
from dispatch_app.runtime.incident import Incidents

log = logging.getLogger("dispatch_app.runtime")


class Loop(Protocol):
    name: str

    def wait(self) -> str: ...
    def run_once(self, trigger: str): ...


class LoopRunner:
    def __init__(
        self,
        loop: Loop,
        stop: threading.Event,
        *,
        domain: str | None = None,
        error_backoff: float = 0.5,
        max_backoff: float = 30.0,
        on_success: Callable[[str, object], None] | None = None,
        on_error: Callable[[str, BaseException], None] | None = None,
        db_check: ConnectionCheck | None = None,
        incidents: Incidents | None = None,
    ):
        self.loop = loop
        self.stop = stop
        self.name = loop.name
        self.domain = domain or loop.name
        self.error_backoff = error_backoff
        self.max_backoff = max_backoff
        self.on_success = on_success
        self.on_error = on_error
        # None: the connection is health-checked before every step (a SELECT 1 each time); the dispatch
        # loop's steps are one per drain, so it checks only after an error or an idle spell (db.check).
        self.db_check = db_check
        self.incidents = incidents if incidents is not None else incident.PROCESS
        self.thread = threading.Thread(target=self._run, name=f"loop-{self.name}", daemon=True)
        self.errors = 0
        self.rounds = 0

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        backoff = self.error_backoff
        retry: str | None = None
        try:
            while not self.stop.is_set():
                if retry is not None:
                    # The wake that asked for the failed step was taken by it: waiting for another would leave
                    # the work it announced until the next tick (a PostgreSQL restart: the listener's catch-up
                    # wake met a connection the restart had killed).
                    trigger, retry = retry, None
                else:
                    trigger = self.loop.wait()
                if self.stop.is_set():
                    break
                # A connection killed while we slept is replaced, not reused.
                if self.db_check is None:
                    close_old_connections()
                else:
                    self.db_check.before()
                try:
                    result = self.loop.run_once(trigger)
                except Exception as exc:
                    self.errors += 1
                    # The first of a kind with its traceback, then a summary now and then (runtime.incident).
                    self.incidents.failed(
                        self.name,
                        self.domain,
                        exc,
                        "%s loop failed; retrying in %.1fs",
                        self.name,
                        backoff,
                        action=getattr(self.loop, "error_action", ""),
                    )
                    if self.on_error:
                        self.on_error(self.name, exc)
                    # A broken connection must not be reused by the next round.
                    connections.close_all()
                    self.stop.wait(backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                    if getattr(self.loop, "retry_failed_step", False):
                        retry = trigger
                    continue
                backoff = self.error_backoff
                self.incidents.succeeded(self.name)
                self.rounds += 1
                if self.on_success:
                    self.on_success(self.name, result)
        finally:
            self.incidents.forget(self.name)
            # Each thread owns its connections; leaving one open keeps the
            # server session (and the test database) alive.
            connections.close_all()
            log.info("%s loop stopped", self.name, extra={"action": f"{self.name}_stopped", "domain": self.domain})

    def join(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()
