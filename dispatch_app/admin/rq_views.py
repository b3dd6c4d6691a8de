"""django-rq's admin views are unmounted: they read RQ job hashes with pickle, so Redis could run code here.

django-rq registers its ``Dashboard`` with ``QueueAdmin``, whose URLs mount every django-rq view under
``/admin/django_rq/dashboard/``. Some of them read Redis with RQ's default serializer (pickle) whatever
``RQ_QUEUES`` says: "Empty failed registry" fetches the failed jobs without a serializer and unpickles their meta
and result, a worker's page unpickles the meta of the job its hash names. Anyone who can write to Redis would run
code in the web process. The project's own pages (the dashboard, the job list's RQ column, the timeline) show the
queues, lanes, workers and refused jobs, reading Redis raw. ``dispatch_app.rq.checks`` fails the system
checks when a URLconf mounts a django-rq view some other way (``include("django_rq.urls")``).
"""

from __future__ import annotations

from django.contrib import admin


def unmount_rq_admin() -> None:
    try:
        # Imported here first, so django-rq's own registration has already run and cannot come after the
        # unregister below, whatever the order of INSTALLED_APPS (autodiscover imports each admin module once).
        import django_rq.admin  # noqa: F401
        from django_rq.models import Dashboard
    except ImportError:  # django-rq not installed: nothing mounted
        return
    if admin.site.is_registered(Dashboard):
        admin.site.unregister(Dashboard)
