"""How a PipelineWorker writes a job's start (a mixin of ``PipelineWorker``).

RQ's own start writes (``_rq_start_writes``: the execution, the job's started state, the busy worker) are
recorded once per (queue, timeout, busy) into a ``start_template.StartTemplate``; each job's start is that
template with its ids and the clock filled in, sent in the busy worker's start transaction
(``_start_writes``) or handed to the idle worker's take script (``_record_start``, ``fetch.Start``).
"""

from __future__ import annotations

import logging

from rq.executions import Execution
from rq.worker import WorkerStatus

import dispatch_app.rq.internals as rq_internals
import dispatch_app.rq.worker.contracts as contracts
from dispatch_app.config.tuning import MAX_START_TEMPLATES
from dispatch_app.rq.worker.fetch import Start, mark_started
from dispatch_app.rq.worker.start_template import StartTemplate

log = logging.getLogger("dispatch_app.rqworker")


class StartsMixin:
    """What it needs of the worker it is mixed into: ``contracts.StartsHost``."""

    NEEDS = contracts.StartsHost

    def _start_writes(self, pipe, job, queue) -> Execution:
        """This job's start into ``pipe``: from the (queue, timeout, state) template, else RQ's own code."""
        template = self._start_template(queue, job.timeout)
        if template is None:
            return self._rq_start_writes(pipe, job, queue)
        rendered = template.render(job.id, self.connection)
        for args, options in zip(rendered.commands, template.options, strict=True):
            pipe.execute_command(*args, **options)
        self._state = WorkerStatus.BUSY
        return mark_started(job, self.name, rendered.at, rendered.execution)

    def _rq_start_writes(self, pipe, job, queue) -> Execution:
        """RQ's prepare_execution + prepare_job_execution, minus the per-job heartbeats."""
        ttl = self.get_heartbeat_ttl(job)
        execution = Execution.create(job, ttl, pipeline=pipe, worker_name=self.name)
        job.prepare_for_execution(self.name, pipeline=pipe)
        pipe.persist(job.key)
        pipe.lrem(queue.intermediate_queue_key, 1, job.id)
        if self.get_state() != WorkerStatus.BUSY:
            self.set_state(WorkerStatus.BUSY, pipeline=pipe)
        return execution

    def _start_template(self, queue, timeout) -> StartTemplate | None:
        """RQ's start writes for this queue, timeout and worker state, recorded once (start_template)."""
        key = (queue.name, timeout, self.get_state() == WorkerStatus.BUSY)
        if key in self._start_templates:
            return self._start_templates[key]
        if len(self._start_templates) >= MAX_START_TEMPLATES:
            return None  # jobs with ever new timeouts: each start by RQ's code, the memory bounded
        state = self._state

        def record(job_id: str):
            stand_in = self._stand_in(job_id, queue, timeout)
            try:
                with self.connection.pipeline() as pipe:
                    execution = self._rq_start_writes(pipe, stand_in, queue)
                    return list(pipe.command_stack), execution.id
            finally:
                self._state = state

        template = self._start_templates[key] = StartTemplate.build(record, self.name)
        if template is None:
            log.warning(
                "worker %s: RQ's start writes for queue %s vary beyond the job id, execution id and clock; "
                "each start is recorded by RQ's code",
                self.name,
                queue.name,
                extra={"action": "worker_start_template_refused", "domain": "worker"},
            )
        return template

    def _record_start(self, popped) -> Start | None:
        """The popped job's start, for the take to write (fetch.Start), when nothing else is owed.

        The writes are this queue's (``_start_template``), with the timeout this queue's last job had:
        the take applies them only if the job's hash has that timeout.
        """
        if self._pending is not None:
            return None  # the previous job's end goes first, in the start's transaction (``_write_start``)
        index, job_id, _ = popped
        queue = self._fetcher.queues[index]
        timeout = self._timeouts.get(queue.name, rq_internals.default_timeout(queue))
        assumed = "" if timeout is None else str(timeout)
        state = self.get_state()
        template = self._start_template(queue, timeout)
        if template is not None:
            rendered = template.render(job_id, self.connection)
            self._state = WorkerStatus.BUSY
            return Start(rendered.execution, rendered.at, self.name, assumed, rendered.commands, state)
        stand_in = self._stand_in(job_id, queue, timeout)
        with self.connection.pipeline() as pipe:
            execution = self._rq_start_writes(pipe, stand_in, queue)
            commands = [args for args, _options in pipe.command_stack]
        return Start(execution, stand_in.started_at, self.name, assumed, commands, state)

    def _stand_in(self, job_id: str, queue, timeout):
        """A job built from the id alone, for RQ's start code to write into a pipeline that is never sent."""
        stand_in = self.job_class(job_id, connection=self.connection, serializer=self.serializer)
        stand_in.origin, stand_in.timeout = queue.name, timeout
        return stand_in
