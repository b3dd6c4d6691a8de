"""The transactions a PipelineWorker sends for a job's end (a mixin of ``PipelineWorker``).

A successful job's end is not written at once: it waits (``_pending``) and goes into the next
write this worker makes anyway -- the next job's start (``_write_start``), or a flush when the
worker goes idle, is suspended or stops (``_flush_pending``) -- so one MULTI/EXEC carries the
previous job's end and this job's start, and the registries move from one true state to the next.
"""

from __future__ import annotations

from rq.executions import Execution
from rq.job import JobStatus
from rq.rate_limit import release_slot
from rq.utils import utcformat
from rq.worker import WorkerStatus

import dispatch_app.rq.internals as rq_internals
import dispatch_app.rq.worker.contracts as contracts


class WritesMixin:
    """What it needs of the worker it is mixed into: ``contracts.WritesHost`` (``StartsMixin``'s too)."""

    NEEDS = contracts.WritesHost

    def _write_start(self, job, queue) -> Execution:
        """One transaction: the previous job's end, then this job's start (RQ's prepare_execution +
        prepare_job_execution, minus the per-job heartbeats)."""
        with self.connection.pipeline() as pipe:
            after = self._write_end(pipe)
            execution = self._start_writes(pipe, job, queue)
            self._write_fields(pipe)
            results = pipe.execute()
        self.executions[execution.id] = execution
        self._after_end(after, results)
        return execution

    def _flush_pending(self, idle: bool = False) -> None:
        with self.connection.pipeline() as pipe:
            after = self._write_end(pipe)
            if idle and self.get_state() != WorkerStatus.IDLE:
                self.set_state(WorkerStatus.IDLE, pipeline=pipe)
            self._write_fields(pipe)
            if not len(pipe):
                return
            results = pipe.execute()
        self._after_end(after, results)

    def _write_end(self, pipe):
        """RQ's handle_job_success for the pending job, without the result payload or the WATCH on
        dependents (checked in the same transaction instead: the project's jobs have none)."""
        if self._pending is None:
            return None
        job, queue, execution = self._pending
        rq_internals.set_status(job, JobStatus.FINISHED)
        self.increment_successful_job_count(pipeline=pipe)
        self.increment_total_working_time(job.ended_at - job.started_at, pipe)
        pipe.hset(job.key, mapping={"status": JobStatus.FINISHED, "ended_at": utcformat(job.ended_at)})
        result_ttl = job.get_result_ttl(self.default_result_ttl)
        if result_ttl != 0:
            job.finished_job_registry.add(job, result_ttl, pipe)
        job.cleanup(result_ttl, pipeline=pipe, remove_from_queue=False)
        self.cleanup_execution(job, pipeline=pipe, execution=execution)
        index = len(pipe)
        pipe.exists(job.dependents_key)
        return job, queue, index

    def _after_end(self, after, results) -> None:
        if after is None:
            return
        # Written: until now a failed write leaves it pending, to be written after a Redis outage.
        self._pending = None
        self.successful_job_count += 1
        job, queue, index = after
        if results[index]:
            self._enqueue_dependents_safely(queue, job)
        release_slot(job)
        job.send_webhooks(JobStatus.FINISHED)

    def _write_fields(self, pipe) -> None:
        if self._pending_fields:
            pipe.hset(self.key, mapping=self._pending_fields)
            self._pending_fields = {}
