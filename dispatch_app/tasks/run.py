"""A task job on the project's workers: the same start compare-and-set and finish as every domain.

RQ imports ``dispatch_app.tasks.run.entry.<queue>`` (the task domain's ``task_path``) and calls it with
(job_id, attempt). It runs ``dispatch_app.execution.execute`` (handed down at start-up: ``install_execute``):
START_SQL, the domain's ``work``, FINISH_SQL; then sends ``task_finished`` with the outcome as stored. ``work``
sends ``task_started`` (after the start is committed) and calls the task with the JSON arguments from the payload.
"""

from __future__ import annotations

import logging
import threading

from django.db import InterfaceError, OperationalError

import dispatch_app.tasks.results as results
from dispatch_app.domains.providers import ProviderError
from dispatch_app.tasks.compat import Task, TaskContext, normalize_json, task_finished, task_started
from dispatch_app.tasks.errors import ErrorNotRetried

log = logging.getLogger("dispatch_app.tasks")

# The queue of the task job this thread is running (set by entry.<queue> around execute).
_running = threading.local()
# Outcomes of execution.execute after which the job's status is final for this attempt.
_FINISHED = ("succeeded", "failed", "outcome_unknown")


def _worker_name() -> str:
    from dispatch_app.rq.current import worker_name as name

    return name()


def _backend_class(alias: str):
    from dispatch_app.tasks.compat import task_backends

    return type(task_backends[alias])


def work(ctx):
    """The task domains' work(ctx): runs the task; its JSON-normalised return value becomes Job.result."""
    from dispatch_app.domains import get_domain

    queue = getattr(_running, "queue", None)
    if ctx.attempt > 1 or ctx.started_at is None or queue is None:
        # Earlier attempts' workers (worker_ids) are in the attempt history: one read, on a retry only.
        task_result, payload = results.load(ctx.job_id)
    else:
        # The first attempt: everything is in hand, no read on the hot path (enqueued_at stays None here;
        # get_result and task_finished read it).
        task_result, payload = (
            results.running(ctx.job_id, queue, ctx.payload, ctx.started_at, _worker_name()),
            ctx.payload,
        )
    task = task_result.task
    if not isinstance(task, Task):
        raise TypeError(f"{payload['task']!r} is not a django.tasks Task (decorate it with @task)")
    task_started.send(sender=_backend_class(task.backend), task_result=task_result)
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=task_result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
    except (OperationalError, InterfaceError, ProviderError) as exc:
        # The worker re-runs a job through the outbox after these (a domain resuming from its ledger);
        # a task may do that only if its queue is retry-safe.
        if get_domain(task.queue_name).recovery.retry_safe:
            raise
        raise ErrorNotRetried(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}") from exc
    return normalize_json(value)


def _finished(job_id: int) -> None:
    try:
        task_result, _ = results.load(job_id)
    except Exception:  # noqa: BLE001 - the outcome is stored; a receiver-side lookup must not fail the job
        log.exception("task job %s: finished, but its result could not be read for task_finished", job_id)
        return
    task_finished.send(sender=_backend_class(task_result.task.backend), task_result=task_result)


def _execute(domain: str, job_id: int, attempt: int) -> dict:
    raise RuntimeError("the task entry points run only in a Django process (DispatchAppConfig.ready installs them)")


def install_execute(execute) -> None:
    """Handed down at start-up (``DispatchAppConfig.ready``): the execution engine's ``execute``, which this engine
    may not import (the engines import none of each other)."""
    global _execute
    _execute = execute


class _Entries:
    """``entry.<queue>``: what RQ calls for a task job (rq.utils.import_attribute resolves the attribute)."""

    def __getattr__(self, key: str):
        if key.startswith("__"):
            raise AttributeError(key)

        def run(job_id: int, attempt: int) -> dict:
            _running.queue = key  # the job's domain = its task queue, for work()
            try:
                outcome = _execute(key, job_id, attempt)
            finally:
                _running.queue = None
            if any(name in outcome for name in _FINISHED):
                _finished(job_id)
            return outcome

        run.__name__ = run.__qualname__ = key
        setattr(self, key, run)
        return run


entry = _Entries()
