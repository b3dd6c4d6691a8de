"""send-admission: a slow Redis send; slot-before-spawn (shipped) vs spawn-then-wait.

Each chunk's send blocks for the delay (a slow Redis round trip) and then does a
real pipelined ``Publisher.send`` to our Redis db. ``slot-before-spawn`` is
``BoundedSender``: the submitter takes a slot before a pool thread gets work.
``spawn-then-wait`` starts one thread per chunk that then waits for a slot.
Both allow K sends in flight; peak threads and peak memory are sampled every
2 ms while the batch grows.
"""

from __future__ import annotations

import threading
import time

from bench import Context, record, side_by_side
from bench.stats import rate

NAME = "send-admission"
VARIANTS = ["slot-before-spawn", "spawn-then-wait"]


class SpawnThenWait:
    """The naive sender: a thread per chunk, the limit applied inside the thread."""

    def __init__(self, concurrency: int):
        self._slots = threading.BoundedSemaphore(concurrency)

    def map(self, fn, items, *, stop=None):
        from dispatch_app.dispatch.sender import Outcome

        items = list(items)
        results: list = [None] * len(items)

        def work(index, item):
            with self._slots:
                try:
                    results[index] = Outcome(item, value=fn(item))
                except BaseException as exc:  # noqa: BLE001 - mirrors BoundedSender
                    results[index] = Outcome(item, error=exc)

        threads = [threading.Thread(target=work, args=(i, item), daemon=True) for i, item in enumerate(items)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results

    def close(self):
        pass


class Peaks:
    def __init__(self):
        import psutil

        self.proc = psutil.Process()
        self.base_threads = threading.active_count()
        mem = self.proc.memory_info()
        self.base_rss, self.base_vms = mem.rss, mem.vms
        self.threads = 0
        self.rss = 0
        self.vms = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.threads = max(self.threads, threading.active_count() - self.base_threads - 1)
            mem = self.proc.memory_info()
            self.rss = max(self.rss, mem.rss - self.base_rss)
            self.vms = max(self.vms, mem.vms - self.base_vms)
            time.sleep(0.002)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join(5)


def run(ctx: Context) -> list[dict]:
    import gc

    from dispatch_app.config.settings import dispatch_settings
    from dispatch_app.dispatch.sender import BoundedSender
    from dispatch_app.rq.publish import Publisher
    from dispatch_app.store.claim import Claimed

    env = ctx.env
    delay = ctx.size("admission_delay_ms", 2.0, 1.0) / 1000.0
    sizes = [10, 50] if ctx.quick else [100, 500, 2000]
    concurrency = 4
    conf = dispatch_settings()
    publisher = Publisher(conf, connection=env.redis())

    def slow_send(chunk):
        time.sleep(delay)
        return publisher.send(chunk)

    def run_one(variant: str, index: int):
        env.redis().flushdb()
        points = []
        for size in sizes:
            chunks = [
                [Claimed(100_000 * size + i, 100_000 * size + i, 1, "workflow", "workflow", 1, True)]
                for i in range(size)
            ]
            sender = BoundedSender(concurrency) if variant == "slot-before-spawn" else SpawnThenWait(concurrency)
            gc.collect()
            with Peaks() as peaks:
                started = time.monotonic()
                outcomes = sender.map(slow_send, chunks)
                elapsed = time.monotonic() - started
            sender.close()
            points.append(
                {
                    "batch": size,
                    "peak_threads": peaks.threads,
                    "peak_rss_mb": peaks.rss / 2**20,
                    "peak_vms_mb": peaks.vms / 2**20,
                    "seconds": elapsed,
                    "sends_per_s": rate(size, elapsed),
                    "ok": sum(1 for o in outcomes if o.ok),
                }
            )
        env.redis().flushdb()
        largest = points[-1]
        metrics = {"largest_batch": largest["batch"], **{k: v for k, v in largest.items() if k != "batch"}}
        for p in points:
            metrics[f"n{p['batch']}.peak_threads"] = p["peak_threads"]
            metrics[f"n{p['batch']}.peak_rss_mb"] = p["peak_rss_mb"]
        return metrics, {"by_batch": points}

    out = side_by_side(ctx, NAME, VARIANTS, run_one)
    return [
        record(
            NAME,
            v,
            {"send_delay_ms": delay * 1000, "concurrency": concurrency, "chunk": 1, "batches": sizes},
            out["runs"][v],
            out["series"][v],
            error=out["errors"].get(v),
        )
        for v in VARIANTS
    ]
