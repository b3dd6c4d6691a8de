"""RQ's registry maintenance in a PipelineWorker: hashes read as ``ProjectJob``, never fatal, lock released.

RQ cleans each queue's registries at start-up and every ``maintenance_interval``: the started
registry's abandoned jobs, the intermediate list's jobs stuck for over a minute, the worker
registry. Those steps read job hashes anyone on Redis's network may have written, so here they
read them as ``ProjectJob`` (a hash RQ cannot read is a missing job; no callback name is
imported), the queue's maintenance lock is released even when a step raises (RQ's keeps it for
15 minutes), and a failed step is logged and tried again at the next interval instead of
ending the worker: the jobs do not depend on it.
"""

from __future__ import annotations

import logging

import redis
from rq.registry import clean_registries
from rq.utils import now
from rq.worker_registration import clean_worker_registry

import dispatch_app.rq_internals as rq_internals
from dispatch_app.worker.rqworker.project_job import ProjectJob

log = logging.getLogger("dispatch_app.rqworker")


class MaintenanceMixin:
    def clean_registries(self):
        """RQ's maintenance of each queue, with job hashes read as ProjectJob and the lock always released.

        RQ's own version reads hashes with the queue's job class (plain ``Job`` for a queue handed in
        as an object) and keeps the queue's lock for 15 minutes when a step raises.
        """
        for given in self.queues:
            queue = self.queue_class(
                given.name, connection=self.connection, job_class=ProjectJob, serializer=self.serializer
            )
            if not queue.acquire_maintenance_lock():
                continue  # another worker is cleaning it
            try:
                clean_registries(queue, rq_internals.exception_handlers(self))
                clean_worker_registry(queue)
                queue.intermediate_queue.cleanup(self, queue)
            finally:
                queue.release_maintenance_lock()
        self.last_cleaned_at = now()

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
