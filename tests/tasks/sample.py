"""Module-level tasks the task tests enqueue (workers import them by dotted path, as they would a project's)."""

from __future__ import annotations

from dispatch_app.tasks import retry_safe
from dispatch_app.tasks.compat import task


@task()
def add(a, b):
    return a + b


@task(takes_context=True)
def report_attempt(context, note=""):
    return {"attempt": context.attempt, "id": context.task_result.id, "note": note}


@task()
def explode(message):
    raise ValueError(message)


@task()
async def async_double(value):
    return value * 2


@task()
def returns_no_json():
    return object()


@task(takes_context=True)
@retry_safe
def safe_attempt(context):
    return context.attempt


@task(takes_context=True)
@retry_safe
def vendor_refuses_once(context):
    from dispatch_app.domains.providers import ProviderError

    if context.attempt == 1:
        raise ProviderError("vendor said no")
    return context.attempt


@task()
def echo(*args, **kwargs):
    """Returns what it was given (the property tests' task: any JSON arguments)."""
    return {"args": list(args), "kwargs": kwargs}
