"""A task job's TaskResult, read from PostgreSQL in one statement.

Job status -> TaskResultStatus:

- ``submitted``, ``queued`` -> READY (waiting for dispatch, a worker, or a retry's backoff);
- ``running`` -> RUNNING;
- ``succeeded`` -> SUCCESSFUL (``return_value`` is ``Job.result``);
- ``failed`` -> FAILED, the error is the task's exception (class path + traceback);
- ``outcome_unknown`` -> FAILED with ``dispatch_app.tasks.errors.TaskOutcomeUnknown``: the run was cut
  off and nobody knows whether it took effect. Django has no status for that; FAILED is the one that
  is finished (``is_finished``: no caller waits forever), never SUCCESSFUL (no return value exists),
  and it will not run again by itself (an operator decides, in the admin).
- ``cancelled`` -> FAILED with ``dispatch_app.tasks.errors.TaskCancelled``: finished, without a result.

``TaskContext.attempt`` is ``len(worker_ids)``: one entry per attempt that started (the worker that
ran it, '' if unknown), so inside a run it is the job's attempt number.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.db import connection
from django.utils.module_loading import import_string

from dispatch_app.tasks.compat import TaskError, TaskResult, TaskResultDoesNotExist, TaskResultStatus

STATUS = {
    "submitted": TaskResultStatus.READY,
    "queued": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "succeeded": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "outcome_unknown": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}
OUTCOME_ERRORS = {
    "outcome_unknown": "dispatch_app.tasks.errors.TaskOutcomeUnknown",
    "cancelled": "dispatch_app.tasks.errors.TaskCancelled",
    "failed": "dispatch_app.tasks.errors.TaskNotRun",
}

SELECT_SQL = """
SELECT j.domain, j.status, j.attempt, j.payload::text, j.result::text, j.error,
       j.submitted_at, j.started_at, j.finished_at,
       ARRAY(SELECT a.worker FROM dispatch_app_jobattempt a WHERE a.job_id = j.id ORDER BY a.attempt),
       ARRAY(SELECT a.error FROM dispatch_app_jobattempt a
             WHERE a.job_id = j.id AND a.attempt < j.attempt AND a.error <> '' ORDER BY a.attempt)
FROM dispatch_app_job j WHERE j.id = %s
"""

# Job.error from worker.format_error: "module.Class: message", a blank line, the traceback.
_CLASS_LINE = re.compile(r"([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)+): ")


def task_error(text: str, status: str) -> TaskError:
    """Job.error as a TaskError: the exception's class path and traceback when the task raised."""
    match = _CLASS_LINE.match(text)
    if status == "failed" and match and "\n\n" in text:
        return TaskError(exception_class_path=match.group(1), traceback=text.split("\n\n", 1)[1])
    return TaskError(exception_class_path=OUTCOME_ERRORS.get(status, OUTCOME_ERRORS["failed"]), traceback=text)


def _decoded(text: str | None) -> Any:
    # Selected as text: a jsonb string value must not be mistaken for JSON text or the reverse.
    return None if text is None else json.loads(text)


def _task(job_id: int, domain: str, payload: dict):
    try:
        task = import_string(payload["task"])
    except ImportError as exc:
        raise TaskResultDoesNotExist(f"job {job_id} ran task {payload['task']!r}, which no longer imports: {exc}")
    backend = payload.get("backend") or task.backend
    if (task.queue_name, task.backend) != (domain, backend):  # using() validates the task again: only if needed
        task = task.using(queue_name=domain, backend=backend)
    return task


def running(job_id: int, queue: str, payload: dict, started_at, worker: str) -> TaskResult:
    """The first attempt's RUNNING TaskResult, from what the worker's start returned (no read)."""
    return _result(
        _task(job_id, queue, payload), job_id, payload, TaskResultStatus.RUNNING, None, started_at, None, [], [worker]
    )


def _result(task, job_id: int, payload: dict, status, enqueued_at, started_at, finished_at, errors, worker_ids):
    return TaskResult(
        task=task,
        id=str(job_id),
        status=status,
        enqueued_at=enqueued_at,
        started_at=started_at,
        finished_at=finished_at,
        last_attempted_at=started_at,
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        backend=task.backend,
        errors=errors,
        worker_ids=worker_ids,
    )


def load(result_id: Any, domains: set[str] | None = None) -> tuple[TaskResult, dict]:
    """(TaskResult, payload) of a task job; TaskResultDoesNotExist if there is no such task job."""
    try:
        job_id = int(str(result_id))
    except ValueError:
        raise TaskResultDoesNotExist(f"no task result {result_id!r}: ids are job ids (whole numbers)") from None
    with connection.cursor() as cursor:
        cursor.execute(SELECT_SQL, [job_id])
        row = cursor.fetchone()
    if row is None:
        raise TaskResultDoesNotExist(f"no task result {result_id!r}")
    domain, status, attempt, payload, result, error, submitted, started, finished, workers, old_errors = row
    payload = _decoded(payload)
    if (domains is not None and domain not in domains) or not isinstance(payload, dict) or "task" not in payload:
        raise TaskResultDoesNotExist(f"job {job_id} is a {domain!r} job, not a task of this backend")
    task = _task(job_id, domain, payload)
    # An attempt re-dispatched but not started yet has not been attempted.
    attempts = attempt if started is not None else attempt - 1
    worker_ids = [(workers[n] if n < len(workers) else "") or "" for n in range(attempts)]
    errors = [task_error(text, "failed") for text in old_errors]
    if status in ("failed", "outcome_unknown", "cancelled"):
        errors.append(task_error(error, status))
    task_result = _result(task, job_id, payload, STATUS[status], submitted, started, finished, errors, worker_ids)
    if status == "succeeded":
        object.__setattr__(task_result, "_return_value", _decoded(result))
    return task_result, payload
