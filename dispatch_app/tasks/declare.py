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

The domain registry (``dispatch_app.domains.registry``) calls ``task_domains()``.
Nothing here imports models or the worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from dispatch_app.domains.base import Domain, Field, PayloadError, RecoveryPolicy

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
    from dispatch_app.conf import coerce_number

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
    from dispatch_app.conf import coerce_number

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


def is_outbox_backend(path: Any) -> bool:
    if path in BACKEND_PATHS:
        return True
    try:
        from dispatch_app.tasks.backend import OutboxBackend

        backend = import_string(path)
    except ImportError:
        return False  # django.tasks reports a backend it cannot import
    return isinstance(backend, type) and issubclass(backend, OutboxBackend)


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


def check_task_payload(domain: Domain, payload: dict) -> None:
    """A task job's ``task`` imports to a django.tasks Task on this queue (submit, and the worker before it runs).

    Without it a task queue took any path ("os.system", "no.such.module") and failed only in the worker.
    """
    from dispatch_app.tasks.compat import Task

    path = payload["task"]
    where = f"{domain.key}.task"
    try:
        task = import_string(path)
    except Exception as exc:  # noqa: BLE001 - ImportError, or whatever the module raised while importing
        raise PayloadError(f"{where}: {path!r} does not import ({type(exc).__name__})") from None
    if not isinstance(task, Task):
        raise PayloadError(f"{where}: {path!r} is not a django.tasks Task (decorate it with @task)")
    # A Task is declared on one queue and may be sent to another with .using(queue_name=...): the queue must be
    # one its backend (an OutboxBackend) serves.
    alias = payload.get("backend") or task.backend
    params = (getattr(settings, "TASKS", None) or {}).get(alias)
    if not isinstance(params, dict) or not is_outbox_backend(params.get("BACKEND")):
        raise PayloadError(f"{where}: backend {str(alias)[:100]!r} is not an OutboxBackend in TASKS")
    if domain.key not in params.get("QUEUES", ["default"]):
        raise PayloadError(f"{where}: {path!r} is for backend {alias!r}, which does not serve queue {domain.key!r}")


def domain_for(queue: str, policy: RecoveryPolicy) -> Domain:
    from dispatch_app.tasks.run import work

    return Domain(
        key=queue,
        queue=queue,
        schema=TASK_SCHEMA,
        work=work,
        task_path=ENTRY_PREFIX + queue,
        recovery=policy,
        description=f"django.tasks queue {queue!r}",
        payload_check=check_task_payload,
    )


def task_domains() -> list[Domain]:
    """The domains of every queue an OutboxBackend in ``settings.TASKS`` serves (the registry calls this)."""
    domains: dict[str, Domain] = {}
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        if not isinstance(params, dict) or not is_outbox_backend(params.get("BACKEND")):
            continue
        for queue, policy in queue_policies(alias, params).items():
            domain = domain_for(queue, policy)
            if domains.setdefault(queue, domain) != domain:
                raise ImproperlyConfigured(
                    f"TASKS: queue {queue!r} is served by two OutboxBackends with different OPTIONS; "
                    "one queue is one domain with one policy"
                )
    return list(domains.values())
