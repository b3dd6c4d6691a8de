"""What a PipelineWorker writes into its RQ worker hash for the health view, and how it reports a job it cannot read.

Read by ``dispatch_app.rq.state.health`` (``dispatchstats``, the dashboard) and
``dispatch_app.rq.state.queues``: the last outcomes (``s`` succeeded, ``f`` failed,
``d`` could not be deserialized), how many jobs it could not read, the last
such error, and its heartbeat period.
"""

from __future__ import annotations

import logging

from rq.exceptions import DeserializationError
from rq.utils import now

import dispatch_app.rq.worker.contracts as contracts
from dispatch_app.config.tuning import RECENT_OUTCOMES
from dispatch_app.rq.fields import (  # noqa: F401 - the worker writes them
    HEARTBEAT_INTERVAL_FIELD,
    LAST_ERROR_FIELD,
    RECENT_FIELD,
    UNDESERIALIZABLE_FIELD,
)
from dispatch_app.rq.worker.fetch import Taken

log = logging.getLogger("dispatch_app.rqworker")


class EvidenceMixin:
    """What it needs of the worker it is mixed into: ``contracts.EvidenceHost``."""

    NEEDS = contracts.EvidenceHost

    def _outcome(self, kind: str) -> None:
        self._recent = (self._recent + kind)[-RECENT_OUTCOMES:]
        self._pending_fields[RECENT_FIELD] = self._recent

    def _health_fields(self) -> dict[str, str]:
        return {RECENT_FIELD: self._recent, UNDESERIALIZABLE_FIELD: str(self._undeserializable)}

    def serialize(self) -> dict:
        # Written at birth and on re-registration (never per beat): the hash says how often this worker beats.
        return {**super().serialize(), HEARTBEAT_INTERVAL_FIELD: str(self.heartbeat_interval)}

    def _note_unreadable(self, job_id: str, reason: str) -> None:
        """A job whose data this worker cannot read (refused by ``admission``): counted, as the error shown."""
        self._undeserializable += 1
        self._outcome("d")
        self._pending_fields[UNDESERIALIZABLE_FIELD] = str(self._undeserializable)
        self._pending_fields[LAST_ERROR_FIELD] = f"job {job_id[:100]}: cannot deserialize: {reason}"[:500]

    def _undeserializable_job(self, taken: Taken, exc: DeserializationError) -> None:
        """Loud once per process (what is wrong and what to do), one line per job after that."""
        job, queue = taken.job, taken.queue
        self._undeserializable += 1
        self._outcome("d")
        self._pending_fields[UNDESERIALIZABLE_FIELD] = str(self._undeserializable)
        cause = exc.__cause__ or exc
        self._pending_fields[LAST_ERROR_FIELD] = f"job {job.id}: cannot deserialize: {type(cause).__name__}: {cause}"[
            :500
        ]
        extra = {"action": "job_undeserializable", "domain": queue.name, "job_id": job.id}
        if not self._told_undeserializable:
            self._told_undeserializable = True
            log.error(
                "worker %s: job %s: exception raised while executing (<DeserializationError>): its data is not "
                "JSON this worker can read (%s: %s). The project's dispatcher enqueues JSON: a job like this was "
                "enqueued by something else (another serializer, e.g. pickle, or a planted job). It is failed "
                "(RQ failed registry), never run; later ones are reported one line each.",
                self.name,
                job.id,
                type(cause).__name__,
                cause,
                extra=extra,
            )
        else:
            log.warning(
                "worker %s: job %s: exception raised while executing (<DeserializationError>); failed, not run",
                self.name,
                job.id,
                extra=extra,
            )
        self._flush_pending()
        with self.connection.pipeline() as pipe:
            if taken.execution is None:
                pipe.lrem(queue.intermediate_queue_key, 1, job.id)
            self._write_fields(pipe)
            if len(pipe):
                pipe.execute()
        job.ended_at = now()
        # Started by the take (fetch.Start), as RQ's own worker starts every job before reading it: the
        # failure also ends that execution.
        self.handle_job_failure(
            job,
            queue,
            exc_string=f"DeserializationError: {type(cause).__name__}: {cause}",
            execution=taken.execution,
        )
        self.failed_job_count += 1
