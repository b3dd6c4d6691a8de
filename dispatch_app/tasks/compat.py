"""The task API from wherever this Django has it: ``django.tasks`` (Django 6) or the ``django-tasks`` backport.

Both expose the same classes; only the exception names and the home of
``normalize_json`` differ. Everything in ``dispatch_app.tasks`` imports them from here.
"""

from __future__ import annotations

try:  # Django 6.0+
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, default_task_backend, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import DEFAULT_TASK_QUEUE_NAME, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:  # Django 5.2: the backport (requirements/base.txt pins it for Python < 3.12)
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, default_task_backend, task, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import DEFAULT_TASK_QUEUE_NAME, Task, TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "default_task_backend",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
