"""Bounded concurrent sends.

The slot is taken *before* a thread is given work: the submitter blocks while K
sends are in flight, so nothing queues up behind the limit and a slow Redis
cannot make memory or threads grow with the batch. Results are returned, not
counted in shared variables, so totals are exact under concurrency.

The send threads are daemon threads, not a ThreadPoolExecutor: the executor's
threads are joined at interpreter exit, so one send hung in a Redis read kept a
stopped dispatcher alive past its shutdown deadline (until the socket timed out,
retries included). A daemon send killed at exit is harmless: its envelopes keep
their lease and come back; the next send finds the RQ job if it was written.

The caller runs the last item of a list itself (it holds a slot like the rest):
it would only wait for that send anyway, and a one-chunk batch, the usual one
at moderate rates, then reaches Redis without a hand-over to another thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Outcome(Generic[T]):
    item: T
    value: Any = None
    error: BaseException | None = None
    skipped: bool = False  # never started: the stop signal came first

    @property
    def ok(self) -> bool:
        return self.error is None and not self.skipped


class BoundedSender:
    def __init__(self, concurrency: int, *, name: str = "send"):
        if concurrency < 1:
            raise ValueError(f"send concurrency must be >= 1, got {concurrency}")
        self.concurrency = concurrency
        self.name = name
        self._slots = threading.BoundedSemaphore(concurrency)
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.in_flight = 0
        self.peak_in_flight = 0

    @property
    def threads_started(self) -> int:
        return len(self._threads)

    def _submit(self, fn: Callable[[T], R], item: T) -> Future:
        future: Future = Future()
        with self._lock:
            # K threads, started with the first send: the slots keep at most K items
            # in flight, so K threads always have a free one for each.
            while len(self._threads) < self.concurrency:
                thread = threading.Thread(target=self._worker, name=f"{self.name}_{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        self._work.put((fn, item, future))
        return future

    def _worker(self) -> None:
        while True:
            task = self._work.get()
            if task is None:
                return
            fn, item, future = task
            future.set_result(self._run(fn, item))

    def _run(self, fn: Callable[[T], R], item: T) -> Outcome[T]:
        try:
            return Outcome(item, value=fn(item))
        except BaseException as exc:  # a send's failure is its result, never the batch's crash
            return Outcome(item, error=exc)
        finally:
            with self._lock:
                self.in_flight -= 1
            self._slots.release()

    def map(self, fn: Callable[[T], R], items: Iterable[T], *, stop: threading.Event | None = None) -> list[Outcome[T]]:
        """Run fn over items, at most K at once; results in item order.

        Items not yet started when ``stop`` is set come back as skipped. The
        last item of a Sequence runs on the calling thread.
        """
        last = len(items) - 1 if isinstance(items, Sequence) else -1
        futures: list[Future | Outcome] = []
        for index, item in enumerate(items):
            if stop is not None and stop.is_set():
                futures.append(Outcome(item, skipped=True))
                continue
            self._slots.acquire()
            if stop is not None and stop.is_set():
                self._slots.release()
                futures.append(Outcome(item, skipped=True))
                continue
            with self._lock:
                self.in_flight += 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            futures.append(self._run(fn, item) if index == last else self._submit(fn, item))
        return [f.result() if isinstance(f, Future) else f for f in futures]

    def close(self) -> None:
        """End the threads; waits for sends in flight (the supervisor skips this when one hangs)."""
        with self._lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._work.put(None)
        for thread in threads:
            thread.join()
