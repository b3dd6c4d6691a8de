"""The parent's side of the recovery child: spawn it, watch it, restart it, stop it.

Recovery threads in the dispatcher's interpreter share its GIL and cores, so a
recovery storm slows new work. ``rundispatcher`` therefore runs the recovery
loops in a child process (``rundispatcher --recovery-child``) at a lower CPU
priority. The child stays part of this process tree:

- a lifeline pipe on its stdin: when this process dies, even by kill -9, the
  child reads EOF and stops, so it never outlives its parent;
- a report pipe: the child sends each loop's ticks and errors as JSON lines,
  which go to this process's observer, so the heartbeat rows and metrics of
  the recovery loops are this process's, as they were with threads;
- this loop (``recovery-process``) ticks while the child runs; a dead child is
  a loop error (dashboard: errors and last error of ``recovery-process``) and
  is restarted after a backoff that doubles while it keeps dying young.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from dispatch_app.config.settings import DispatchSettings
from dispatch_app.config.tuning import CHILD_DEADLINE_SHARE
from dispatch_app.dispatch.wake import STOP, TICK
from dispatch_app.runtime.runner import LoopRunner

log = logging.getLogger("dispatch_app.runtime.recovery_process")

NAME = "recovery-process"


class ChildExited(Exception):
    """The recovery child died (or could not be started); it is restarted after a backoff."""


_remote_types: dict[str, type] = {}


def remote_error(type_name: str, message: str) -> Exception:
    """An exception standing for one raised in the child: same class name, same message (heartbeat rows)."""
    name = type_name if type_name.isidentifier() else "ChildError"
    cls = _remote_types.setdefault(name, type(name, (Exception,), {"__module__": "recovery-child"}))
    return cls(message)


def child_database_url(url: str, name: str) -> str:
    """The parent's URL pointed at the database the parent actually uses (a test run renames it)."""
    parts = urlsplit(url)
    if parts.path.lstrip("/") == name:
        return url
    return urlunsplit(parts._replace(path="/" + name))


def child_env(conf: DispatchSettings) -> dict[str, str]:
    """The environment of the child: the parent's, its database and Redis, and its effective DISPATCH settings."""
    from django.conf import settings
    from django.db import connection

    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    # Settings that read DATABASE_URL / REDIS_URL from the environment (this project's) get the parent's
    # effective ones; a project whose settings name its servers directly has no DATABASE_URL setting and
    # its child reads the same settings module as the parent.
    if getattr(settings, "DATABASE_URL", None):
        env["DATABASE_URL"] = child_database_url(settings.DATABASE_URL, connection.settings_dict["NAME"])
    env["REDIS_URL"] = settings.REDIS_URL
    # A domain on its own Redis (RQ_QUEUES) reads its evidence there in the child too.
    from dispatch_app.domains import queue_names
    from dispatch_app.rq.servers import queue_url

    for queue in queue_names():
        env.pop(f"REDIS_URL_{queue.upper()}", None)
        if queue_url(queue) != settings.REDIS_URL:
            env[f"REDIS_URL_{queue.upper()}"] = queue_url(queue)
    env["PRODUCTFLOW_KEEP_REDIS_DB"] = "1"
    # manage.py sets DJANGO_SETTINGS_MODULE in os.environ, so the child normally inherits the parent's.
    env.setdefault("DJANGO_SETTINGS_MODULE", os.environ.get("DJANGO_SETTINGS_MODULE") or "productflow.settings")
    env["PYTHONUNBUFFERED"] = "1"
    # Command-line overrides of the parent (--lease, ...) and DISPATCH from settings reach the child the same way.
    for key, value in dataclasses.asdict(conf).items():
        env[f"DISPATCH_{key}"] = json.dumps(value, default=str)
    return env


def child_argv(
    conf: DispatchSettings,
    domains: list[str],
    *,
    nice: int,
    report_fd: int,
    async_commit: bool = True,
    yield_to_new_work: bool = True,
) -> list[str]:
    return [
        sys.executable,
        *_manage_command(),
        "rundispatcher",
        "--recovery-child",
        "--report-fd",
        str(report_fd),
        "--recovery-nice",
        str(nice),
        "--domains",
        ",".join(domains),
        "--shutdown-deadline",
        f"{max(0.1, conf.SHUTDOWN_DEADLINE * CHILD_DEADLINE_SHARE):.3f}",
        *([] if async_commit else ["--recovery-sync-commit"]),
        *([] if yield_to_new_work else ["--recovery-no-yield"]),
    ]


def _manage_command() -> list[str]:
    """How the child runs a management command of the parent's project.

    BASE_DIR/manage.py (startproject's layout, and this repository's), else the script the parent was started
    with when it is a manage.py, else ``python -m django`` (DJANGO_SETTINGS_MODULE is inherited, and the child
    starts in the parent's working directory, which ``-m`` puts on sys.path).
    """
    from django.conf import settings

    base_dir = getattr(settings, "BASE_DIR", None)
    if base_dir and (Path(base_dir) / "manage.py").is_file():
        return [str(Path(base_dir) / "manage.py")]
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if script and script.name == "manage.py" and script.is_file():
        return [str(script.resolve())]
    return ["-m", "django"]


class RecoveryProcessLoop:
    """Supervises one recovery child. ``run_once`` starts it when due and raises ``ChildExited`` when it died."""

    name = NAME

    def __init__(
        self,
        conf: DispatchSettings,
        domains: list[str],
        stop: threading.Event,
        *,
        observer=None,
        nice: int = 10,
        async_commit: bool = True,
        yield_to_new_work: bool = True,
        poll: float = 0.5,
        backoff: float = 1.0,
        max_backoff: float | None = None,
        stable_seconds: float = 60.0,
        spawn: Callable[[], subprocess.Popen] | None = None,
        clock=time.monotonic,
    ):
        self.conf = conf
        self.domains = list(domains)
        self.stop = stop
        self.observer = observer
        self.nice = nice
        # False: the child's commits wait for the WAL flush / its rounds do not yield to a backlog (benchmark A/B).
        self.async_commit = async_commit
        self.yield_to_new_work = yield_to_new_work
        self.poll = poll
        self.initial_backoff = backoff
        self.backoff = backoff
        self.max_backoff = conf.RECONNECT_BACKOFF_MAX if max_backoff is None else max_backoff
        self.stable_seconds = stable_seconds
        self.clock = clock
        self.spawn = spawn or self._spawn
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.next_start = 0.0
        self.starts = 0
        self.exits: list[int] = []  # exit codes of the children that died, oldest first
        self.hung: list[str] = []  # loops the last child reported still running at its deadline
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()
        # Set when a child has started its loops (its "started" report); for callers that must not measure
        # or test before recovery runs (the benchmark, tests).
        self.ready = threading.Event()

    def loop_names(self) -> list[str]:
        return [f"recovery-{domain}" for domain in self.domains]

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def wait(self) -> str:
        pause = self.poll if self.proc is not None else max(0.0, self.next_start - self.clock())
        if self.stop.wait(min(self.poll, pause)):
            return STOP
        return TICK

    def run_once(self, trigger: str = TICK) -> int | None:
        """Start the child when none runs and the backoff has passed; returns its pid (None while waiting)."""
        with self._lock:
            if self.proc is not None:
                code = self.proc.poll()
                if code is None:
                    return self.proc.pid
                self._died(code)
            if self.stop.is_set() or self.clock() < self.next_start:
                return None
            try:
                self.proc = self.spawn()
            except OSError as exc:
                self.next_start = self.clock() + self._grow_backoff()
                raise ChildExited(f"recovery process could not start ({exc}); retrying in {self.backoff:.1f}s") from exc
            self.starts += 1
            self.started_at = self.clock()
            log.info(
                "recovery process %s started (nice +%d): %s",
                self.proc.pid,
                self.nice,
                ", ".join(self.loop_names()),
                extra={"action": "recovery_process_started", "domain": "recovery"},
            )
            return self.proc.pid

    def _grow_backoff(self) -> float:
        delay = self.backoff
        self.backoff = min(self.backoff * 2, self.max_backoff)
        return delay

    def _died(self, code: int) -> None:
        pid = self.proc.pid
        self.proc = None
        self.exits.append(code)
        if self.clock() - self.started_at >= self.stable_seconds:
            self.backoff = self.initial_backoff  # it ran well for a while: this death is not a crash loop
        delay = self._grow_backoff()
        self.next_start = self.clock() + delay
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        raise ChildExited(f"recovery process {pid} died ({how}); restarting in {delay:.1f}s")

    def _spawn(self) -> subprocess.Popen:
        read_fd, write_fd = os.pipe()
        try:
            proc = subprocess.Popen(
                child_argv(
                    self.conf,
                    self.domains,
                    nice=self.nice,
                    report_fd=write_fd,
                    async_commit=self.async_commit,
                    yield_to_new_work=self.yield_to_new_work,
                ),
                env=child_env(self.conf),
                stdin=subprocess.PIPE,  # the lifeline: EOF when this process is gone
                pass_fds=(write_fd,),
            )
        finally:
            os.close(write_fd)
        self._reader = threading.Thread(
            target=self._read_reports, args=(read_fd,), name="recovery-reports", daemon=True
        )
        self._reader.start()
        return proc

    def _read_reports(self, fd: int) -> None:
        # Ends at EOF: the child exited (or was killed) and its end of the pipe closed.
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as reports:
            for line in reports:
                try:
                    self.handle_report(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    log.warning(
                        "unreadable report from the recovery process: %r",
                        line[:200],
                        extra={"action": "recovery_process_bad_report", "domain": "recovery"},
                    )

    def handle_report(self, report: dict) -> None:
        event = report["event"]
        if event == "started":
            self.ready.set()
        if event == "hung":
            self.hung = list(report["loops"])
        if self.observer is None:
            return
        if event == "tick":
            self.observer.loop_tick(report["loop"])
        elif event == "error":
            self.observer.loop_error(report["loop"], remote_error(report["type"], report["message"]))

    def terminate(self) -> None:
        """Ask the child to stop (SIGTERM and EOF on its lifeline); it stops its loops within its deadline."""
        with self._lock:
            proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.send_signal(signal.SIGTERM)
            if proc.stdin is not None:
                proc.stdin.close()
        except (OSError, ValueError):
            pass  # it exited in between

    def wait_exit(self, timeout: float) -> int | None:
        """The child's exit code, or None while it still runs after ``timeout`` seconds."""
        proc = self.proc
        if proc is None:
            return self.exits[-1] if self.exits else 0
        try:
            return proc.wait(max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """Last resort at the parent's deadline: the child must not outlive the command."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            log.error(
                "recovery process %s did not stop in time; killed",
                proc.pid,
                extra={"action": "recovery_process_killed", "domain": "recovery"},
            )
            proc.kill()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass


class RecoveryProcessRunner(LoopRunner):
    """The loop runner of the child supervisor: on stop it stops the child; join waits for the child's exit."""

    def __init__(self, loop: RecoveryProcessLoop, stop: threading.Event, **kwargs):
        super().__init__(loop, stop, domain="recovery", **kwargs)
        self.child_exit: int | None = None

    def _run(self) -> None:
        try:
            super()._run()
        finally:
            # Sent as soon as the stop is seen, so the child stops in parallel with the dispatch loop.
            self.loop.terminate()

    def join(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        thread_done = super().join(timeout)
        self.child_exit = self.loop.wait_exit(end - time.monotonic())
        if self.child_exit is None:
            self.loop.kill()
            return False
        if self.loop.hung:
            log.error(
                "recovery process loops did not stop in time: %s",
                ", ".join(self.loop.hung),
                extra={"action": "shutdown_hung_loop", "domain": "recovery"},
            )
        # Exit code 3: the child's own loops hung past its deadline (rundispatcher's exit codes).
        return thread_done and self.child_exit != 3 and not self.loop.hung
