"""Tasks run by ``manage.py runworkers`` after ``manage.py rundispatcher`` has sent them.

A task's queue is a domain: ``default`` (not retry-safe: a run cut off by a dead worker becomes
``outcome_unknown`` and is never repeated on a guess) and ``thumbnails`` (``RETRY_SAFE`` in settings, so
its tasks must say ``@retry_safe``: an interrupted run simply runs again, as attempt 2).
"""

from __future__ import annotations

from dispatch_app.tasks import retry_safe
from dispatch_app.tasks.compat import task  # or: from django.tasks import task (Django 6)


@task()
def send_receipt(order_id: str, email: str) -> dict:
    # Sending an e-mail twice is a visible mistake: this task stays on a queue that is not retry-safe.
    return {"order_id": order_id, "sent_to": email}


@task(queue_name="thumbnails", takes_context=True)
@retry_safe
def make_thumbnail(context, image: str, width: int = 128) -> dict:
    # Rendering the same thumbnail again overwrites the same file: safe to repeat.
    return {"thumbnail": f"{image}@{width}w", "attempt": context.attempt}
