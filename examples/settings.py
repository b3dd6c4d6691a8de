"""The example project's settings: ProductFlow's, plus what a project adds to run the shop app.

Run it: ``DJANGO_SETTINGS_MODULE=examples.settings python manage.py rundispatcher`` and, beside it,
``DJANGO_SETTINGS_MODULE=examples.settings python manage.py runworkers``.
"""

from dispatch_app.domains import DEFAULT_DOMAINS
from productflow.settings import *  # noqa: F403
from productflow.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "examples.shop"]

# Your own payload domains, beside (or instead of) the five shipped ones.
PRODUCTFLOW_DOMAINS = [*DEFAULT_DOMAINS, "examples.shop.domains"]

# django.tasks through the outbox: each queue is a domain with its own recovery policy.
TASKS = {
    "default": {
        "BACKEND": "dispatch_app.tasks.OutboxBackend",
        "QUEUES": ["default", "thumbnails"],
        "OPTIONS": {"QUEUES": {"thumbnails": {"RETRY_SAFE": True, "MAX_ATTEMPTS": 5, "RUNNING_STALE_SECONDS": 120}}},
    }
}
