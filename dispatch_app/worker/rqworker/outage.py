"""How a PipelineWorker lives through a Redis outage: it waits and reconnects instead of exiting.

RQ's own worker exits with code 1 when Redis goes away, and only an outside
supervisor brings it back; these methods (a mixin of ``PipelineWorker``) back
off, re-register the worker if Redis lost its hash, write the end of the job
that finished during the outage, and give back the jobs that were taken.
"""

from __future__ import annotations

import logging
import time

import redis
from rq.exceptions import StopRequested

log = logging.getLogger("dispatch_app.rqworker")


class OutageMixin:
    """Needs the PipelineWorker attributes it uses: _stopping, _stop_requested, _buffer, _beat, _fetcher,
    _in_doubt, _drop_held."""

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
