"""A ``django.tasks`` backend through the transactional outbox (``OutboxBackend``), and ``retry_safe``.

Importing this package imports neither Django models nor the task API (``retry_safe`` and the backend
are loaded on first use); ``DispatchAppConfig.ready`` hands ``tasks.queues.task_domains`` to the registry.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OutboxBackend", "retry_safe"]


def __getattr__(name: str) -> Any:
    if name == "OutboxBackend":
        from dispatch_app.tasks.backend import OutboxBackend

        return OutboxBackend
    if name == "retry_safe":
        from dispatch_app.tasks.declare import retry_safe

        return retry_safe
    raise AttributeError(f"module 'dispatch_app.tasks' has no attribute {name!r}")
