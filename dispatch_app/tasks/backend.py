"""``OutboxBackend``: django.tasks enqueue through the transactional outbox.

``enqueue`` writes the job and its dispatch envelope with ``outbox.submit`` -- one statement, in the
caller's transaction when there is one: a rollback removes both, and nothing talks to Redis. The
dispatcher (``manage.py rundispatcher``) moves the envelope to RQ after the commit; the project's
workers (``manage.py runworkers``) run it through the start compare-and-set. The TaskResult id is the
job id, so ``get_result`` reads the job from PostgreSQL in any process.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError

import dispatch_app.outbox.payloads as payloads
import dispatch_app.tasks.declare as declare
import dispatch_app.tasks.results as results
from dispatch_app.config.settings import cached_settings
from dispatch_app.tasks.compat import BaseTaskBackend, InvalidTask, TaskResult, TaskResultStatus, task_enqueued

VALIDATED_MAX = 1024


class InvalidTaskArguments(InvalidTask, ValidationError):  # noqa: N818 - named as django.tasks names its own
    """Arguments (or a run_after) the outbox cannot store: a ``ValidationError`` naming the field, and an
    ``InvalidTask`` as django.tasks callers catch. Nothing was written."""

    def __init__(self, message: str, code: str = "invalid"):
        ValidationError.__init__(self, message, code=code)


class ArgumentsNotJSON(InvalidTaskArguments, TypeError):
    """Arguments of a type JSON has not: also the TypeError django.tasks raises for them."""


class OutboxBackend(BaseTaskBackend):
    # run_after becomes the envelope's available_at; the claim compares it with the database clock.
    supports_defer = True
    # Coroutine tasks run under async_to_sync in the (synchronous) RQ worker.
    supports_async_task = True
    supports_get_result = True
    # The claim takes envelopes in (available_at, id) order (first attempts before re-dispatches): a priority
    # would order nothing.
    supports_priority = False

    def __init__(self, alias, params):
        super().__init__(alias, params)
        # Checked now, so a bad OPTIONS fails at the first use of the backend, naming the key.
        self.policies = declare.queue_policies(alias, params)
        # Tasks already validated by this backend. A Task is frozen and what validate_task reads (the
        # backend's queues and policies) lives as long as this instance (a TASKS change makes a new one),
        # so a task defined once and enqueued often pays the signature inspection once, not per enqueue.
        self._validated: set = set()

    def validate_task(self, task) -> None:
        super().validate_task(task)
        # A retry-safe task may run on any queue (where it is not re-run, it is merely treated with more care);
        # a task that never said so may not run on a queue that re-runs interrupted work.
        if self.policies[task.queue_name].retry_safe and not declare.declares_retry_safe(task.func):
            raise InvalidTask(
                f"Task {task.module_path} is not declared retry-safe, but queue {task.queue_name!r} re-runs "
                "interrupted tasks (OPTIONS['QUEUES'][...]['RETRY_SAFE']): mark it @retry_safe "
                "(dispatch_app.tasks) or put it on a queue that is not retry-safe."
            )

    def _validate_once(self, task) -> None:
        if task in self._validated:
            return
        self.validate_task(task)
        if len(self._validated) >= VALIDATED_MAX:  # e.g. many distinct run_after values
            self._validated.clear()
        self._validated.add(task)

    def enqueue(self, task, args, kwargs) -> TaskResult:
        from dispatch_app.outbox.submit import submit

        self._validate_once(task)
        where = f"Task {task.module_path} cannot be enqueued: "
        try:
            # Before the normalisation below, which recurses (a thousand-deep argument would be a RecursionError)
            # and copies every item: depth and size first, lengths before items.
            max_bytes = cached_settings().PAYLOAD_MAX_BYTES
            payloads.check_depth(args, f"{where}args", max_bytes=max_bytes)
            payloads.check_depth(kwargs, f"{where}kwargs", max_bytes=max_bytes)
        except ValidationError as exc:
            raise InvalidTaskArguments(exc.messages[0], exc.code) from None
        try:
            # Built first: its __post_init__ normalises the arguments to JSON.
            task_result = self._result(task, args, kwargs)
        except (TypeError, ValueError) as exc:
            raise ArgumentsNotJSON(f"{where}arguments are not JSON ({exc})", "not_json") from None
        payload = {
            "task": task.module_path,
            "args": task_result.args,
            "kwargs": task_result.kwargs,
            "backend": self.alias,
        }
        try:
            job = submit(task.queue_name, payload, available_at=task.run_after)
        except ValidationError as exc:
            raise InvalidTaskArguments(f"{where}{'; '.join(exc.messages)}", exc.code) from None
        object.__setattr__(task_result, "id", str(job.id))
        object.__setattr__(task_result, "enqueued_at", job.submitted_at)
        # As Django documents: sent by enqueue. Inside the caller's transaction it may still be rolled back.
        task_enqueued.send(type(self), task_result=task_result)
        return task_result

    def _result(self, task, args, kwargs) -> TaskResult:
        return TaskResult(
            task=task,
            id="",
            status=TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )

    def get_result(self, result_id) -> TaskResult:
        return results.load(result_id, domains=set(self.queues))[0]
