"""The child's side: ``rundispatcher --recovery-child``, started by ``runtime.recovery_process``.

It lowers its CPU priority before any thread exists (on Linux a thread's nice
value is inherited by the threads it creates), runs the recovery loops in
process, reports their ticks and errors to the parent as JSON lines on the
report pipe, and stops on SIGTERM or when its lifeline (stdin) reaches EOF,
i.e. when the parent is gone.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading

from dispatch_app.config.settings import DispatchSettings

log = logging.getLogger("dispatch_app.runtime.recovery_child")

EXIT_HUNG = 3
# The child's database sessions carry this name (pg_stat_activity.application_name): an operator, and the
# benchmark's CPU split, can tell recovery's share of PostgreSQL's work from the dispatcher's.
APPLICATION_NAME = "productflow-recovery"


class Reporter:
    """The child's observer: every hook becomes one JSON line on the report pipe."""

    def __init__(self, stream):
        self.stream = stream
        self._lock = threading.Lock()

    def send(self, **report) -> None:
        line = json.dumps(report) + "\n"
        with self._lock:
            try:
                self.stream.write(line)
                self.stream.flush()
            except (OSError, ValueError):
                pass  # the parent is gone; the lifeline stops this process

    def loop_tick(self, name: str) -> None:
        self.send(event="tick", loop=name)

    def loop_error(self, name: str, exc: BaseException) -> None:
        self.send(event="error", loop=name, type=type(exc).__name__, message=str(exc)[:1000])

    def drained(self, result) -> None:
        pass

    def listener_reconnect(self) -> None:
        pass


def lower_priority(increment: int) -> int:
    """Be nicer than the parent by ``increment``; returns the new nice value."""
    return os.nice(increment) if increment else os.nice(0)


def recovery_sessions(*, async_commit: bool = True) -> None:
    """Every database session this process opens from here on: named, and (by default) committing asynchronously.

    Nice only lowers this process's own CPU priority; its PostgreSQL backends
    run at full priority, and with synchronous commit each recovery action
    waits for a WAL flush that competes with the flushes of new jobs' submits.
    With ``synchronous_commit=off`` its commits leave the flush to the WAL
    writer (or to the next synchronous commit, which flushes them with its
    own). Safe because a recovery action that a PostgreSQL crash loses leaves
    its job as it was: stale, so a later round decides again (every action is a
    compare-and-set). Anything durable that saw the action, e.g. a worker's
    start of the re-dispatched attempt, flushed the WAL up to it first; the one
    effect outside the database, a dispatcher's send of the re-dispatched
    envelope, is the case claims already accept (``store.claim.ASYNC_COMMIT``):
    the worker's start compare-and-set refuses an attempt that does not exist.
    """
    from django.db import connections

    options = connections.settings["default"].setdefault("OPTIONS", {})
    if async_commit:
        options["options"] = f"{options.get('options', '')} -c synchronous_commit=off".strip()
    options["application_name"] = APPLICATION_NAME
    connections["default"].close()  # a session opened before (the command's checks) is not reused


def watch_lifeline(stream, on_eof) -> threading.Thread:
    def read() -> None:
        try:
            while stream.read(4096):
                pass
        except (OSError, ValueError):
            pass
        on_eof()

    thread = threading.Thread(target=read, name="lifeline", daemon=True)
    thread.start()
    return thread


def run(
    conf: DispatchSettings,
    domains: list[str],
    *,
    report_fd: int | None,
    nice: int,
    out,
    async_commit: bool = True,
    yield_to_new_work: bool = True,
) -> list[str]:
    """Run the recovery loops until stopped; returns the loops still running at the deadline."""
    from dispatch_app.runtime.assembly import add_recovery_loops
    from dispatch_app.runtime.gcfreeze import freeze_startup
    from dispatch_app.runtime.supervisor import Supervisor

    niceness = lower_priority(nice)
    recovery_sessions(async_commit=async_commit)
    stream = os.fdopen(report_fd, "w", encoding="utf-8") if report_fd is not None else None
    reporter = Reporter(stream) if stream is not None else None
    supervisor = Supervisor(conf, listen=False, dispatch=False, observer=reporter)
    add_recovery_loops(supervisor, conf, domains, yield_to_new_work=yield_to_new_work)
    stopped = threading.Event()

    def stop(reason: str) -> None:
        if stopped.is_set():
            return  # SIGTERM from the parent and from a process-group kill arrive together: one stop
        log.info("recovery process stopping (%s)", reason, extra={"action": "stop_requested", "domain": "recovery"})
        supervisor.request_stop()
        stopped.set()

    signal.signal(signal.SIGTERM, lambda signum, frame: stop("SIGTERM"))
    # Ctrl-C reaches the whole process group; the parent decides when its child stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_lifeline(sys.stdin.buffer, lambda: stop("parent gone"))
    freeze_startup("recovery")
    supervisor.start()
    if reporter is not None:
        reporter.send(event="started", pid=os.getpid(), loops=supervisor.loop_names())
    out.write(f"recovery process pid {os.getpid()} (nice {niceness}) started: {', '.join(supervisor.loop_names())}")
    out.flush()
    while not stopped.wait(0.5):
        pass
    hung = supervisor.join()
    if reporter is not None and hung:
        reporter.send(event="hung", loops=hung)
    supervisor.close()
    if stream is not None:
        try:
            stream.close()
        except OSError:
            pass
    return hung
