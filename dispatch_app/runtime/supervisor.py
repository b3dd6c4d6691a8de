"""Starts the listener, the dispatch loop and any other loops; stops them within a deadline.

On stop no loop starts new work (they all check one stop event, and the wake is
set so the dispatch loop returns from its wait at once). Threads are joined
against one deadline; a loop that does not stop in time is named in the log
and left behind (daemon threads), so the process exits anyway.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import close_old_connections

from dispatch_app.config.settings import DispatchSettings
from dispatch_app.db.check import ConnectionCheck
from dispatch_app.dispatch.listener import Listener
from dispatch_app.dispatch.loop import DispatchLoop
from dispatch_app.dispatch.wake import CATCH_UP, STOP, Wake
from dispatch_app.runtime.runner import LoopRunner

log = logging.getLogger("dispatch_app.supervisor")


class Supervisor:
    def __init__(
        self,
        conf: DispatchSettings,
        *,
        stop: threading.Event | None = None,
        wake: Wake | None = None,
        listen: bool = True,
        dispatch: bool = True,
        observer=None,
    ):
        self.conf = conf
        self.stop = stop or threading.Event()
        self.wake = wake or Wake()
        self.observer = observer
        self.closers: list = []
        self.runners: list = []
        # dispatch=False: a recovery-only process (its re-dispatches reach the
        # dispatchers of other processes through the outbox and NOTIFY).
        self.dispatch = DispatchLoop(conf, wake=self.wake, stop=self.stop, observer=observer) if dispatch else None
        if self.dispatch is not None:
            self.runners.append(
                LoopRunner(
                    self.dispatch,
                    self.stop,
                    domain="dispatch",
                    max_backoff=conf.RECONNECT_BACKOFF_MAX,
                    on_success=self._on_success,
                    on_error=self._on_error,
                    db_check=ConnectionCheck(conf.WORKER_DB_CHECK_INTERVAL),
                )
            )
        self.listener = Listener(conf, self.wake, self.stop, observer=observer) if listen and dispatch else None
        if self.listener is not None:
            self.runners.insert(0, self.listener)

    def _on_success(self, name: str, result) -> None:
        if self.observer is not None:
            self.observer.loop_tick(name)

    def _on_error(self, name: str, exc: BaseException) -> None:
        if self.observer is not None:
            self.observer.loop_error(name, exc)

    def add_loop(self, loop, *, domain: str) -> LoopRunner:
        """The seam for recovery and maintenance loops: each on its own thread."""
        runner = LoopRunner(
            loop,
            self.stop,
            domain=domain,
            max_backoff=self.conf.RECONNECT_BACKOFF_MAX,
            on_success=self._on_success,
            on_error=self._on_error,
        )
        self.runners.append(runner)
        return runner

    def start(self) -> None:
        for runner in self.runners:
            runner.start()
        if self.listener is None:
            self.wake.set(CATCH_UP)

    def request_stop(self) -> None:
        self.stop.set()
        self.wake.set(STOP)

    def join(self, deadline: float | None = None) -> list[str]:
        """Join every loop against one deadline; returns the names of those still running."""
        deadline = self.conf.SHUTDOWN_DEADLINE if deadline is None else deadline
        end = time.monotonic() + deadline
        hung = []
        for runner in self.runners:
            if not runner.join(max(0.0, end - time.monotonic())):
                hung.append(runner.name)
        for name in hung:
            log.error(
                "loop %s did not stop within %.1fs; exiting without it",
                name,
                deadline,
                extra={"action": "shutdown_hung_loop", "domain": name},
            )
        if not hung and self.dispatch is not None:
            self.dispatch.close()
        return hung

    def loop_names(self) -> list[str]:
        """Every loop of this process, with those a child process runs for it (``recovery-process``)."""
        names = []
        for runner in self.runners:
            names.append(runner.name)
            child_loops = getattr(getattr(runner, "loop", None), "loop_names", None)
            if child_loops is not None:
                names.extend(child_loops())
        return names

    def close(self) -> None:
        """Release what the process holds beyond its threads (metrics server, heartbeat row)."""
        # The main thread's connection may have died while the loops ran (a terminated backend,
        # a server restart): checked and replaced here, so a closer does not fail on it.
        close_old_connections()
        for closer in self.closers:
            try:
                closer()
            except Exception:
                # One closer's failure must not skip the others or turn a clean stop into a crash.
                log.exception(
                    "closing %s failed",
                    getattr(closer, "__qualname__", closer),
                    extra={"action": "shutdown_close_error", "domain": "dispatch"},
                )
