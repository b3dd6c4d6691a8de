"""One daemon thread that writes a batch's results while the loop sends the next batch.

A daemon thread, not a ThreadPoolExecutor: an executor's threads are joined at
interpreter exit, so a write stuck on a dead server would keep a stopped
dispatcher alive past its deadline. The thread owns its database connection and
closes it when the loop closes.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from django.db import close_old_connections, connections

_CLOSE = object()


class Marker:
    def __init__(self, name: str = "dispatch-marker"):
        self._tasks: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._name = name
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        self._tasks.put((future, fn, args))
        return future

    def _run(self) -> None:
        try:
            while True:
                task = self._tasks.get()
                if task is _CLOSE:
                    return
                future, fn, args = task
                if not future.set_running_or_notify_cancel():
                    continue
                # A connection that died since the last batch is replaced, not reused.
                close_old_connections()
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # the loop re-raises it where it waits
                    future.set_exception(exc)
        finally:
            connections.close_all()

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._tasks.put(_CLOSE)
            thread.join(timeout)
