"""The ``django.tasks`` queues as domains: ``task_domains()``, and the check of a task job's payload.

Every queue an ``OutboxBackend`` in ``settings.TASKS`` serves is a domain (``dispatch_app.tasks.declare``
says how its policy is declared). ``DispatchAppConfig.ready`` adds ``task_domains`` to the domain registry
(``registry.add_source``): this module imports the worker's entry (``tasks.run``), so the registry, lower in
the import layers, does not import it.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from dispatch_app.domains.base import Domain, PayloadError, RecoveryPolicy, shown
from dispatch_app.tasks.backend import OutboxBackend
from dispatch_app.tasks.declare import BACKEND_PATHS, ENTRY_PREFIX, TASK_SCHEMA, queue_policies
from dispatch_app.tasks.run import work


def is_outbox_backend(path: Any) -> bool:
    if path in BACKEND_PATHS:
        return True
    try:
        backend = import_string(path)
    except ImportError:
        return False  # django.tasks reports a backend it cannot import
    return isinstance(backend, type) and issubclass(backend, OutboxBackend)


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
        raise PayloadError(f"{where}: {shown(path)} does not import ({type(exc).__name__})") from None
    if not isinstance(task, Task):
        raise PayloadError(f"{where}: {shown(path)} is not a django.tasks Task (decorate it with @task)")
    # A Task is declared on one queue and may be sent to another with .using(queue_name=...): the queue must be
    # one its backend (an OutboxBackend) serves.
    alias = payload.get("backend") or task.backend
    params = (getattr(settings, "TASKS", None) or {}).get(alias)
    if not isinstance(params, dict) or not is_outbox_backend(params.get("BACKEND")):
        raise PayloadError(f"{where}: backend {shown(alias)} is not an OutboxBackend in TASKS")
    if domain.key not in params.get("QUEUES", ["default"]):
        raise PayloadError(
            f"{where}: {shown(path)} is for backend {shown(alias)}, which does not serve queue {domain.key!r}"
        )


def domain_for(queue: str, policy: RecoveryPolicy) -> Domain:
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
