"""RQ's registry maintenance in a PipelineWorker: hashes read as ``ProjectJob``, never fatal, lock released.

RQ cleans each queue's registries at start-up and every ``maintenance_interval``: the started
registry's abandoned jobs, the intermediate list's jobs stuck for over a minute, the worker
registry. Those steps read job hashes anyone on Redis's network may have written, so here the
ids RQ's cleanup would raise on are dropped first, the hashes are read as ``ProjectJob`` (a hash
RQ cannot read is a missing job; no callback name is imported), the queue's maintenance lock is
released even when a step raises (RQ's keeps it for 15 minutes), and a failed step is logged and
tried again at the next interval instead of ending the worker: the jobs do not depend on it. Before
the steps, the keys the worker writes that hold the wrong type, and its counters that are no number,
are reset (``junk.reset``): at start-up and at every interval, whatever else wrote them since.
"""

from __future__ import annotations

import logging

import redis
from rq.registry import clean_registries
from rq.utils import now
from rq.worker_registration import clean_worker_registry

import dispatch_app.rq.internals as rq_internals
import dispatch_app.rq.junk as junk
import dispatch_app.rq.worker.admission as admission
from dispatch_app.rq.worker.project_job import ProjectJob

log = logging.getLogger("dispatch_app.rqworker")


class MaintenanceMixin:
    def clean_registries(self):
        """RQ's maintenance of each queue, with job hashes read as ProjectJob and the lock always released.

        RQ's own version reads hashes with the queue's job class (plain ``Job`` for a queue handed in
        as an object), stops at the first step that raises and then keeps the queue's lock for 15
        minutes. Here each step runs on its own: a poisoned registry stops only its own step.
        """
        self._step("junk values", None, self._reset_junk)
        for given in self.queues:
            queue = self.queue_class(
                given.name, connection=self.connection, job_class=ProjectJob, serializer=self.serializer
            )
            if not queue.acquire_maintenance_lock():
                continue  # another worker is cleaning it
            try:
                self._step("malformed ids", queue, self._drop_malformed_ids, queue)
                self._step("registries", queue, clean_registries, queue, rq_internals.exception_handlers(self))
                self._step("worker registry", queue, clean_worker_registry, queue)
                self._step("intermediate list", queue, queue.intermediate_queue.cleanup, self, queue)
            finally:
                queue.release_maintenance_lock()
        self.last_cleaned_at = now()

    def _step(self, name: str, queue, run, *args) -> None:
        try:
            run(*args)
        except (redis.ConnectionError, redis.TimeoutError):
            raise
        except Exception as exc:  # noqa: BLE001 - Redis content is input: nothing it holds may end the worker
            log.exception(
                "worker %s: RQ maintenance of queue %s, %s, failed (%s: %s); the other steps ran, next try in %ss",
                self.name,
                queue.name if queue is not None else "(all)",
                name,
                type(exc).__name__,
                exc,
                self.maintenance_interval,
                extra={"action": "worker_maintenance_failed", "domain": queue.name if queue is not None else "worker"},
            )

    def _reset_junk(self) -> None:
        """The keys this worker writes, of the wrong type, and its counters that are no number: reset."""
        junk.reset(self.connection, junk.worker_keys(self.queues, self.name), {self.key: junk.WORKER_COUNTERS})

    def _drop_malformed_ids(self, queue) -> None:
        """Entries RQ's cleanup would choke on before reaching the rest (it decodes and makes a Job of each):
        ids outside RQ's alphabet in the intermediate list, and such job ids in the started registry."""
        wip = queue.started_job_registry.key
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.lrange(queue.intermediate_queue_key, 0, -1)
            pipe.zrange(wip, 0, -1)
            taken, started = pipe.execute()
        bad_taken = [raw for raw in taken if admission.malformed_id(raw)]
        bad_started = [raw for raw in started if not raw.isascii() or admission.malformed_id(raw.split(b":", 1)[0])]
        if bad_started:
            self.connection.zrem(wip, *bad_started)
        if bad_taken:
            admission.drop_malformed(self.name, self.connection, queue.name, queue.intermediate_queue_key, bad_taken)

    def _maintain(self) -> None:
        """RQ's periodic maintenance; a step that fails is logged and tried again next interval, never fatal."""
        try:
            self.run_maintenance_tasks()
        except (redis.ConnectionError, redis.TimeoutError):
            raise
        except Exception as exc:  # noqa: BLE001 - Redis content is input: nothing it holds may end the worker
            self.last_cleaned_at = now()
            log.exception(
                "worker %s: RQ maintenance failed (%s: %s); jobs still run, next try in %ss",
                self.name,
                type(exc).__name__,
                exc,
                self.maintenance_interval,
                extra={"action": "worker_maintenance_failed", "domain": "worker"},
            )
