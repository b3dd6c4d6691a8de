"""Which domains the ``django.tasks`` queues are, and how a task says it is retry-safe.

Every queue an ``OutboxBackend`` serves (its ``QUEUES``, default ``["default"]``)
is a domain of the same name, with its own recovery policy from the backend's
``OPTIONS["QUEUES"][queue]``::

    TASKS = {"default": {
        "BACKEND": "dispatch_app.tasks.OutboxBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"QUEUES": {"emails": {"RETRY_SAFE": True, "MAX_ATTEMPTS": 5}}},
    }}

Retry safety is declared twice on purpose: the queue says what recovery does
with an interrupted run (``RETRY_SAFE``, default False: the job becomes
``outcome_unknown``), the task says it can bear a second run (``@retry_safe``
under ``@task``). The backend's ``validate_task`` (run when the task is defined
and when it is enqueued) refuses a task that never said so on a queue that
re-runs interrupted work; a retry-safe task on a queue that is not is simply
never re-run after an interruption (the safe side).

What the queues are as domains (``task_domains()``, which the registry reads) is in
``dispatch_app.tasks.queues``. Nothing here imports models, the worker or the backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from dispatch_app.config.settings import coerce_number
from dispatch_app.domains.base import Field, RecoveryPolicy

BACKEND_PATHS = ("dispatch_app.tasks.OutboxBackend", "dispatch_app.tasks.backend.OutboxBackend")
# What a task job's payload holds: the task's dotted path, its JSON arguments, the backend alias.
TASK_SCHEMA = {
    "task": Field(str, max_length=500),
    "args": Field(list, required=False),
    "kwargs": Field(dict, required=False),
    "backend": Field(str, required=False, max_length=200),
}
# RQ imports ``<ENTRY_PREFIX><domain key>`` (dispatch_app.tasks.run.entry): the worker's execute, then task_finished.
ENTRY_PREFIX = "dispatch_app.tasks.run.entry."
RETRY_SAFE_ATTR = "dispatch_retry_safe"


def _seconds(where: str, value: Any) -> float:
    return coerce_number(where, value, float, 0, 30 * 86_400)


# Per-queue OPTIONS key -> (RecoveryPolicy field, coercion). Every other policy knob is in DISPATCH['RECOVERY'].
QUEUE_KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "RETRY_SAFE": ("retry_safe", lambda where, v: _bool(where, v)),
    "MAX_ATTEMPTS": ("max_attempts", lambda where, v: _int(where, v)),
    "QUEUED_STALE_SECONDS": ("queued_stale_seconds", _seconds),
    "RUNNING_STALE_SECONDS": ("running_stale_seconds", _seconds),
}


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ImproperlyConfigured(f"{where} must be True or False, got {value!r}")
    return value


def _int(where: str, value: Any) -> int:
    return coerce_number(where, value, int, 1, 1000)


def retry_safe(func: Callable) -> Callable:
    """Declare a task function safe to run again after an interruption (put it under ``@task``).

    Only tasks that carry it may run on a queue with ``RETRY_SAFE: True``.
    """
    if not callable(func) or hasattr(func, "func"):
        raise TypeError("@retry_safe goes under @task(...), on the function itself")
    setattr(func, RETRY_SAFE_ATTR, True)
    return func


def declares_retry_safe(func: Callable) -> bool:
    return getattr(func, RETRY_SAFE_ATTR, False) is True


def queue_policies(alias: str, params: dict) -> dict[str, RecoveryPolicy]:
    """One backend's queues and their recovery policies; ImproperlyConfigured names what is wrong."""
    where = f"TASKS[{alias!r}]"
    queues = params.get("QUEUES", ["default"])
    if isinstance(queues, str) or not isinstance(queues, (list, tuple, set)) or not queues:
        raise ImproperlyConfigured(
            f"{where}['QUEUES'] must be a non-empty list of queue names (each is a domain), got {queues!r}"
        )
    options = params.get("OPTIONS", {}) or {}
    if not isinstance(options, dict) or set(options) - {"QUEUES"}:
        raise ImproperlyConfigured(f"{where}['OPTIONS'] accepts only 'QUEUES' (per-queue policy), got {options!r}")
    per_queue = options.get("QUEUES", {}) or {}
    if not isinstance(per_queue, dict):
        raise ImproperlyConfigured(f"{where}['OPTIONS']['QUEUES'] must be a dict of queue -> policy")
    stray = sorted(set(per_queue) - set(queues))
    if stray:
        raise ImproperlyConfigured(
            f"{where}['OPTIONS']['QUEUES'] names {', '.join(map(repr, stray))}, not in {where}['QUEUES'] {list(queues)}"
        )
    policies = {}
    for queue in queues:
        raw = per_queue.get(queue, {}) or {}
        here = f"{where}['OPTIONS']['QUEUES'][{queue!r}]"
        if not isinstance(raw, dict):
            raise ImproperlyConfigured(f"{here} must be a dict of setting -> value, got {raw!r}")
        unknown = sorted(set(raw) - set(QUEUE_KEYS))
        if unknown:
            raise ImproperlyConfigured(f"{here}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(QUEUE_KEYS)}")
        values = {QUEUE_KEYS[k][0]: QUEUE_KEYS[k][1](f"{here}[{k!r}]", v) for k, v in raw.items()}
        policies[queue] = RecoveryPolicy(**values)
    return policies
