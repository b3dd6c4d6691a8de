"""How a PipelineWorker lives through a Redis outage, or a value in Redis it cannot use, instead of exiting.

RQ's own worker exits with code 1 when Redis goes away, and only an outside
supervisor brings it back; these methods (a mixin of ``PipelineWorker``) back
off, re-register the worker if Redis lost its hash, write the end of the job
that finished during the outage, and give back the jobs that were taken.

A reply it cannot use (``BAD_REPLY``: a key of the wrong type, a counter that is no number, bytes RQ's
code cannot read; anyone on Redis's network can write them) ended RQ's loop too. Here it is logged
(``action=worker_bad_reply``) and counted, the keys the worker writes are put right (``junk.reset``),
the jobs in its hand go back to their queues, and the loop goes on: at once the first time, backing
off while such replies keep coming.
"""

from __future__ import annotations

import logging
import time

import redis
from rq.exceptions import StopRequested

import dispatch_app.rq.junk as junk
import dispatch_app.rq.worker.contracts as contracts

log = logging.getLogger("dispatch_app.rqworker")

# What a reply Redis holds can raise in the worker's loop (UnicodeDecodeError is a ValueError).
BAD_REPLY = (redis.ResponseError, ValueError)
BAD_REPLY_QUIET_SECONDS = 60.0  # a bad reply after this long without one is handled at once, not backed off


class OutageMixin:
    """What it needs of the worker it is mixed into: ``contracts.OutageHost``."""

    NEEDS = contracts.OutageHost

    bad_replies = 0  # replies this worker could not use, since it started
    _bad_reply_at = float("-inf")
    _bad_reply_delay = 0.0

    def _retrying(self, action, what: str) -> None:
        """Run ``action`` until Redis answers (start-up during an outage), backing off."""
        delay = 0.5
        while True:
            try:
                return action()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.error(
                    "worker %s: Redis unavailable (%s); retrying in %.1fs",
                    self.name,
                    exc,
                    delay,
                    extra={"action": "worker_redis_unavailable", "domain": "worker", "during": what},
                )
                if self._stopping.wait(delay):
                    raise StopRequested() from exc
                delay = min(delay * 2, self.reconnect_backoff_max)

    def _redis_down(self, exc: Exception) -> None:
        """Wait with backoff until Redis answers, then carry on (RQ's worker exits here)."""
        delay = 0.5
        log.error(
            "worker %s: Redis unavailable (%s); waiting and reconnecting",
            self.name,
            exc,
            extra={"action": "worker_redis_unavailable", "domain": "worker"},
        )
        # What was taken may be gone with Redis' data; what is still there goes back once it answers.
        taken = [t for t, _ in self._buffer]
        self._buffer.clear()
        for t in taken:
            self._drop_held("Redis went away before it ran; the job goes back to its queue", t.job.id)
        while not self._stop_requested:
            if self._stopping.wait(delay):
                break
            try:
                self.connection.ping()
            except (redis.ConnectionError, redis.TimeoutError):
                delay = min(delay * 2, self.reconnect_backoff_max)
                continue
            try:
                if not self.connection.exists(self.key):
                    self.reregister(self._beat.ttl if self._beat else 60)
                self._flush_pending_after_outage()
                self._fetcher.give_back([t for t in taken if self.connection.exists(t.job.key)])
                self._settle_in_doubt()
            except (redis.ConnectionError, redis.TimeoutError):
                delay = min(delay * 2, self.reconnect_backoff_max)
                continue
            except BAD_REPLY as exc:  # Redis answers, with junk where a job taken before the outage was
                self._buffer[:0] = [(t, time.monotonic()) for t in taken]
                self._bad_reply(exc)
            log.info(
                "worker %s: Redis is back; resuming",
                self.name,
                extra={"action": "worker_redis_restored", "domain": "worker"},
            )
            return

    def _settle_in_doubt(self) -> None:
        """The job popped before the outage, whose take's reply never came: run it if its start was written
        (it is this worker's: nobody else will), else it went back to the head of its queue."""
        if self._in_doubt is None:
            return
        popped, start = self._in_doubt
        verdict, taken = self._fetcher.settle(popped, start)
        self._in_doubt = None
        became = {"started": "was started: running it", "requeued": "went back to its queue"}.get(verdict, verdict)
        if taken is not None:
            self._buffer.insert(0, (taken, time.monotonic()))
        else:
            self._drop_held(f"its take lost its reply and the job {became}", popped[1])
        log.warning(
            "worker %s: the take of job %s lost its reply; the job %s",
            self.name,
            popped[1],
            became,
            extra={"action": "worker_take_settled", "domain": "worker", "verdict": verdict},
        )

    def _flush_pending_after_outage(self) -> None:
        if self._pending is not None and not self.connection.exists(self._pending[0].key):
            self._pending = None  # Redis lost the job: writing its end would create a stub hash
        self._flush_pending()

    def _bad_reply(self, exc: Exception) -> None:
        """A reply this worker cannot use: logged and counted, its keys and its jobs' keys reset, the jobs in its hand
        given back to their queues (and any it took and no longer holds: a take that failed half-way); then on."""
        self.bad_replies += 1
        at = time.monotonic()
        quiet = at - self._bad_reply_at > BAD_REPLY_QUIET_SECONDS
        self._bad_reply_delay = 0.0 if quiet else min(max(0.5, self._bad_reply_delay * 2), self.reconnect_backoff_max)
        self._bad_reply_at = at
        (log.error if quiet else log.warning)(
            "worker %s: a Redis reply it cannot use (%s: %s; %d since it started): resetting the keys it writes, "
            "giving back the jobs in its hand, going on%s",
            self.name,
            type(exc).__name__,
            str(exc)[:300],
            self.bad_replies,
            "" if quiet else f" in {self._bad_reply_delay:.1f}s",
            exc_info=quiet and not isinstance(exc, redis.ResponseError),  # Redis's own error names command and key
            extra={"action": "worker_bad_reply", "domain": "worker"},
        )
        taken = [t for t, _ in self._buffer]
        keys = junk.worker_keys(self._fetcher.queues, self.name)
        for job in [t.job for t in taken] + ([self._pending[0]] if self._pending is not None else []):
            keys.update(junk.job_keys(job.id))
        try:
            junk.reset(self.connection, keys, {self.key: junk.WORKER_COUNTERS})
            self._fetcher.give_back([t for t in taken if self.connection.exists(t.job.key)])
            self._buffer.clear()
            self._fetcher.rescue(own=True)
            self._settle_in_doubt()
        except (redis.RedisError, ValueError) as again:  # READONLY, OOM, gone: the next round tells
            log.warning(
                "worker %s: could not reset after a bad reply (%s: %s)",
                self.name,
                type(again).__name__,
                str(again)[:300],
                extra={"action": "worker_bad_reply_reset_failed", "domain": "worker"},
            )
        for t in taken:
            self._drop_held("a Redis reply the worker could not use came first; the job went back", t.job.id)
        self._drop_held("a Redis reply the worker could not use came first")
        self._stopping.wait(self._bad_reply_delay)
